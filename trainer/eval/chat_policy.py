"""Episodes driven at the message level, for policies that have no token ids: the scripted
reference policy (``env.unwrapped.reference_action()``) and OpenAI-compatible chat APIs.

The token-level engines go through the rollout collector; these two cannot (a chat API applies its
own template and returns no ids; the reference policy writes text, not tokens), so this loop plays
the same role: fresh env per episode, reset seed ``seed + task_index``, one action per turn until the
env terminates or truncates, a crash or timeout failing only its own episode. The result is a
:class:`~chatgym.trainer.types.Trajectory` without token ids; ``info["generated_tokens"]`` holds the
API's reported completion tokens (absent for the reference policy).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from chatgym.envs.messages import Message

from ..engines.base import SamplingParams
from ..env_runner import EnvRunner, make_env
from ..types import Trajectory

# act(env, history, tools, turn) -> (assistant action, completion tokens or None)
Act = Callable[[Any, list[Message], list[dict[str, Any]] | None, int], Awaitable[tuple[Any, int | None]]]


class NoReferencePolicy(Exception):
    """The env's ``reference_action`` raised NotImplementedError."""


class _PolicyError(Exception):
    """The policy (API call) failed: the episode fails as ``engine_error``."""


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
    t0 = time.perf_counter()
    runner: EnvRunner | None = None

    async def episode() -> None:
        nonlocal runner
        loop = asyncio.get_running_loop()
        env = await loop.run_in_executor(pool, make_env, env_id, env_kwargs)
        runner = EnvRunner(env, pool)
        reset_seed = None if seed is None else seed + task_index
        obs, info = await runner.reset(reset_seed, {"task_index": task_index})
        traj.task_id = info.get("task_id", task_index)
        tools = info.get("tools") or getattr(env.unwrapped, "tools", None) or None
        history: list[Message] = list(obs)
        traj.messages = history
        tokens: list[int] = []
        tool_errors = tool_results = 0
        while True:
            try:
                action, n_tokens = await act(env, history, tools, len(traj.rewards))
            except (NoReferencePolicy, asyncio.CancelledError):
                raise
            except Exception as exc:
                raise _PolicyError(f"{type(exc).__name__}: {exc}") from exc
            if n_tokens is not None:
                tokens.append(n_tokens)
                traj.info["generated_tokens"] = sum(tokens)
            history.append(action if isinstance(action, dict) else {"role": "assistant", "content": action})
            obs, reward, terminated, truncated, step_info = await runner.step(action)
            traj.rewards.append(float(reward))
            traj.finish_reasons.append("stop")
            # A chat API names no token: the stop reason is the env stop string the reply ends with.
            content = history[-1].get("content") or ""
            stops = getattr(env.unwrapped, "stop_strings", None) or ()
            traj.stop_reasons.append(next((s for s in stops if content.endswith(s)), None))
            step_info = step_info or {}
            tool_errors += int(step_info.get("tool_errors", 0) or 0)
            traj.info.update(step_info)
            tool_results += sum(m.get("role") == "tool" for m in obs)
            traj.info["tool_errors_total"] = tool_errors
            traj.info["tool_results_total"] = tool_results
            history.extend(obs)
            if terminated or truncated:
                traj.terminated, traj.truncated = bool(terminated), bool(truncated)
                break

    try:
        if timeout_s is None:
            await episode()
        else:
            await asyncio.wait_for(episode(), timeout_s)
    except NoReferencePolicy:
        raise
    except _PolicyError as exc:
        traj.error, traj.info["error_kind"] = f"engine_error: {exc}", "engine_error"
    except asyncio.TimeoutError:
        traj.error, traj.info["error_kind"] = f"timeout: episode exceeded {timeout_s} s", "timeout"
    except Exception as exc:  # one episode's failure is recorded, never raised into the batch
        traj.error, traj.info["error_kind"] = f"env_error: {type(exc).__name__}: {exc}", "env_error"
    finally:
        if runner is not None:
            try:
                await asyncio.wait_for(runner.close(), 5.0)
            except Exception as exc:
                traj.info["close_error"] = f"{type(exc).__name__}: {exc}"
    traj.reward = float(sum(traj.rewards))
    traj.timing["total_s"] = time.perf_counter() - t0
    return traj
