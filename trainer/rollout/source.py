"""Where a training step's trajectories come from: a request in, trajectories out.

    request = RolloutRequest("Math-v0", tasks=(3, 17), group_size=8, env_kwargs={"split": "train"},
                             reset_seed=11, sampling_seed=12)
    trajs = await source.collect(request)                   # 16 trajectories, (group, sample) order
    source.set_weights(learner.export_weights(torch.bfloat16), version=1)

:class:`LocalRollout` runs the episodes in this process (one engine, one collector);
``chatgym.trainer.distributed.RayRollout`` spreads them over rollout workers. Both answer the same
request with the same trajectories: seeds depend only on an episode's place in the request's
(group, sample) grid, never on which worker or which subset ran it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from chatgym.trainer.rollout.collector import Collector
from chatgym.trainer.rollout.env_runner import EnvSource
from chatgym.trainer.rollout.types import Trajectory

# What turns a request's env id and kwargs into the collector's env source (see LocalRollout).
EnvSourceHook = Callable[[str, Mapping[str, Any]], tuple[EnvSource, "dict[str, Any] | None"]]


@dataclass(frozen=True)
class RolloutRequest:
    """The episodes of one training step (or of some of its groups).

    Attributes:
        env_id: the Gymnasium env id every episode runs.
        tasks: the step's tasks: indices into the env's split (``int``) or task rows (``dict``);
            group ``g`` is ``tasks[g]``.
        group_size: G, episodes per task (GRPO group).
        env_kwargs: ``gym.make`` keyword arguments (the split among them).
        reset_seed: group ``g`` resets with ``reset_seed + g`` (all its samples alike); None: unseeded.
        sampling_seed: base of the per-request sampling seeds, derived from (sampling_seed, g, s, turn);
            None: the collector's configured seed.
        groups: run only these group ids of the grid (None: all). A subset samples exactly as it would
            inside the full request.
        eval: run with the evaluation settings (eval temperature, eval traces).
        step: the training step the request belongs to (logs, buffers).
        only: run only these ``(group_id, sample_index)`` pairs of the grid (None: every sample of
            ``groups``); a rollout worker gets one episode of a step this way. Seeds as for ``groups``.
    """

    env_id: str
    tasks: tuple[Any, ...]
    group_size: int = 1
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    reset_seed: int | None = None
    sampling_seed: int | None = None
    groups: tuple[int, ...] | None = None
    eval: bool = False
    step: int = 0
    only: tuple[tuple[int, int], ...] | None = None

    def episodes(self) -> list[tuple[int, int]]:
        """The ``(group_id, sample_index)`` pairs this request runs, in order."""
        groups = range(len(self.tasks)) if self.groups is None else self.groups
        pairs = [(g, s) for g in groups for s in range(self.group_size)]
        if self.only is None:
            return pairs
        keep = {(int(g), int(s)) for g, s in self.only}
        return [p for p in pairs if p in keep]


class RolloutSource(Protocol):
    """What the training loop needs from the rollout side (local or distributed)."""

    weight_version: int

    async def collect(self, request: RolloutRequest) -> list[Trajectory]:
        """The request's trajectories ordered by (group_id, sample_index); failed ones included."""
        ...

    def set_weights(self, weights: Iterable[tuple[str, Any]], version: int) -> float:
        """Load the policy's weights (name, tensor) into every engine; returns the seconds it took."""
        ...

    def close(self) -> None: ...

    async def aclose(self) -> None:
        """:meth:`close` and what closing needs the event loop for (engines the source built)."""
        ...


class LocalRollout:
    """The engine and its collectors in this process.

    Args:
        engine: the engine (its weights are replaced by :meth:`set_weights`).
        collector: the training collector (trace of a sample of rollouts).
        eval_collector: the evaluation collector (eval temperature, every trace kept); None: use
            ``collector``.
        env_source: ``(env_id, env_kwargs) -> (env id or factory, env_kwargs)``: what the collector
            is given for a request's env (GenRM wraps each env: :func:`chatgym.trainer.rewards.genrm.env_source`);
            None: the id and kwargs as they are.

    An engine with a sleep level (``engine.sleep_state``: the in-process vLLM engine's
    ``sleep_level``) sleeps through the learner's update of a ``sync`` step (:meth:`sleep`,
    :meth:`set_weights`, :meth:`wake_up`; :mod:`chatgym.trainer.engines.vllm_sleep`).
    """

    def __init__(
        self,
        engine: Any,
        collector: Collector,
        eval_collector: Collector | None = None,
        env_source: EnvSourceHook | None = None,
    ):
        self.engine = engine
        self.collector = collector
        self.eval_collector = eval_collector or collector
        self.env_source = env_source
        self.weight_version = int(getattr(engine, "weight_version", 0))
        engine.weight_version = self.weight_version
        self._wake_s = 0.0  # seconds spent waking the engine since it last slept

    async def collect(self, request: RolloutRequest) -> list[Trajectory]:
        collector = self.eval_collector if request.eval else self.collector
        only = None if request.groups is None and request.only is None else set(request.episodes())
        env, env_kwargs = (
            (request.env_id, dict(request.env_kwargs))
            if self.env_source is None
            else self.env_source(request.env_id, request.env_kwargs)
        )
        return await collector.collect(
            env,
            list(request.tasks),
            request.group_size,
            env_kwargs=env_kwargs,
            seed=request.reset_seed,
            sampling_seed=request.sampling_seed,
            only=only,
        )

    def set_weights(self, weights: Iterable[tuple[str, Any]], version: int) -> float:
        """Load the weights into the engine; returns the seconds it took. An engine asleep wakes around
        the load in verl's and TRL's order: its weights, the load, then its KV cache (mapped only once
        the learner's exported weights are loaded, so the two never take memory together)."""
        t0 = time.perf_counter()
        state = self._sleep_state()
        asleep = state.asleep if state is not None else frozenset()
        if "weights" in asleep:
            self._wake(["weights"])
        self.engine.update_weights(weights)
        if "kv_cache" in asleep:
            self._wake(["kv_cache"])
        self.weight_version = self.engine.weight_version = int(version)
        return time.perf_counter() - t0

    def _sleep_state(self) -> Any:
        """The engine's :class:`~chatgym.trainer.engines.vllm_sleep.SleepState` when it has a sleep
        level, else None."""
        state = getattr(self.engine, "sleep_state", None)
        return state if state is not None and state.level else None

    def sleep(self) -> dict[str, float]:
        """Put an engine with a sleep level to sleep for the learner's update (the ``sync`` pipeline
        calls it after the step's rollout): ``{"timing/engine_sleep_s": seconds}``, or ``{}`` for an
        engine that does not sleep.

        Raises:
            RuntimeError: the engine refused (already asleep, requests in flight).
        """
        if self._sleep_state() is None:
            return {}
        t0 = time.perf_counter()
        self.engine.sleep()
        self._wake_s = 0.0
        return {"timing/engine_sleep_s": time.perf_counter() - t0}

    @property
    def needs_weights(self) -> bool:
        """Whether the engine discarded its weights (sleep level 2): the next weight sync sends them
        even when the learner's version did not change (:class:`~chatgym.trainer.pipeline.WeightSync`)."""
        state = self._sleep_state()
        return state is not None and state.discarded

    def wake_up(self) -> dict[str, float]:
        """Wake whatever the weight sync left asleep (all of a level-1 engine when no weights were due);
        ``{"timing/engine_wake_s": seconds}`` spent waking since :meth:`sleep` (the weights' wake inside
        :meth:`set_weights` included), or ``{}`` for an engine that does not sleep."""
        state = self._sleep_state()
        if state is None:
            return {}
        if state.asleep:
            self._wake(None)
        wake_s, self._wake_s = self._wake_s, 0.0
        return {"timing/engine_wake_s": wake_s}

    def _wake(self, tags: list[str] | None) -> None:
        t0 = time.perf_counter()
        self.engine.wake_up(tags)
        self._wake_s += time.perf_counter() - t0

    def close(self) -> None:
        self.collector.close()
        if self.eval_collector is not self.collector:
            self.eval_collector.close()

    async def aclose(self) -> None:
        """:meth:`close`, then what the env hook built for itself (a GenRM judge's own engine, via the
        hook's ``aclose``). The policy's engine is left to its owner."""
        self.close()
        closer = getattr(self.env_source, "aclose", None)
        if closer is not None:
            await closer()
