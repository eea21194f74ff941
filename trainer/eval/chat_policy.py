"""Episodes driven at the message level, for policies that have no token ids: the scripted
reference policy (``env.unwrapped.reference_action()``) and OpenAI-compatible chat APIs.

The token-level engines go through the rollout collector; these two cannot (a chat API applies its
own template and returns no ids; the reference policy writes text, not tokens), so this loop plays
the same role: fresh env per episode, reset seed ``seed + task_index``, one action per turn until the
env terminates or truncates, a crash or timeout failing only its own episode (the same guarded runner
and step bookkeeping as the collector: :mod:`chatgym.trainer.rollout.episode`). The result is a
:class:`~chatgym.trainer.rollout.types.Trajectory` without token ids; ``info["generated_tokens"]`` holds the
API's reported completion tokens (absent for the reference policy).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from chatgym.envs.messages import Message
from chatgym.trainer.engines.base import SamplingParams
from chatgym.trainer.rollout.env_runner import EnvRunner, make_env
from chatgym.trainer.rollout.episode import EpisodeFailure, ended, env_call, record_step, run_guarded
from chatgym.trainer.rollout.types import Trajectory

# act(env, history, tools, turn) -> (assistant action, completion tokens or None)
Act = Callable[[Any, list[Message], list[dict[str, Any]] | None, int], Awaitable[tuple[Any, int | None]]]


class NoReferencePolicy(Exception):
    """The env's ``reference_action`` raised NotImplementedError."""


async def reference_act(env: Any, history: list[Message], tools: Any, turn: int) -> tuple[Any, None]:
    """The scripted reference policy: ``env.unwrapped.reference_action()``.

    Raises:
        NoReferencePolicy: the env has none.
    """
    try:
        return env.unwrapped.reference_action(), None
    except NotImplementedError as exc:
        raise NoReferencePolicy(str(exc)) from exc


def api_act(engine: Any, params: SamplingParams) -> Act:
    """A policy that asks an :class:`~chatgym.trainer.engines.openai_chat.OpenAIChatEngine` for each turn;
    the completion tokens come from the API's ``usage``."""

    async def act(env: Any, history: list[Message], tools: Any, turn: int) -> tuple[Any, int | None]:
        # The env's stop strings end the reply after its first action (Search-v0 tags mode).
        stop = tuple(getattr(env.unwrapped, "stop_strings", None) or ())
        turn_params = dataclasses.replace(params, stop=stop) if stop else params
        body = engine.request_body(history, tools, turn_params)
        response = await engine.client.post("/chat/completions", body)
        message = engine.parse_response(response, turn_params.stop)
        usage = (response or {}).get("usage") or {}
        tokens = usage.get("completion_tokens")
        return message, int(tokens) if tokens is not None else None

    return act


async def run_chat_episode(
    act: Act,
    env_id: str,
    env_kwargs: dict[str, Any],
    task_index: int,
    sample_index: int,
    seed: int | None,
    pool: Executor,
    timeout_s: float | None = 600.0,
) -> Trajectory:
    """One episode of ``env_id`` task ``task_index`` with policy ``act``.

    Returns:
        A Trajectory (``group_id = task_index``) with ``messages``, per-turn ``rewards``,
        ``terminated``/``truncated``, ``error`` when the env or policy failed (``info["error_kind"]``),
        ``timing["total_s"]`` in seconds, and ``info["generated_tokens"]`` when the policy reports it.

    Raises:
        NoReferencePolicy: the reference policy is not implemented for this env (not an episode failure:
            the caller skips the env).
    """
    traj = Trajectory(env_id=env_id, task_id=task_index, group_id=task_index, sample_index=sample_index)

    async def episode(state: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        env = await env_call(loop.run_in_executor(pool, make_env, env_id, env_kwargs))
        runner = state["runner"] = EnvRunner(env, pool)
        reset_seed = None if seed is None else seed + task_index
        obs, info = await env_call(runner.reset(reset_seed, {"task_index": task_index}))
        traj.task_id = info.get("task_id", task_index)
        tools = info.get("tools") or getattr(env.unwrapped, "tools", None) or None
        history: list[Message] = list(obs)
        traj.messages = history
        tokens: list[int] = []
        while True:
            try:
                action, n_tokens = await act(env, history, tools, len(traj.rewards))
            except (NoReferencePolicy, asyncio.CancelledError):
                raise
            except Exception as exc:
                raise EpisodeFailure("engine_error", f"{type(exc).__name__}: {exc}") from exc
            if n_tokens is not None:
                tokens.append(n_tokens)
                traj.info["generated_tokens"] = sum(tokens)
            history.append(action if isinstance(action, dict) else {"role": "assistant", "content": action})
            obs, reward, terminated, truncated, step_info = await env_call(runner.step(action))
            traj.finish_reasons.append("stop")
            # A chat API names no token: the stop reason is the env stop string the reply ends with.
            content = history[-1].get("content") or ""
            stops = getattr(env.unwrapped, "stop_strings", None) or ()
            traj.stop_reasons.append(next((s for s in stops if content.endswith(s)), None))
            record_step(traj, obs, reward, step_info)
            history.extend(obs)
            if ended(traj, terminated, truncated):
                break

    return await run_guarded(traj, episode, timeout_s, passthrough=(NoReferencePolicy,))
