"""``RolloutWorker``: one engine replica with its envs and collectors, inside one Ray actor process.

The worker builds everything from the run's config in its own process — the tokenizer, the engine
(``engine.backend``, or ``trainer.ray.engine_factory``) and the train/eval collectors — with the same
:func:`~chatgym.trainer.roles.build.build_local_rollout` a local run uses. It is an async actor: the driver
sends one call per episode and many run at once on the actor's event loop, the engine batching
whatever generate calls are in flight. A whole episode (every turn) runs inside one call, so it stays
on this replica. Weights arrive with a version; every trajectory records the version of each token.

When the run shares a tool budget (``trainer.ray.tool_limits`` / ``tool_rates``) the worker installs
a :class:`~chatgym.trainer.distributed.limiter.LimiterGate` as its process's
:mod:`chatgym.envs.tool_gate` and, after a restart, retires the slots its dead incarnation held.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from chatgym.trainer.rollout.source import RolloutRequest
from chatgym.trainer.rollout.types import Trajectory


def load_factory(path: str) -> Any:
    """The callable named ``"module:function"``.

    Raises:
        ValueError: ``path`` is not ``module:function`` or names nothing callable.
    """
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"trainer.ray.engine_factory must be 'module:function', got {path!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"trainer.ray.engine_factory: cannot load {path!r} ({exc})") from exc
    if not callable(fn):
        raise ValueError(f"trainer.ray.engine_factory: {path!r} is not callable")
    return fn


class RolloutWorker:
    """The actor class (``ray.remote(RolloutWorker)``; see :func:`worker_actor_class`).

    Args:
        cfg: the run's :class:`~chatgym.trainer.config.run.Config`.
        index: this worker's index (0..N-1); its trace file is ``traces_worker{index}.jsonl``.
        model_path: the model directory the engine loads (and the tokenizer comes from).
        out_dir: the run's output directory (traces).
        limiter: the :class:`~chatgym.trainer.distributed.limiter.ToolLimiter` actor, or None.
        limited_kinds: the kinds the limiter limits.
    """

    def __init__(
        self,
        cfg: Any,
        index: int,
        model_path: str,
        out_dir: str,
        limiter: Any = None,
        limited_kinds: Sequence[str] = (),
    ):
        from chatgym.envs import tool_gate
        from chatgym.trainer.chat.tokenizer import get_tokenizer
        from chatgym.trainer.roles.local import build_local_rollout

        self.index = index
        self.pid = os.getpid()
        self.started = time.time()
        if limiter is not None:
            from chatgym.trainer.distributed.limiter import LimiterGate

            holder = f"{index}:{self.pid}"
            limiter.retire.remote(str(index), holder)  # frees what a crashed incarnation held
            tool_gate.install(LimiterGate(limiter, holder, set(limited_kinds)))
        tokenizer = get_tokenizer(model_path)
        factory = cfg.trainer.ray.engine_factory
        engine = load_factory(factory)(cfg, tokenizer, model_path, index) if factory else None
        self.local = build_local_rollout(
            cfg,
            engine=engine,
            tokenizer=tokenizer,
            model_path=model_path,
            out_dir=out_dir,
            trace_name=f"traces_worker{index}.jsonl",
        )

    async def run(self, request: RolloutRequest) -> list[Trajectory]:
        """The trajectories of ``request`` (usually one episode: ``request.only``) through this
        worker's :class:`~chatgym.trainer.rollout.source.LocalRollout`, in grid order; each sampled
        exactly as it would be inside the whole step's request."""
        trajs = await self.local.collect(request)
        for t in trajs:
            t.info["rollout_worker"] = self.index
        return trajs

    def set_weights(self, weights: Mapping[str, Any], version: int) -> float:
        """Load ``weights`` (``{name: tensor}``, resolved by Ray from the driver's one ``ray.put``)
        into the engine and record ``version``; returns the seconds it took."""
        return self.local.set_weights(weights.items(), version)

    # Collective weight sync (trainer.ray.weight_sync: collective; chatgym.trainer.distributed.weights).

    def device_info(self) -> dict[str, Any]:
        from chatgym.trainer.distributed.weights import device_uuid

        return {"pid": self.pid, "device_uuid": device_uuid()}

    def join_weight_group(self, spec: dict[str, Any]) -> dict[str, Any]:
        from chatgym.trainer.distributed.weights import worker_join

        return worker_join(spec)

    def receive_weights(self, staged: dict[str, Any], dtype: str, version: int, verify: bool = False) -> dict[str, Any]:
        """The broadcast from learner rank 0 (:func:`~chatgym.trainer.distributed.weights.worker_receive`);
        ``staged`` is rank 0's :meth:`~chatgym.trainer.distributed.weights.Stager.stage` dict (the
        driver passes its object ref: Ray hands it over from rank 0 without a round trip through the driver)."""
        from chatgym.trainer.distributed.weights import worker_receive

        return worker_receive(self.local, staged["layout"], dtype, version, staged["key"], verify)

    def load_shared_weights(self, staged: dict[str, Any], version: int, verify: bool = False) -> dict[str, Any]:
        """Learner rank 0's buffer on this GPU by CUDA IPC (:func:`~chatgym.trainer.distributed.weights.worker_load_shared`);
        ``staged`` as for :meth:`receive_weights`."""
        from chatgym.trainer.distributed.weights import worker_load_shared

        return worker_load_shared(self.local, staged["handle"], staged["layout"], version, staged["key"], verify)

    def engine_checksum(self) -> int | None:
        """:func:`~chatgym.trainer.distributed.weights.checksum` of the engine's own weights (tests)."""
        from chatgym.trainer.distributed.weights import worker_checksum

        return worker_checksum(self.local)

    def hold_receive_for_test(self, seconds: float) -> None:
        """Test hook: the next broadcast receive waits ``seconds`` before joining the broadcast."""
        from chatgym.trainer.distributed.weights import hold_receive_for_test

        hold_receive_for_test(seconds)

    def info(self) -> dict[str, Any]:
        """``pid``, ``index``, ``weight_version`` and ``started`` (epoch seconds) of this incarnation."""
        return {
            "pid": self.pid,
            "index": self.index,
            "weight_version": self.local.weight_version,
            "started": self.started,
        }

    def engine_prompts(self) -> list[list[int]]:
        """Every prompt this replica's engine served, when the engine keeps them (the scripted one)."""
        return [list(p) for p in getattr(self.local.engine, "prompts", [])]

    async def close(self) -> None:
        """The collectors, and a separate GenRM judge's engine (``LocalRollout.aclose``)."""
        await self.local.aclose()
