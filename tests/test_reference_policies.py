"""Scripted reference policies (``ChatEnv.reference_action``) reach each env's maximum reward (1.0)
on real tasks: the gold answer / canonical solution, graded by the env's own scorer."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import pytest

import chatgym  # noqa: F401
from chatgym.envs.core import ChatEnv


async def _reference_episode(env: ChatEnv, index: int) -> tuple[float, bool, int]:
    await env.areset(seed=0, options={"task_index": index})
    total, turns = 0.0, 0
    while True:
        _, reward, terminated, truncated, _ = await env.astep(env.reference_action())
        total += reward
        turns += 1
        if terminated or truncated:
            return total, terminated, turns


def _rewards(env_id: str, indices, **kwargs) -> list[tuple[float, bool, int]]:
    async def run_all():
        envs = [gym.make(env_id, **kwargs).unwrapped for _ in indices]
        try:
            return await asyncio.gather(
                *(_reference_episode(e, i) for e, i in zip(envs, indices, strict=True))
            )
        finally:
            for e in envs:
                await e.aclose()

    return asyncio.run(run_all())


@pytest.mark.parametrize("env_id", ["Math-v0", "MathCalculator-v0"])
def test_math_reference_answers_every_test_task(env_id):
    n = len(gym.make(env_id, split="test").unwrapped.tasks)
    assert n == 200
    results = _rewards(env_id, range(n), split="test")
    assert results == [(1.0, True, 1)] * n


def test_code_sandbox_reference_passes_the_test_split():
    # The 24 held-out HumanEval problems, each graded by its hidden tests in the sandbox.
    results = _rewards("CodeSandbox-v0", range(24), split="test")
    assert results == [(1.0, True, 1)] * 24


@pytest.mark.slow
def test_code_sandbox_reference_passes_all_164():
    results = _rewards("CodeSandbox-v0", range(164), split="all")
    assert [i for i, r in enumerate(results) if r != (1.0, True, 1)] == []


@pytest.mark.parametrize(
    "kwargs", [{"mode": "tool"}, {"mode": "tags"}, {"dataset": "freshqa", "split": "test"}]
)
def test_search_reference_answers_exactly(kwargs):
    env = gym.make("Search-v0", **kwargs).unwrapped
    n = min(len(env.tasks), 100)
    results = _rewards("Search-v0", range(n), **kwargs)
    assert results == [(1.0, True, 1)] * n


def test_reference_before_reset_is_a_clear_error():
    for env_id in ("Math-v0", "CodeSandbox-v0", "Search-v0"):
        with pytest.raises(RuntimeError, match="reset"):
            gym.make(env_id).unwrapped.reference_action()
