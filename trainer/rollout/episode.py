"""The guarded episode: what every episode runner shares, token-level (the collector) or message-level
(evaluation of chat APIs and of the scripted reference policy, :mod:`chatgym.trainer.eval.chat_policy`).

- :func:`run_guarded` runs an episode body under the episode timeout and turns any failure into the
  trajectory's ``error`` / ``info["error_kind"]`` (``timeout``, an :class:`EpisodeFailure`'s kind, or
  ``internal_error`` for a bug), closes the env on the loop that opened it, and totals the reward and
  the time — one slow or crashing episode never takes the batch down;
- :func:`record_step` books one ``env.step`` result into the trajectory: the turn's reward, the env's
  info (``success`` into ``Trajectory.success``), the tool counters ``info["tool_results_total"]``
  (``tool`` messages returned: one per call, malformed ones included), ``info["tool_errors_total"]``
  (sum of the env's ``tool_errors``) and ``info["tool_errors_by_kind"]`` (its ``tool_error_kinds``
  summed: ``parse_error``, ``unknown_tool``, ``bad_arguments``, ``raised``, ``timeout``,
  ``tool_error``; errors the env did not classify are ``unspecified``) and ``info["state_keys"]``
  (step k's ``info["state_key"]`` at index k — a string naming the state the env is now in — None
  for a step that named none; absent when no step did: GiGPO's anchor states, :mod:`chatgym.trainer.learner.turns`);
- :func:`check_observation` and :func:`env_stop_strings` check what an env hands the runner (its
  messages, its stop strings): a malformed one is an ``env_error`` of that episode;
- :func:`cut_observation` cuts each observation message to ``max_observation_tokens`` (the
  collector's env observations, the tool results an agent sends the gateway).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from chatgym.envs.messages import Message, message_errors
from chatgym.trainer.chat.delta import truncate_text_tokens
from chatgym.trainer.chat.images import truncate_content
from chatgym.trainer.rollout.types import Trajectory

# Keys the runner owns in ``Trajectory.info``: an env's info must not overwrite them.
_RUNNER_KEYS = ("turns", "truncated_by", "state_key", "state_keys")


class EpisodeFailure(Exception):
    """Ends one episode; ``kind`` is stored in ``info["error_kind"]`` (``env_error``, ``engine_error``,
    ``engine_abort``, ``template_error``, ``prompt_too_long``, ...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


async def env_call(coro: Awaitable[Any]) -> Any:
    """Await an env call (make, reset, step); any exception from the env becomes an ``env_error``
    :class:`EpisodeFailure` naming the exception."""
    try:
        return await coro
    except (asyncio.CancelledError, EpisodeFailure):
        raise
    except Exception as exc:
        raise EpisodeFailure("env_error", f"{type(exc).__name__}: {exc}") from exc


def fail(traj: Trajectory, kind: str, message: str) -> None:
    """Mark ``traj`` failed: ``error = "<kind>: <message>"``, ``info["error_kind"] = kind``."""
    traj.error = f"{kind}: {message}"
    traj.info["error_kind"] = kind


async def run_guarded(
    traj: Trajectory,
    body: Callable[[dict[str, Any]], Awaitable[None]],
    timeout_s: float | None,
    *,
    passthrough: tuple[type[BaseException], ...] = (),
) -> Trajectory:
    """Run ``body(state)`` (which fills ``traj``) as one guarded episode; returns ``traj``.

    Args:
        traj: the trajectory the body fills.
        body: the episode; it puts its :class:`~chatgym.trainer.rollout.env_runner.EnvRunner` in
            ``state["runner"]`` as soon as the env exists, so that it is closed whatever happens.
        timeout_s: wall-clock seconds before the episode is cancelled (None: no limit).
        passthrough: exception types re-raised to the caller instead of failing the episode.

    After it: ``traj.reward`` is the sum of ``traj.rewards``; ``timing["total_s"]`` the episode's
    seconds; a close failure is in ``info["close_error"]``.
    """
    t0 = time.perf_counter()
    state: dict[str, Any] = {}
    try:
        if timeout_s is None:
            await body(state)
        else:
            await asyncio.wait_for(body(state), timeout_s)
    except passthrough:
        raise
    except asyncio.TimeoutError:
        fail(traj, "timeout", f"episode exceeded episode_timeout_s={timeout_s}")
    except EpisodeFailure as exc:
        fail(traj, exc.kind, str(exc))
    except Exception as exc:  # a bug here must not take the batch down; it is reported per episode
        fail(traj, "internal_error", f"{type(exc).__name__}: {exc}")
    finally:
        runner = state.get("runner")
        if runner is not None:
            try:
                await asyncio.wait_for(runner.close(), 5.0)
            except Exception as exc:
                traj.info["close_error"] = f"{type(exc).__name__}: {exc}"
    traj.reward = float(sum(traj.rewards))
    traj.timing["total_s"] = time.perf_counter() - t0
    return traj


def record_step(traj: Trajectory, obs: list[Message], reward: float, info: Any) -> None:
    """Book one ``env.step`` result into ``traj`` (see the module docstring)."""
    info = info if isinstance(info, dict) else {}
    key = info.get("state_key")
    if key is not None and not isinstance(key, str):
        raise EpisodeFailure("env_error", f"info['state_key'] must be a string, got {type(key).__name__}")
    traj.rewards.append(float(reward))
    if key is not None:  # kept only for envs that name their states: step k's key at index k
        keys = traj.info.setdefault("state_keys", [])
        keys.extend([None] * (len(traj.rewards) - 1 - len(keys)))
        keys.append(key)
    totals = traj.info
    tool_results = int(totals.get("tool_results_total", 0)) + sum(m.get("role") == "tool" for m in obs)
    step_errors = int(info.get("tool_errors", 0) or 0)
    tool_errors = int(totals.get("tool_errors_total", 0)) + step_errors
    by_kind = dict(totals.get("tool_errors_by_kind") or {})
    kinds = info.get("tool_error_kinds") if isinstance(info.get("tool_error_kinds"), dict) else {}
    for kind, n in kinds.items():
        by_kind[str(kind)] = by_kind.get(str(kind), 0) + int(n)
    # An env that counts errors without saying their kind: the rest is ``unspecified``.
    rest = step_errors - sum(int(n) for n in kinds.values())
    if rest > 0:
        by_kind["unspecified"] = by_kind.get("unspecified", 0) + rest
    totals.update({k: v for k, v in info.items() if k not in _RUNNER_KEYS})
    totals["tool_results_total"] = tool_results
    totals["tool_errors_total"] = tool_errors
    totals["tool_errors_by_kind"] = by_kind
    if "success" in info:
        traj.success = info["success"] if isinstance(info["success"], bool) else None


def ended(traj: Trajectory, terminated: Any, truncated: Any) -> bool:
    """Record the episode's end flags when it ended; True when it did. An env's own truncation
    (``max_turns``) is reported as ``info["truncated_by"] = "env"``."""
    if not (terminated or truncated):
        return False
    traj.terminated, traj.truncated = bool(terminated), bool(truncated)
    if truncated:
        traj.info["truncated_by"] = "env"
    return True


def env_stop_strings(env: Any) -> tuple[str, ...]:
    """The env's ``stop_strings`` (on the env or under its Gymnasium wrappers), as a tuple.

    Raises:
        EpisodeFailure: ``env_error`` when they are not a list of non-empty strings.
    """
    raw = getattr(env, "stop_strings", None)
    if raw is None:
        raw = getattr(getattr(env, "unwrapped", None), "stop_strings", None)
    if raw is None:
        return ()
    stops = (raw,) if isinstance(raw, str) else tuple(raw)
    if not all(isinstance(s, str) and s for s in stops):
        raise EpisodeFailure("env_error", f"env.stop_strings must be non-empty strings, got {raw!r:.200}")
    return stops


def check_observation(obs: Any, where: str) -> list[Message]:
    """``obs`` (what ``reset`` / ``step``, named by ``where``, returned) as a list of message dicts.

    Raises:
        EpisodeFailure: ``env_error`` when it is not a list of valid messages.
    """
    if not isinstance(obs, list):
        raise EpisodeFailure(
            "env_error",
            f"{where} returned an observation of type {type(obs).__name__}, not a list of messages",
        )
    for i, m in enumerate(obs):
        errors = message_errors(m)
        if errors:
            raise EpisodeFailure(
                "env_error", f"{where} returned an invalid message at index {i}: {'; '.join(errors)}"
            )
    return [dict(m) for m in obs]  # type: ignore[misc]


def cut_observation(
    tokenizer: Any,
    messages: list[Message],
    max_tokens: int,
    info: dict[str, Any],
    image_len: Callable[[str], int] | None = None,
    roles: Collection[str] | None = None,
) -> list[Message]:
    """``messages`` with each content cut to ``max_tokens`` tokens (``RolloutConfig.max_observation_tokens``).

    A text content keeps its first ``max_tokens`` tokens, counted as the model reads message text,
    then ``"\\n[... N more tokens truncated]"`` (:func:`~chatgym.trainer.chat.delta.truncate_text_tokens`);
    a list of content parts keeps its parts while they fit, an image whole or not at all
    (:func:`~chatgym.trainer.chat.images.truncate_content`). A message that fits is returned as is;
    a cut one is a copy (``messages`` is not changed).

    Args:
        tokenizer: the model's tokenizer.
        messages: the observation (interned image parts: ``{"type": "image", "ref"}``).
        max_tokens: tokens each message's content may keep (>= 1).
        info: the trajectory's info: ``observation_tokens_cut`` (tokens left out) and
            ``observation_images_dropped`` (images left out) are added to, set once non-zero.
        image_len: tokens an image takes, by ref; needed only where a content is a list of parts.
        roles: cut only messages of these roles (None: every message).

    Returns:
        The messages, in order, cut.
    """
    out = []
    for m in messages:
        if roles is not None and m.get("role") not in roles:
            out.append(m)
            continue
        dropped = 0
        if isinstance(m["content"], list):
            content, cut, dropped = truncate_content(tokenizer, m["content"], max_tokens, image_len)  # type: ignore[arg-type]
        else:
            content, cut = truncate_text_tokens(tokenizer, m["content"], max_tokens)
        if cut:
            m = {**m, "content": content}  # type: ignore[assignment]
            info["observation_tokens_cut"] = info.get("observation_tokens_cut", 0) + cut
        if dropped:
            info["observation_images_dropped"] = info.get("observation_images_dropped", 0) + dropped
        out.append(m)
    return out
