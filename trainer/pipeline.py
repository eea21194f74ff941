"""How rollout overlaps training: the ``sync``, ``one_step_off`` and ``async`` drivers.

    pipeline = Pipeline(source, learner, request_for, PipelineOptions(mode="async", max_staleness=1))
    async for result in pipeline.run(start_step, max_steps):   # one StepResult per learner update
        log(result.step, result.metrics)

The drivers only use the :class:`~chatgym.trainer.rollout.source.RolloutSource` protocol (``collect``,
``set_weights``, ``weight_version``) and a learner (``train_on``, ``export_weights``, ``version``), so
the same code runs over :class:`~chatgym.trainer.rollout.source.LocalRollout` and the Ray rollout.

- ``sync``: collect step k, train on it, send the weights, repeat (the engine idles during the update,
  the learner during the rollout).
- ``one_step_off`` (verl's one-step-off recipe): the rollout of step k+1 runs while the learner trains
  on step k's batch; weights are sent between steps, so every batch is exactly one version stale.
- ``async`` (AReaL / PipelineRL / SkyRL's fully async trainer): each group of each step is its own
  request; finished groups stream into a :class:`~chatgym.trainer.replay_buffer.ReplayBuffer`, and
  the learner takes ``P`` groups (``P`` = the step's tasks) as soon as that many are ready — a long
  episode never holds the step, its group simply lands in a later batch. Admission control keeps at
  most ``(max_staleness + 1) * P`` groups started and not yet trained on; at take time a group whose
  oldest token is more than ``max_staleness`` versions behind the learner is dropped
  (``stale: drop``) or trained on with the truncated importance-sampling correction
  (``stale: importance_sampling``; needs ``algo.tis_cap``), so the bound holds whatever the speeds.
  With ``max_staleness: 0`` the learner gets exactly the ``sync`` batches.

Partial rollout (``async``): when new weights arrive, in-flight episodes either ``continue`` (each token
keeps the version that sampled it, ``Trajectory.weight_versions``, and its engine logprob; the loss's
truncated IS weight ``min(exp(old - engine), C)`` corrects per token) or are aborted and re-queued
(``abort``: the group restarts with the new weights, at the front of the queue; its first run is
discarded, so it is neither lost nor counted twice; a restarted group is not aborted again, so an
episode longer than one update still finishes).

Every step logs the staleness distribution of what it trained on (``staleness/mean``, ``/max``,
``/groups_<k>``: groups k versions old, ``/offpolicy_token_frac``) and the pipeline's counters.

Weights reach the rollout side by one rule (:class:`WeightSync`): they are sent when the version the
rollout side holds differs from the learner's, on the first sync whatever the versions say (an
engine starts on the weights it loaded from disk, which are not the learner's cast to its dtype), and
when the rollout side discarded them (``needs_weights``: vLLM's sleep level 2).

Sleep mode (``sync`` only): a rollout side with ``sleep()`` / ``wake_up()`` (a local vLLM engine with
``engine.options.sleep_level``) sleeps after the rollout, through the update, and wakes at the weight
sync (:mod:`chatgym.trainer.engines.vllm_sleep`); ``timing/engine_sleep_s`` / ``engine_wake_s``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from chatgym.trainer.replay_buffer import ReplayBuffer, entries_from_trajectories, staleness_metrics
from chatgym.trainer.rollout.source import RolloutRequest, RolloutSource
from chatgym.trainer.rollout.types import Trajectory

PIPELINES = ("sync", "one_step_off", "async")
STALE_POLICIES = ("drop", "importance_sampling")
PARTIAL_POLICIES = ("continue", "abort")


class LearnerLike(Protocol):
    version: int

    def train_on(self, trajs: Sequence[Trajectory]) -> dict[str, float]: ...

    def export_weights(self, dtype: Any = None) -> Any: ...


@dataclass(frozen=True)
class PipelineOptions:
    """The driver and its knobs (``trainer.*`` of the run config).

    Attributes:
        mode: ``sync`` | ``one_step_off`` | ``async``.
        max_staleness: ``async``: most weight versions a trained-on group's oldest token may lag the
            learner (>= 0).
        stale: ``async``, a group past the bound: ``drop`` it, or keep it (``importance_sampling``).
        partial: ``async``, in-flight episodes when weights change: ``continue`` or ``abort``.
        priority: the replay buffer's order (``fifo`` | ``reward_variance``).
        buffer_capacity: groups the buffer holds (0: ``(max_staleness + 2) * P``).
        spill_dir: keep buffered groups on disk there (None: in memory).
        train_in_thread: overlapping drivers run ``train_on`` in a worker thread so the event loop
            keeps generating (torch releases the GIL in its kernels).
    """

    mode: str = "sync"
    max_staleness: int = 1
    stale: str = "drop"
    partial: str = "continue"
    priority: str = "fifo"
    buffer_capacity: int = 0
    spill_dir: str | None = None
    train_in_thread: bool = True

    def __post_init__(self) -> None:
        for name, allowed in (("mode", PIPELINES), ("stale", STALE_POLICIES), ("partial", PARTIAL_POLICIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"pipeline {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be an int >= 0, got {self.max_staleness!r}")
        if self.buffer_capacity < 0:
            raise ValueError(f"buffer_capacity must be >= 0, got {self.buffer_capacity}")


@dataclass
class StepResult:
    """One learner update.

    Attributes:
        step: the 0-based training step.
        trajectories: what the learner trained on (``async``: group ids renumbered 0..P-1 in
            (rollout step, group) order, so groups of different steps never share an id).
        metrics: the learner's metrics plus ``timing/*``, ``staleness/*`` and ``pipeline/*``
            (``pipeline/wait_s``: seconds the learner waited for this batch).
        rollout_s: seconds the batch's rollout ran, from the start of its first request to the end
            of its last (``async``: over the groups' requests; a group restored from a checkpoint
            has no start here and is left out).
        groups: where each of the batch's groups comes from, ``(rollout step, group)`` by new group
            id (``sync`` / ``one_step_off``: ``(step, g)`` for every g; the run's ``batches.jsonl``).
    """

    step: int
    trajectories: list[Trajectory]
    metrics: dict[str, float] = field(default_factory=dict)
    rollout_s: float = 0.0
    groups: list[tuple[int, int]] = field(default_factory=list)


class WeightSync:
    """Sends one learner's weights to one rollout side, by the one rule of every run: when the version
    the rollout side holds (``target.weight_version``) differs from ``learner.version``, and on the
    first call whatever the versions say (an engine starts on the weights it loaded from disk), and
    whenever the target says it discarded them (``target.needs_weights``: a level-2 sleep).

    Args:
        target: ``weight_version`` and ``set_weights(weights, version)`` (a
            :class:`~chatgym.trainer.rollout.source.RolloutSource`, or an engine adapter).
        learner: ``export_weights(dtype)`` and ``version``.
        dtype: the dtype the weights are cast to on their way (None: as they are).
    """

    def __init__(self, target: Any, learner: LearnerLike, dtype: Any = None):
        self.target = target
        self.learner = learner
        self.dtype = dtype
        self.sent = False
        self.details: dict[str, float] = {}  # the last send's breakdown (a target's sync_metrics)

    def __call__(self) -> float:
        """Send when due (see the class docstring); returns the seconds it took (0.0: not due)."""
        self.details = {}
        discarded = getattr(self.target, "needs_weights", False)
        if self.sent and self.target.weight_version == self.learner.version and not discarded:
            return 0.0
        t0 = time.perf_counter()
        self.target.set_weights(self.learner.export_weights(self.dtype), self.learner.version)
        self.sent = True
        self.details = dict(getattr(self.target, "sync_metrics", None) or {})
        return time.perf_counter() - t0


class Pipeline:
    """Runs training steps over a rollout source and a learner (see the module docstring).

    Args:
        source: a :class:`~chatgym.trainer.rollout.source.RolloutSource`.
        learner: ``train_on(trajs) -> metrics``, ``export_weights(dtype)``, ``version``.
        request_for: ``step -> RolloutRequest`` (tasks and seeds a pure function of the step).
        options: :class:`PipelineOptions`.
        weights_dtype: dtype the weights are cast to on their way to the engine (None: as they are).
        train_on: what one update does with a step's batch, ``trajs -> metrics`` or a coroutine
            function (co-training scores the other party's samples first); None: ``learner.train_on``.

    Raises:
        ValueError: bad options (named).
    """

    def __init__(
        self,
        source: RolloutSource,
        learner: LearnerLike,
        request_for: Callable[[int], RolloutRequest],
        options: PipelineOptions,
        *,
        weights_dtype: Any = None,
        train_on: Callable[[list[Trajectory]], dict[str, float] | Awaitable[dict[str, float]]] | None = None,
    ):
        self.source = source
        self.learner = learner
        self.request_for = request_for
        self.options = options
        self.train_on = train_on
        # The learner's weights to the source; more learners add theirs (co-training's other party).
        self.weight_syncs = [WeightSync(source, learner, weights_dtype)]
        self.buffer: ReplayBuffer | None = None
        self._requests: dict[int, RolloutRequest] = {}
        # async state
        self._cursor: tuple[int, int] | None = None  # next (step, group) never issued yet
        self._requeue: list[tuple[int, int]] = []  # issued before, to run (again) first
        self._rerun: set[tuple[int, int]] = set()  # aborted once: never aborted again
        self._in_flight: dict[tuple[int, int], asyncio.Task] = {}
        self._spans: dict[tuple[int, int], tuple[float, float]] = {}  # a finished group's run
        self._admitted = 0  # groups issued and not yet trained on / dropped
        self._arrived: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._closing = False
        self.counters = {"aborted": 0, "dropped_stale": 0, "evicted": 0, "issued": 0}
        self._pending_state: dict[str, Any] | None = None

    # ---- shared ---------------------------------------------------------------------------------

    def _request(self, step: int) -> RolloutRequest:
        if step not in self._requests:
            self._requests = {s: r for s, r in self._requests.items() if s >= step - 2}
            self._requests[step] = self.request_for(step)
        return self._requests[step]

    def groups_per_step(self, step: int) -> int:
        return len(self._request(step).tasks)

    def sync_weights(self) -> float:
        """Every :class:`WeightSync` of :attr:`weight_syncs` that is due; returns the seconds it took."""
        return sum(sync() for sync in self.weight_syncs)

    def sync_metrics(self) -> dict[str, float]:
        """The last :meth:`sync_weights`' breakdown (``sync/*``: a Ray collective sync's stage,
        transfer and load seconds and bytes; summed over the syncs that reported one)."""
        out: dict[str, float] = {}
        for sync in self.weight_syncs:
            for key, value in sync.details.items():
                out[key] = out.get(key, 0.0) + float(value)
        return out

    async def _train(self, trajs: list[Trajectory], in_thread: bool) -> dict[str, float]:
        train_on = self.train_on or self.learner.train_on
        if in_thread and self.options.train_in_thread:
            out = await asyncio.to_thread(train_on, trajs)
        else:
            out = train_on(trajs)
        return await out if inspect.isawaitable(out) else out

    def run(self, start: int, stop: int) -> AsyncIterator[StepResult]:
        """Steps ``start .. stop-1``, one :class:`StepResult` each, in order."""
        drivers = {"sync": self._run_sync, "one_step_off": self._run_one_step_off, "async": self._run_async}
        return drivers[self.options.mode](start, stop)

    # ---- sync and one-step-off -------------------------------------------------------------------

    async def _run_sync(self, start: int, stop: int) -> AsyncIterator[StepResult]:
        for step in range(start, stop):
            yield await self.sync_step(step)

    async def sync_step(self, step: int) -> StepResult:
        """One ``sync`` step: collect step ``step``'s batch, train on it, send the weights."""
        t0 = time.perf_counter()
        trajs = await self.source.collect(self._request(step))
        rollout_s = time.perf_counter() - t0
        return await self._finish_step(step, trajs, rollout_s, rollout_s, t0, in_thread=False)

    async def _run_one_step_off(self, start: int, stop: int) -> AsyncIterator[StepResult]:
        pending: asyncio.Task | None = asyncio.ensure_future(self._timed_collect(start))
        try:
            for step in range(start, stop):
                t0 = time.perf_counter()
                assert pending is not None
                trajs, rollout_s = await pending
                wait_s = time.perf_counter() - t0
                # The update of step-1 is in: its weights go out before the next rollout starts.
                sync_s = self.sync_weights()
                pending = asyncio.ensure_future(self._timed_collect(step + 1)) if step + 1 < stop else None
                result = await self._finish_step(step, trajs, rollout_s, wait_s, t0, in_thread=True, sync=False)
                result.metrics["timing/sync_s"] = sync_s
                result.metrics.update(self.sync_metrics())
                yield result
            self.sync_weights()  # the last update reaches the engine (final evaluation)
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)

    async def _timed_collect(self, step: int) -> tuple[list[Trajectory], float]:
        t0 = time.perf_counter()
        trajs = await self.source.collect(self._request(step))
        return trajs, time.perf_counter() - t0

    async def _finish_step(
        self,
        step: int,
        trajs: list[Trajectory],
        rollout_s: float,
        wait_s: float,
        t0: float,
        *,
        in_thread: bool,
        sync: bool = True,
    ) -> StepResult:
        version = self.learner.version
        entries = entries_from_trajectories(trajs, step, self.source.weight_version)
        metrics = staleness_metrics(entries, version)
        # The engine idles through a sync step's update: a rollout side that sleeps frees its memory.
        sleeps = sync and hasattr(self.source, "sleep")
        if sleeps:
            metrics.update(self.source.sleep())
        metrics.update(await self._train(trajs, in_thread))
        if sync:
            metrics["timing/sync_s"] = self.sync_weights()
            metrics.update(self.sync_metrics())
        if sleeps:  # after the sync: the weights were woken and loaded there, the KV cache after them
            metrics.update(self.source.wake_up())
        metrics["timing/step_s"] = time.perf_counter() - t0
        metrics["pipeline/wait_s"] = wait_s
        return StepResult(step, trajs, metrics, rollout_s, [e.key for e in entries])

    # ---- async ------------------------------------------------------------------------------------

    def _limit(self, step: int) -> int:
        return (self.options.max_staleness + 1) * self.groups_per_step(step)

    def _ensure_buffer(self, step: int) -> ReplayBuffer:
        if self.buffer is None:
            opts = self.options
            want = self.groups_per_step(step)
            capacity = opts.buffer_capacity or (opts.max_staleness + 2) * want
            if capacity < want:
                raise ValueError(f"buffer_capacity {capacity} is below the {want} groups a step trains on")
            self.buffer = ReplayBuffer(capacity, opts.priority, opts.spill_dir)
        return self.buffer

    def _next_key(self) -> tuple[int, int]:
        if self._requeue:
            self._requeue.sort()
            return self._requeue.pop(0)
        assert self._cursor is not None
        key = self._cursor
        step, group = key
        self._cursor = (step, group + 1) if group + 1 < self.groups_per_step(step) else (step + 1, 0)
        return key

    def _fill(self) -> None:
        """Start groups while fewer than the admission limit are outstanding."""
        if self._closing or self._error is not None:
            return
        while self._admitted < self._limit(self._cursor[0] if self._cursor else 0):
            key = self._next_key()
            request = dataclasses.replace(self._request(key[0]), groups=(key[1],))
            version = self.source.weight_version
            task = asyncio.ensure_future(self._run_group(key, request, version))
            self._in_flight[key] = task
            self._admitted += 1
            self.counters["issued"] += 1

    async def _run_group(self, key: tuple[int, int], request: RolloutRequest, version: int) -> None:
        me = asyncio.current_task()
        started = time.perf_counter()
        try:
            trajs = await self.source.collect(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken source (not a failed episode: those are trajectories)
            self._error = exc
            if self._arrived is not None:
                self._arrived.set()
            return
        finally:
            if self._in_flight.get(key) is me:
                del self._in_flight[key]
        if self._closing:
            return
        self._spans[key] = (started, time.perf_counter())
        entries = entries_from_trajectories(trajs, key[0], version, groups=[key[1]])
        buffer = self._ensure_buffer(key[0])
        evicted = buffer.put(entries[0])
        for entry in evicted:
            self._spans.pop(entry.key, None)
        if evicted:
            self.counters["evicted"] += len(evicted)
            self._admitted -= len(evicted)
            self._fill()
        if self._arrived is not None:
            self._arrived.set()

    def _abort_in_flight(self) -> int:
        """``partial: abort``: cancel the in-flight groups and queue them to run again first. A group
        runs again at most once: its second run continues through later weight changes (an episode
        longer than one update would otherwise be restarted forever)."""
        aborted = [(k, t) for k, t in self._in_flight.items() if k not in self._rerun]
        for key, task in aborted:
            self._rerun.add(key)
            task.cancel()
            del self._in_flight[key]
            self._requeue.append(key)
            self._admitted -= 1
        self.counters["aborted"] += len(aborted)
        return len(aborted)

    async def _run_async(self, start: int, stop: int) -> AsyncIterator[StepResult]:
        opts = self.options
        self._arrived = asyncio.Event()
        self._closing = False
        buffer = self._ensure_buffer(start)
        if self._pending_state is not None:
            self._restore_async(self._pending_state)
            self._pending_state = None
        if self._cursor is None:
            self._cursor = (start, 0)
        try:
            self._fill()
            for step in range(start, stop):
                t0 = time.perf_counter()
                want = self.groups_per_step(step)
                before = dict(self.counters)
                while True:
                    if self._error is not None:
                        raise RuntimeError(f"rollout source failed: {self._error!r}") from self._error
                    if opts.stale == "drop":
                        dropped = buffer.drop_stale(self.learner.version, opts.max_staleness)
                        for entry in dropped:
                            self._spans.pop(entry.key, None)
                        if dropped:
                            self.counters["dropped_stale"] += len(dropped)
                            self._admitted -= len(dropped)
                            self._fill()
                    if len(buffer) >= want:
                        break
                    self._arrived.clear()
                    await self._arrived.wait()
                wait_s = time.perf_counter() - t0
                version = self.learner.version
                entries = sorted(buffer.take(want), key=lambda e: e.key)
                spans = [self._spans.pop(e.key) for e in entries if e.key in self._spans]
                rollout_s = max(b for _, b in spans) - min(a for a, _ in spans) if spans else 0.0
                trajs = [
                    dataclasses.replace(t, group_id=i)
                    for i, e in enumerate(entries)
                    for t in sorted(e.trajectories or (), key=lambda t: t.sample_index)
                ]
                metrics = staleness_metrics(entries, version)
                metrics.update(await self._train(trajs, in_thread=True))
                aborted = (
                    self._abort_in_flight()
                    if opts.partial == "abort" and self.learner.version != version
                    else 0
                )
                metrics["timing/sync_s"] = self.sync_weights()
                metrics.update(self.sync_metrics())
                self._admitted -= len(entries)
                self._fill()
                metrics["timing/step_s"] = time.perf_counter() - t0
                metrics["pipeline/wait_s"] = wait_s
                metrics["pipeline/buffer_size"] = float(len(buffer))
                metrics["pipeline/in_flight"] = float(len(self._in_flight))
                metrics["pipeline/aborted"] = float(aborted)
                for name in ("dropped_stale", "evicted"):
                    metrics[f"pipeline/{name}"] = float(self.counters[name] - before[name])
                metrics["pipeline/batch_steps"] = float(len({e.step for e in entries}))
                yield StepResult(step, trajs, metrics, rollout_s, [e.key for e in entries])
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Cancel the in-flight groups; their keys move to :meth:`state_dict`'s pending list (a
        cancelled group's task drops its key from the in-flight map as it ends, so the checkpoint
        written after the last step would otherwise not hold them, and a run resumed to more steps
        would never train them)."""
        self._closing = True
        keys, tasks = list(self._in_flight), list(self._in_flight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._in_flight.clear()  # a task cancelled before it began never ran its own clean-up
        self._requeue.extend(k for k in keys if k not in self._requeue)
        self._admitted -= len(keys)

    # ---- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What ``--resume`` needs to continue the ``async`` pipeline: the buffer, the next
        never-issued group, and the groups issued but not finished (run again first on resume: a
        group is trained on once, never lost). Empty for ``sync`` / ``one_step_off``: their next
        batch's tasks and seeds are a pure function of the step (``one_step_off`` resumed samples
        that batch with the checkpoint's weights, one version newer than the uninterrupted run's)."""
        if self.options.mode != "async":
            return {}
        return {
            "buffer": self.buffer.state_dict() if self.buffer is not None else None,
            "cursor": self._cursor,
            "pending": sorted({*self._in_flight, *self._requeue}),
            "counters": dict(self.counters),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output before :meth:`run` (async; ignored otherwise)."""
        if self.options.mode == "async" and state:
            self._pending_state = state

    def _restore_async(self, state: dict[str, Any]) -> None:
        assert self.buffer is not None
        if state.get("buffer") is not None:
            self.buffer.load_state_dict(state["buffer"])
        self._cursor = tuple(state["cursor"]) if state.get("cursor") is not None else None  # type: ignore[assignment]
        self._requeue = [tuple(k) for k in state.get("pending", [])]  # type: ignore[misc]
        self.counters.update(state.get("counters", {}))
        # Buffered groups count against the admission limit; the ones to re-run count once issued.
        self._admitted = len(self.buffer)
