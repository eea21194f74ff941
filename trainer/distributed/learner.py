"""Data-parallel learners as Ray actors, and the driver-side group the training loop talks to.

    group = RayLearnerGroup(cfg, ckpt=None, out_dir=out)       # Ray initialised before
    metrics = group.train_on(trajectories)                     # every rank: the whole batch's update
    rollout.set_weights(group.export_weights(torch.bfloat16), group.version)
    group.save(out, steps_done, config_dict)

Each of the ``trainer.ray.num_learners`` actors holds one :class:`~chatgym.trainer.learner.learner.Learner`
(the same object a local run builds, with the same seed, so the initial weights are the same) and
joins one ``torch.distributed`` group: ``gloo`` on CPU, ``nccl`` on CUDA.

**The update is the one-learner update.** Every rank builds its learner with the local trainer's
own function (:func:`~chatgym.trainer.learner.learner.build_seeded_learner`: the seed, then the
compute set-up), gets the whole batch and prepares it as one learner would. The no-gradient passes of
preparation (reference and old-policy logprobs, critic values) run once per token across the ranks:
each micro-batch of the one-learner plan goes to one rank (:meth:`DataParallel.assign`), and a SUM
all-reduce of the (B, T) results (each row non-zero on one rank only) gives every rank every row's
values bit for bit as one learner computes them — a row's trainer changes with every epoch's
shuffle, so each rank needs every row's old logprobs before the first optimizer step. Rewards and
advantages (cheap, and needing the whole batch) are computed whole on every rank, and so is every
batch metric (``reward/kl_penalty``, advantage means): the same figure on every rank as on one
learner. T-PPO's bootstrap values (a pass over the truncated rows only) still run on every rank.
The optimizer steps see the same mini-batches (the shared update generator orders them); inside a
mini-batch each micro-batch is run by exactly one rank (:meth:`DataParallel.assign`, longest first to
the least-loaded rank). A micro-batch's loss is already divided by the *mini-batch's* token (or
sequence) count (:func:`~chatgym.trainer.algos.aggregate_loss` gets the global totals), so the
SUM of the ranks' gradients is the one-learner gradient — the token-mean of the global batch, not a
mean of per-rank means. Clipping then sees the global norm: after the all-reduce every rank holds the
full gradient (``replicate``), or FSDP2 computes the norm over all shards (``fsdp``). The same scheme
as DDP with ``no_sync`` accumulation (PyTorch DDP docs) and verl's / OpenRLHF's global-token loss
scaling.

**Sharding** (``trainer.ray.learner_sharding``): ``replicate`` keeps a full copy per rank and
all-reduces the gradients before each optimizer step (bucketed, SUM); ``fsdp`` applies FSDP2
``fully_shard`` to each decoder layer and the model (parameters, gradients and optimizer state split
across ranks; gradients reduce-scattered in every backward with divide factor 1, so they are sums as
above). Under ``fsdp`` every rank must run the same forwards and backwards (their all-gathers pair
up), so a rank with fewer micro-batches runs lockstep passes whose loss mask is empty (they add
nothing). ``auto``: ``fsdp`` on CUDA with more than one learner, else ``replicate``.

**Faults.** A learner actor is never restarted (its optimizer state would be gone): when one dies
(kill -9, OOM) the group kills the others (a peer would wait in a collective) and raises
:class:`LearnerFailed`, one line naming the last checkpoint to resume from. A checkpoint the disk
refuses raises :class:`~chatgym.trainer.learner.checkpoint.CheckpointNotWritten` here as a local
learner does (one line, not Ray's traceback); the learners live on.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from chatgym.trainer.distributed import import_ray
from chatgym.trainer.distributed.data_parallel import DataParallel
from chatgym.trainer.distributed.fsdp import save_sharded, shard, sharding
from chatgym.trainer.learner.checkpoint import CheckpointNotWritten, latest_checkpoint


class LearnerFailed(RuntimeError):
    """A learner process died; the run stops (the message is one line and names the checkpoint)."""


# ---- the actor ------------------------------------------------------------------------------------


class LearnerActor:
    """One data-parallel learner process (``ray.remote(LearnerActor)``; built by :class:`RayLearnerGroup`).

    Args:
        cfg: the run's :class:`~chatgym.trainer.config.run.Config`.
        rank, world_size: this learner's rank and the number of learners.
    """

    def __init__(self, cfg: Any, rank: int, world_size: int):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.learner: Any = None
        self.sharded = False

    def pid(self) -> int:
        return os.getpid()

    def rendezvous(self) -> tuple[str, int]:
        """(address, free port) on this node for the process group's TCP store (asked of rank 0)."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            return host, int(s.getsockname()[1])

    def setup(self, master: tuple[str, int], ckpt: str | None) -> dict[str, Any]:
        """Join the process group and build the learner (seeded as a local run, so the same initial
        weights); returns ``start_step``, ``version``, ``device``, ``sharding``, the model's
        ``generation_config``, ``pid`` and ``torch_threads`` (this actor's CPU threads: Ray's
        ``OMP_NUM_THREADS``, ``floor(learner_num_cpus)`` and at least 1 unless the driver sets it)."""
        import torch.distributed as dist

        from chatgym.trainer.chat.tokenizer import get_tokenizer
        from chatgym.trainer.learner.learner import build_seeded_learner
        from chatgym.trainer.models.packaged import load_model_path

        cfg = self.cfg
        tokenizer = get_tokenizer(load_model_path(cfg.model.path))
        # The local trainer's own construction (seed, then Learner): the same initial weights and
        # the same compute set-up as a local run.
        learner = build_seeded_learner(cfg, tokenizer, Path(ckpt) if ckpt else None)
        self.learner = learner
        if self.world_size > 1:
            backend = "nccl" if learner.device.type == "cuda" else "gloo"
            if learner.device.type == "cuda":
                # Ray shows this actor its GPU(s) from cuda:0; "cuda" alone has no index to set.
                torch.cuda.set_device(learner.device.index or 0)
            dist.init_process_group(
                backend,
                init_method=f"tcp://{master[0]}:{master[1]}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(minutes=30),
            )
            self.sharded = sharding(cfg) == "fsdp"
            if self.sharded:
                shard(learner, ckpt)
            learner.use_data_parallel(DataParallel(self.rank, self.world_size, sharded=self.sharded))
        base = learner.base_model()
        return {
            "start_step": learner.start_step,
            "version": learner.version,
            "device": str(learner.device),
            "sharding": "fsdp" if self.sharded else ("replicate" if self.world_size > 1 else "none"),
            "generation_config": getattr(base, "generation_config", None),
            "pid": os.getpid(),
            "torch_threads": torch.get_num_threads(),
        }

    def train_on(self, trajs: Sequence[Any]) -> tuple[dict[str, float], int]:
        """:meth:`Learner.train_on` on the whole batch (this rank's share of the preparation passes
        and of the update); returns the metrics — with more than one learner
        ``learner/prepared_rows``, the rows this rank ran through the no-gradient preparation
        passes — and the new version."""
        dp = self.learner.plan.data_parallel
        if dp is not None:
            dp.prepared_rows = 0
        metrics = self.learner.train_on(trajs)
        if dp is not None:
            metrics["learner/prepared_rows"] = float(dp.prepared_rows)
        return metrics, self.learner.version

    def batch_of(self, trajs: Sequence[Any]) -> dict[str, torch.Tensor] | None:
        """The token batch this learner would train on for ``trajs`` (``input_ids``,
        ``attention_mask``, ``loss_mask``, ``advantages``), without updating: for checks."""
        batch, _ = self.learner.prepare(trajs)
        if batch is None:
            return None
        return {k: getattr(batch, k) for k in ("input_ids", "attention_mask", "loss_mask", "advantages")}

    def full_weights(self, dtype: str | None = None, device: str = "cpu") -> dict[str, torch.Tensor] | None:
        """The plain model's weights by name (LoRA merged), cast to ``dtype``, on ``device``; every
        rank must call it under FSDP (the shards are gathered); rank 0 gets them, others None."""
        out: dict[str, torch.Tensor] = {}
        want = getattr(torch, dtype) if dtype else None
        for name, tensor in self.learner.export_weights():
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            if self.rank == 0:
                t = tensor if want is None else tensor.to(want)
                out[name] = t.to(device).contiguous()
        return out if self.rank == 0 else None

    def put_weights(self, dtype: str | None) -> list[Any] | None:
        """Rank 0: the weights (CPU, ``dtype``) put into the object store once; returns ``[ref]``
        (wrapped: a bare ref would be resolved by Ray on the way back). Others: None."""
        import ray

        state = self.full_weights(dtype)
        return [ray.put(state)] if state is not None else None

    # -- collective weight sync (weights.py): rank 0 stages, broadcasts, or shares by CUDA IPC --

    def weight_endpoint(self) -> tuple[str | None, str]:
        """(this rank's CUDA device UUID or None, this node's address)."""
        import ray

        from chatgym.trainer.distributed.weights import device_uuid

        return device_uuid(), ray.util.get_node_ip_address()

    def weight_port(self, host: str) -> int:
        from chatgym.trainer.distributed.weights import free_port

        return free_port(host)

    def join_weight_group(self, spec: dict[str, Any]) -> None:
        from chatgym.trainer.distributed.weights import Stager, make_group

        self.stager = getattr(self, "stager", None) or Stager()
        self.stager.group = None  # an old group (members changed, or a failed sync) is dropped
        self.stager.spec = dict(spec)
        self.stager.group = make_group(
            spec["backend"], spec["host"], spec["port"], 0, spec["world"], float(spec.get("timeout_s", 600.0))
        )

    def stage_weights(self, dtype: str, ipc: bool) -> dict[str, Any] | None:
        """Every rank (FSDP gathers, one tensor at a time); rank 0 copies the weights, cast to
        ``dtype``, into its persistent flat buffer on its device and returns
        :meth:`~chatgym.trainer.distributed.weights.Stager.stage`'s dict (``handle`` when ``ipc``,
        ``layout``, ``key``, ``bytes``, ``seconds``); other ranks None."""
        from chatgym.trainer.distributed.weights import Stager

        want = getattr(torch, dtype)
        pairs = []
        for name, tensor in self.learner.export_weights():
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor().to(want)  # a gathered shard: keep only the cast copy
            if self.rank == 0:
                pairs.append((name, tensor.detach()))
        if self.rank != 0:
            return None
        self.stager = getattr(self, "stager", None) or Stager()
        return self.stager.stage(pairs, want, self.learner.device, ipc)

    def broadcast_staged(self) -> dict[str, Any]:
        """Rank 0: broadcast the staged buffer over the weight group (bounded wait; ``ok: False``
        and the group abandoned when a worker is gone)."""
        return self.stager.broadcast()

    def save(self, output_dir: str, steps_done: int, config_dict: dict[str, Any], pipeline_state: Any) -> str | None:
        """Write the checkpoint (rank 0; every rank takes part in gathering the shards under FSDP).

        Raises:
            CheckpointNotWritten: the disk refused the checkpoint (rank 0); its partial files are removed.
        """
        kwargs = {"pipeline_state": pipeline_state} if pipeline_state is not None else {}
        if not self.sharded:
            if self.rank != 0:
                return None
            return str(self.learner.save(output_dir, steps_done, config_dict, **kwargs))
        return save_sharded(self.learner, self.rank, output_dir, steps_done, config_dict, kwargs)

    def save_model(self, path: str) -> None:
        """``save_pretrained`` of the plain model (the engine's random-init model) at ``path``."""
        state = self.full_weights()
        if state is not None:
            self.learner.base_model().save_pretrained(path, state_dict=state, safe_serialization=True)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


# ---- the driver side ------------------------------------------------------------------------------


class WeightsHandle:
    """The policy's weights in the object store (put once by learner rank 0).

    Iterating yields ``(name, tensor)`` (fetched here: what a local rollout needs); a Ray rollout hands
    ``object_ref`` to its workers instead, so the weights go learner -> workers without the driver.
    """

    def __init__(self, object_ref: Any, version: int):
        self.object_ref, self.version = object_ref, version

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from import_ray().get(self.object_ref).items()


class _BaseModel:
    """What the loop reads of ``learner.base_model()``: its generation config and ``save_pretrained``."""

    def __init__(self, group: RayLearnerGroup, generation_config: Any):
        self.group, self.generation_config = group, generation_config

    def save_pretrained(self, path: Any, **_: Any) -> None:
        self.group._all("save_model", str(path))


class RayLearnerGroup:
    """The learner side of a ``trainer.backend: ray`` run: ``trainer.ray.num_learners`` actors, with
    the surface of :class:`~chatgym.trainer.learner.learner.Learner` the loop uses.

    Args:
        cfg: the run's config (``trainer.ray.num_learners``, ``learner_num_cpus``, ``learner_num_gpus``,
            ``learner_sharding``).
        ckpt: the checkpoint to restore, or None.
        out_dir: the run's output directory (where :class:`LearnerFailed` looks for the last checkpoint).
        scheduling: per-rank extra ``.options(...)`` (placement group bundles), or None.

    Raises:
        RuntimeError: Ray is not initialised.
        LearnerFailed: a learner died while starting.
        ValueError: the roles ask for more CPUs / GPUs than the cluster has, or a CUDA learner for
            no GPU (:func:`~chatgym.trainer.distributed.cluster.check_resources` names the fields).
    """

    def __init__(
        self,
        cfg: Any,
        *,
        ckpt: Path | None = None,
        out_dir: str | Path | None = None,
        scheduling: Sequence[dict[str, Any]] | None = None,
    ):
        ray = import_ray()
        if not ray.is_initialized():
            raise RuntimeError("RayLearnerGroup needs a Ray cluster: call distributed.cluster.start_or_join first")
        from chatgym.trainer.distributed.cluster import check_resources

        check_resources(cfg, learners=True)  # a request the cluster can never meet would wait forever
        rc = cfg.trainer.ray
        self.cfg = cfg
        self.out_dir = Path(out_dir) if out_dir is not None else Path(cfg.train.output_dir)
        n = rc.num_learners
        actor = ray.remote(LearnerActor)
        self.actors = [
            actor.options(
                num_cpus=rc.learner_num_cpus,
                num_gpus=rc.learner_num_gpus,
                max_restarts=0,
                **(scheduling[r] if scheduling else {}),
            ).remote(cfg, r, n)
            for r in range(n)
        ]
        master = self._get([self.actors[0].rendezvous.remote()])[0]
        infos = self._all("setup", master, str(ckpt) if ckpt else None)
        self.info = infos[0]
        self.pids = [i["pid"] for i in infos]
        self.start_step = int(self.info["start_step"])
        self.version = int(self.info["version"])
        self.device = torch.device(self.info["device"])
        self._base = _BaseModel(self, self.info["generation_config"])
        self.weight_sync = rc.weight_sync
        if self.weight_sync == "auto":
            self.weight_sync = "collective" if self.device.type == "cuda" else "object_store"
        self._collective: Any = None
        self.rank_metrics: list[dict[str, float]] = []  # each rank's metrics of the last train_on
        print(
            f"chatgym: {n} learner(s) on Ray, {self.info['device']}, sharding {self.info['sharding']}",
            file=sys.stderr,
        )

    def train_on(self, trajs: Sequence[Any]) -> dict[str, float]:
        """Every rank's share of the update on the whole batch; returns rank 0's metrics (batch and
        update metrics are global: every rank ends preparation with the whole batch's values) with
        ``learner/prepared_rows`` summed over the ranks and ``learner/prepared_rows_max`` (the most
        one rank prepared: the balance). ``version`` goes up by one when an update ran;
        ``rank_metrics`` keeps each rank's own metrics of the call."""
        ray = import_ray()
        t0 = time.perf_counter()
        ref = ray.put(list(trajs))  # one copy in the object store, read by every rank
        results = self._all("train_on", ref)
        self.rank_metrics = [dict(m) for m, _ in results]
        metrics, self.version = dict(results[0][0]), results[0][1]
        rows = [m["learner/prepared_rows"] for m in self.rank_metrics if "learner/prepared_rows" in m]
        if rows:
            metrics["learner/prepared_rows"] = float(sum(rows))
            metrics["learner/prepared_rows_max"] = float(max(rows))
        metrics["timing/learner_call_s"] = time.perf_counter() - t0
        return metrics

    def export_weights(self, dtype: torch.dtype | None = None) -> Any:
        """The policy's weights cast to ``dtype``, for a rollout's ``set_weights``: under
        ``weight_sync: object_store`` a :class:`WeightsHandle` (put into the object store by rank 0);
        under ``collective`` a :class:`~chatgym.trainer.distributed.weights.CollectiveWeights` (a Ray
        rollout has it broadcast / shared on the GPU). Both iterate as ``(name, tensor)`` pairs."""
        if self.weight_sync == "collective":
            from chatgym.trainer.distributed.weights import CollectiveWeights

            return CollectiveWeights(self, dtype, self.version)
        return WeightsHandle(self.export_object_ref(dtype), self.version)

    def export_object_ref(self, dtype: torch.dtype | None = None) -> Any:
        """The weights (CPU, ``dtype``) put into the object store once by rank 0; their ref."""
        name = str(dtype).removeprefix("torch.") if dtype is not None else None
        [ref] = self._all("put_weights", name)[0]
        return ref

    @property
    def collective(self) -> Any:
        """The driver side of the collective weight sync (formed on first use)."""
        if self._collective is None:
            from chatgym.trainer.distributed.weights import CollectiveSync

            self._collective = CollectiveSync(self)
        return self._collective

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's full weights (float as trained) here, by name."""
        return self._all("full_weights")[0]

    def save(
        self,
        output_dir: str | Path,
        steps_done: int,
        config_dict: dict[str, Any],
        pipeline_state: dict[str, Any] | None = None,
    ) -> Path:
        """Write ``output_dir/checkpoints/step_NNNNNN`` from rank 0 (the one-learner format).

        Raises:
            CheckpointNotWritten: the disk refused it (full, quota, read-only, a file size limit): the
                one-line message of a local run's, older checkpoints kept; the learners live on.
            LearnerFailed: a learner died.
        """
        return Path(self._all("save", str(output_dir), steps_done, config_dict, pipeline_state)[0])

    def base_model(self) -> _BaseModel:
        return self._base

    def close(self) -> None:
        """End the actors (the cluster stays)."""
        ray = import_ray()
        for a in self.actors:
            try:
                ray.get(a.close.remote(), timeout=30)
            except Exception:  # a dead learner has nothing to close
                pass
            ray.kill(a, no_restart=True)
        self.actors = []

    # ---- calls and failures ----------------------------------------------------------------------

    def _all(self, method: str, *args: Any) -> list[Any]:
        return self._get([getattr(a, method).remote(*args) for a in self.actors])

    def _get(self, refs: list[Any]) -> list[Any]:
        """The results of ``refs`` (one per rank, in rank order); the first death among them ends
        every learner and raises :class:`LearnerFailed` — a peer of a dead rank would wait in its
        collective until the process group's timeout. A checkpoint the disk refused raises
        :class:`CheckpointNotWritten`; any other error of a rank ends every learner and is raised as
        Ray raises it (an instance of the rank's exception type)."""
        ray = import_ray()
        left = list(refs)
        while left:
            done, left = ray.wait(left, num_returns=1)
            try:
                ray.get(done[0])
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                self._fail(refs.index(done[0]), exc)
            except Exception as exc:
                cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else None
                if isinstance(cause, CheckpointNotWritten):
                    # Ray's error is a CheckpointNotWritten too, but its text is the actor's traceback,
                    # which `chatgym train` printed after its one line: raise rank 0's message alone.
                    # The learners are left running, as a local learner is: only rank 0 writes, after
                    # every rank has gathered its shards, so no peer waits in a collective.
                    raise CheckpointNotWritten(str(cause)) from exc
                # An error raised inside a rank (a bug, a bad config): its peers would wait in a
                # collective; end them all and raise it as is.
                self._kill_all()
                raise
        return ray.get(refs)

    def _kill_all(self) -> None:
        ray = import_ray()
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []

    def _fail(self, rank: int, exc: BaseException) -> None:
        self._kill_all()
        last = latest_checkpoint(self.out_dir)
        where = f"resume from {last} (--resume)" if last else "no checkpoint was written; the run must start over"
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise LearnerFailed(
            f"learner rank {rank} died ({type(exc).__name__}: {reason}); the run stops: {where}"
        ) from None
