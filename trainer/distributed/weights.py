"""Weight sync learner rank 0 -> rollout workers without the object store (``trainer.ray.weight_sync:
collective``; ``auto`` picks it on CUDA).

    sync = CollectiveSync(group)                       # driver side, owned by RayLearnerGroup
    sync.deliver(workers, pids, torch.bfloat16, version)

**Staging.** Learner rank 0 keeps ONE flat buffer of the policy's weights in the engine's dtype on its
device (:class:`Stager`), made on the first sync and made again only when the layout (names, shapes),
dtype or device changes — each re-make bumps the buffer's *generation*. Every sync copies the new
weights into it in place (the cast to bf16 happens in that copy: no intermediate copy of the model).

**Transfer.** A worker on **another GPU** (disaggregated) receives the buffer by NCCL broadcasts from
learner rank 0 over a process group of rank 0 and those workers (gloo on CPU, which is how it is tested
here), one broadcast per bucket of ``trainer.ray.weight_bucket_bytes`` (a bucket is a slice of the flat
buffer: a tensor may span two buckets), into its own persistent receive buffer of the same layout. A
worker on **the same GPU** (colocated — NCCL refuses two ranks on one device) maps rank 0's buffer
through CUDA IPC once per generation (``torch.multiprocessing.reductions``; the mapping is kept while
the generation holds) and copies it into its engine's parameters on the GPU. Either way the worker
loads views of the flat buffer with ``engine.update_weights`` and records the version. The same
layout as verl's and OpenRLHF's bucketed NCCL broadcast and their CUDA-IPC path for colocated engines.

**What a sync costs** on CUDA: the in-place copy on rank 0 (one device copy of the model, cast),
the broadcast (NCCL at link speed) or nothing (IPC: the worker reads rank 0's memory), and the
engine's copy into its parameters. Host synchronisations: one on rank 0 (IPC only: the other process
must see finished data), one per worker (the broadcast's bounded wait, or after the IPC copy: rank 0
overwrites the buffer at the next sync). Nothing moves to the host; no buffer or IPC handle is made
per step. :func:`checksum` (a bitwise check, for tests) runs only with ``verify``.

**Faults.** Every collective wait is bounded by ``trainer.ray.weight_sync_timeout_s``: a worker killed
mid-broadcast makes rank 0's (and the other receivers') wait fail within that bound; they abandon the
group (NCCL: ``abort``), the driver re-sends the weights to the surviving workers through the object
store for this step, and the group is formed again at the next sync. A worker restarted by Ray has a
new process (pid), which also forms the group again; until then it gets the weights from the object
store.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch

from chatgym.trainer.distributed import import_ray

DEFAULT_BUCKET_BYTES = 256 << 20
Layout = list[tuple[str, tuple[int, ...]]]
_RECEIVER: dict[str, Any] = {}  # this worker process's group, buffers and mapping (one per actor process)
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---- both sides ---------------------------------------------------------------------------------


def device_uuid() -> str | None:
    """The UUID of this process's CUDA device (Ray gives an actor its GPU as ``cuda:0``), or None."""
    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def make_group(backend: str, host: str, port: int, rank: int, world: int, timeout_s: float = 600.0) -> Any:
    """A standalone process group (not the default one: learner rank 0 is also in its learners'
    group) of ``world`` members over a TCP store at ``host:port`` served by rank 0. Its waits fail
    after ``timeout_s`` seconds (NCCL's watchdog gets 60 s more: :func:`broadcast` aborts first)."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout)
    prefix = dist.PrefixStore("chatgym_weights", store)
    if backend == "nccl":
        torch.cuda.set_device(0)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout + timedelta(seconds=60)
        return dist.ProcessGroupNCCL(prefix, rank, world, opts)
    return dist.ProcessGroupGloo(prefix, rank, world, timeout)


def buckets(numel: int, itemsize: int, bucket_bytes: int) -> list[tuple[int, int]]:
    """``[start, stop)`` element ranges of a flat buffer of ``numel`` elements of ``itemsize`` bytes,
    each at most ``bucket_bytes`` (at least one element), covering it in order."""
    step = max(1, int(bucket_bytes) // int(itemsize))
    return [(a, min(a + step, numel)) for a in range(0, numel, step)]


def broadcast(group: Any, flat: torch.Tensor, bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = 600.0) -> None:
    """Broadcast ``flat`` from rank 0 of ``group``, one collective per bucket; returns once every
    bucket is in (CUDA: one host wait, on the last bucket — the NCCL stream runs them in order).

    Raises:
        RuntimeError (or torch's DistBackendError): a wait ran past ``timeout_s`` or a peer is gone.
    """
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    bound = timedelta(seconds=timeout_s)
    works = []
    for a, b in buckets(flat.numel(), flat.element_size(), bucket_bytes):
        work = group.broadcast([flat[a:b]], opts)
        if flat.is_cuda:
            works.append(work)
        else:
            work.wait(bound)
    if works:
        for work in works[:-1]:
            work.wait()  # the current stream waits for it; the host does not
        works[-1].wait(bound)


def abandon(group: Any) -> None:
    """Give up a weight group after a failed collective (NCCL: abort the communicator, so no kernel
    keeps waiting on a dead peer); it is formed again at the next sync."""
    try:
        group.abort()
    except Exception:  # an already broken group has nothing left to abort
        pass


def views(flat: torch.Tensor, layout: Sequence[tuple[str, tuple[int, ...]]]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views of the flat buffer in ``layout`` order."""
    out, offset = [], 0
    for name, shape in layout:
        n = math.prod(shape)
        out.append((name, flat[offset : offset + n].view(shape)))
        offset += n
    return out


def checksum(pairs: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Sum over tensors of sum(bits(x) * (1 + position mod 7)), ``bits`` the values' bit patterns as
    signed ints of their width, in int64 on the tensors' device: exact and independent of summation
    order, so equal iff (with high probability) the same bits arrived in the same places. For tests
    (``verify``): it reads every value."""
    total = 0
    for _, t in pairs:
        x = t.detach().contiguous().reshape(-1)
        bits = x.view(_BITS[x.element_size()]).long()
        weight = 1 + torch.arange(x.numel(), device=x.device, dtype=torch.int64) % 7
        total += int((bits * weight).sum())
    return total


# ---- the learner side (rank 0) ------------------------------------------------------------------


class Stager:
    """Learner rank 0's persistent flat buffer of the weights and its group to the workers.

    Attributes:
        flat: the buffer (1-D, the engine's dtype, on rank 0's device), or None before the first stage.
        layout: ``[(name, shape)]`` of the buffer, in order.
        generation: bumped each time the buffer is made (a worker keys its receive buffer / IPC
            mapping by ``(rank 0's pid, generation)``).
    """

    def __init__(self) -> None:
        self.group: Any = None
        self.spec: dict[str, Any] = {}
        self.flat: torch.Tensor | None = None
        self.layout: Layout = []
        self.generation = 0
        self._where: tuple[torch.dtype, str] | None = None
        self._views: list[tuple[str, torch.Tensor]] = []
        self._handle: Any = None

    def stage(self, pairs: Sequence[tuple[str, torch.Tensor]], dtype: torch.dtype, device: torch.device, ipc: bool) -> dict[str, Any]:
        """Copy ``pairs`` (cast to ``dtype``) into the buffer on ``device``, in place (the buffer is
        made again only when the layout, dtype or device changed). Returns ``handle`` (the buffer's
        CUDA IPC handle when ``ipc``, else None), ``layout``, ``key``, ``bytes``, ``seconds``."""
        t0 = time.perf_counter()
        layout = [(n, tuple(t.shape)) for n, t in pairs]
        where = (dtype, str(device))
        if self.flat is None or layout != self.layout or where != self._where:
            self.flat, self._views, self._handle = None, [], None  # the old buffer goes first
            self.flat = torch.empty(sum(math.prod(s) for _, s in layout), dtype=dtype, device=device)
            self.layout, self._where = layout, where
            self._views = views(self.flat, layout)
            self.generation += 1
        with torch.no_grad():
            for (_, view), (_, t) in zip(self._views, pairs, strict=True):
                view.copy_(t.reshape(view.shape))
        if ipc:
            if self._handle is None:
                from torch.multiprocessing.reductions import reduce_tensor

                self._handle = reduce_tensor(self.flat)
            torch.cuda.current_stream().synchronize()  # another process reads it next
        return {
            "handle": self._handle if ipc else None,
            "layout": self.layout,
            "key": (os.getpid(), self.generation),
            "bytes": self.flat.numel() * self.flat.element_size(),
            "seconds": time.perf_counter() - t0,
        }

    def broadcast(self) -> dict[str, Any]:
        """Broadcast the buffer over :attr:`group`; ``{"ok", "seconds"}`` (+ ``error``). A failure
        abandons the group (formed again at the next sync) instead of raising."""
        t0 = time.perf_counter()
        try:
            if self.group is None or self.flat is None:
                raise RuntimeError("no weight group or nothing staged")
            broadcast(self.group, self.flat, self.spec.get("bucket_bytes", DEFAULT_BUCKET_BYTES), self.spec.get("timeout_s", 600.0))
        except Exception as exc:
            if self.group is not None:
                abandon(self.group)
            self.group = None
            return {"ok": False, "seconds": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {exc}"[:300]}
        return {"ok": True, "seconds": time.perf_counter() - t0}


# ---- the worker side ----------------------------------------------------------------------------


def worker_join(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Join the weight group as ``spec['rank']`` (a rollout worker's process); ``spec`` also holds
    ``backend``, ``host``, ``port``, ``world``, ``timeout_s`` and ``bucket_bytes``."""
    _RECEIVER.pop("group", None)  # an old group (members changed, or a failed sync) is dropped
    timeout_s = float(spec.get("timeout_s", 600.0))
    _RECEIVER["group"] = make_group(spec["backend"], spec["host"], spec["port"], spec["rank"], spec["world"], timeout_s)
    _RECEIVER.update(backend=spec["backend"], timeout_s=timeout_s, bucket_bytes=int(spec.get("bucket_bytes", DEFAULT_BUCKET_BYTES)))
    return {"pid": os.getpid(), "device_uuid": device_uuid()}


def hold_receive_for_test(seconds: float) -> None:
    """Test hook: the next :func:`worker_receive` sleeps ``seconds`` before it joins the broadcast
    (so a test can kill this process while rank 0 is in the broadcast)."""
    _RECEIVER["test_hold_s"] = float(seconds)


def _buffer(slot: str, key: Any, make: Callable[[], torch.Tensor], layout: Layout) -> tuple[torch.Tensor, list, bool]:
    """This process's buffer in ``slot`` for ``key`` (made by ``make`` when the key changed), its views
    and whether it was made now."""
    held = _RECEIVER.get(slot)
    if held is not None and held[0] == key:
        return held[1], held[2], False
    _RECEIVER.pop(slot, None)  # the old buffer / mapping goes first
    flat = make()
    _RECEIVER[slot] = (key, flat, views(flat, layout))
    return flat, _RECEIVER[slot][2], True


def worker_receive(local: Any, layout: Layout, dtype: str, version: int, key: Any = None, verify: bool = False) -> dict[str, Any]:
    """Receive the broadcast buffer into this worker's receive buffer (kept while ``key`` holds) and
    load it into ``local``'s engine with ``version``. Returns ``ok``, ``seconds``, ``transfer_s``,
    ``load_s``, ``bytes``, ``made`` (the buffer was made now) and, with ``verify``, ``checksum``;
    a failed broadcast returns ``ok: False`` and ``error`` (the engine keeps its weights)."""
    t0 = time.perf_counter()
    hold = _RECEIVER.pop("test_hold_s", 0.0)
    if hold:
        time.sleep(hold)
    group = _RECEIVER.get("group")
    if group is None:
        return {"ok": False, "error": "not in a weight group", "seconds": time.perf_counter() - t0}
    device = torch.device("cuda", 0) if _RECEIVER["backend"] == "nccl" else torch.device("cpu")
    total = sum(math.prod(s) for _, s in layout)
    flat, pairs, made = _buffer(
        "recv", (key, dtype, str(device)), lambda: torch.empty(total, dtype=getattr(torch, dtype), device=device), layout
    )
    try:
        broadcast(group, flat, _RECEIVER["bucket_bytes"], _RECEIVER["timeout_s"])
    except Exception as exc:
        abandon(group)
        _RECEIVER.pop("group", None)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300], "seconds": time.perf_counter() - t0}
    t1 = time.perf_counter()
    local.set_weights(pairs, version)
    t2 = time.perf_counter()
    out = {"ok": True, "seconds": t2 - t0, "transfer_s": t1 - t0, "load_s": t2 - t1, "made": made}
    out["bytes"] = flat.numel() * flat.element_size()
    if verify:
        out["checksum"] = checksum(pairs)
    return out


def worker_load_shared(local: Any, handle: Any, layout: Layout, version: int, key: Any = None, verify: bool = False) -> dict[str, Any]:
    """Copy learner rank 0's buffer on this GPU (CUDA IPC; mapped once per ``key``) into the engine
    in place with ``version``. Returns ``ok``, ``seconds``, ``transfer_s`` (0: nothing crosses),
    ``load_s``, ``bytes``, ``made`` (mapped now) and, with ``verify``, ``checksum``."""
    t0 = time.perf_counter()
    rebuild, args = handle
    flat, pairs, made = _buffer("shared", key, lambda: rebuild(*args), layout)
    local.set_weights(pairs, version)
    torch.cuda.current_stream().synchronize()  # rank 0 overwrites the buffer at the next sync
    out = {"ok": True, "seconds": time.perf_counter() - t0, "transfer_s": 0.0, "made": made}
    out["load_s"] = out["seconds"]
    out["bytes"] = flat.numel() * flat.element_size()
    if verify:
        out["checksum"] = checksum(pairs)
    return out


def worker_checksum(local: Any) -> int | None:
    """:func:`checksum` of the engine's own weights, by name order: a scripted engine's kept copy
    (``keep_weights``), else ``engine.model``'s named parameters; None when it has neither (tests)."""
    kept = getattr(local.engine, "kept", None)
    if kept:
        return checksum(sorted(kept.items(), key=lambda p: p[0]))
    model = getattr(local.engine, "model", None)
    if model is None or not hasattr(model, "named_parameters"):
        return None
    return checksum(sorted(model.named_parameters(), key=lambda p: p[0]))


# ---- the driver side ----------------------------------------------------------------------------


class CollectiveSync:
    """Driver-side coordinator of the collective weight sync of one :class:`RayLearnerGroup`.

    Args:
        group: the learner group (its rank-0 actor stages and broadcasts).
        timeout_s: bound of every collective wait (None: ``trainer.ray.weight_sync_timeout_s``).
        bucket_bytes: bytes per broadcast (None: ``trainer.ray.weight_bucket_bytes``).
        verify: workers return a :func:`checksum` of what they loaded (tests; reads every value).

    Attributes:
        stats: per worker index, what its receive returned (last sync).
        lost: worker indices that died or did not answer within the bound during the last sync (the
            rollout leaves them out until they answer again).
        metrics: the last sync's ``sync/*`` breakdown (the step's metrics carry it).
    """

    def __init__(self, group: Any, *, timeout_s: float | None = None, bucket_bytes: int | None = None, verify: bool = False):
        rc = group.cfg.trainer.ray
        self.group = group
        self.timeout_s = float(timeout_s if timeout_s is not None else rc.weight_sync_timeout_s)
        self.bucket_bytes = int(bucket_bytes if bucket_bytes is not None else rc.weight_bucket_bytes)
        self.verify = verify
        self.members: dict[int, int] = {}  # worker index -> pid in the current weight group
        self.ipc: set[int] = set()  # workers on learner rank 0's GPU
        self.stats: dict[int, dict[str, Any]] = {}
        self.lost: set[int] = set()
        self.metrics: dict[str, float] = {}
        self.forms = 0

    def deliver(
        self,
        workers: Mapping[int, Any],
        pids: Mapping[int, int],
        dtype: torch.dtype,
        version: int,
        fallback: Callable[[], Any] | None = None,
    ) -> float:
        """Send the weights to ``workers`` (index -> actor handle) and set ``version``; returns seconds.
        ``pids`` (index -> worker process id) tells a restarted worker from its dead incarnation;
        ``fallback()`` gives the weights' object-store ref for workers the collective failed
        (None: ``group.export_object_ref``).

        Raises:
            LearnerFailed: learner rank 0 died.
        """
        t0 = time.perf_counter()
        if dict(pids) != self.members:
            self._form(workers, pids)
        name = str(dtype).removeprefix("torch.")
        # The workers get rank 0's staged dict as an object ref: Ray hands it to them when the stage
        # is done, so the driver waits once for the whole sync instead of once per hop.
        refs = [a.stage_weights.remote(name, bool(self.ipc)) for a in self.group.actors]
        far = [i for i in workers if i not in self.ipc]
        rank0 = self.group.actors[0].broadcast_staged.remote() if far else None  # runs after the stage
        calls = {i: workers[i].receive_weights.remote(refs[0], name, version, self.verify) for i in far}
        for i in sorted(self.ipc):
            calls[i] = workers[i].load_shared_weights.remote(refs[0], version, self.verify)
        staged = self.group._get(refs)[0]  # a learner's death raises LearnerFailed here
        self.stats, self.lost, failed = self._collect(rank0, calls)
        if failed or self.lost:
            self.members = {}  # formed again (without the dead) at the next sync
        if failed:
            self._resend(workers, failed, version, fallback or (lambda: self.group.export_object_ref(dtype)))
        done = [s for s in self.stats.values() if s.get("ok")]
        self.metrics = {
            "sync/stage_s": float(staged["seconds"]),
            "sync/transfer_s": max((s.get("transfer_s", 0.0) for s in done), default=0.0),
            "sync/load_s": max((s.get("load_s", 0.0) for s in done), default=0.0),
            "sync/bytes": float(staged["bytes"]),
            "sync/fallback_workers": float(len(failed)),
            "sync/lost_workers": float(len(self.lost)),
        }
        return time.perf_counter() - t0

    def _collect(self, rank0: Any, calls: dict[int, Any]) -> tuple[dict[int, dict[str, Any]], set[int], list[int]]:
        """Wait (bounded) for rank 0's broadcast and the workers' receives; returns (stats per
        worker, workers lost — dead or not answering —, workers alive whose receive failed)."""
        ray = import_ray()
        refs = [*calls.values(), *([rank0] if rank0 is not None else [])]
        # Each side bounds its own waits by timeout_s; the driver's bound is a backstop past that.
        ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s + 30.0)
        if rank0 is not None and ray.wait([rank0], timeout=0)[0]:
            try:
                ray.get(rank0)  # its own failure (a dead worker) comes back as ok: False
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                self.group._fail(0, exc)
        stats: dict[int, dict[str, Any]] = {}
        lost: set[int] = set()
        failed: list[int] = []
        for i, ref in calls.items():
            if not ray.wait([ref], timeout=0)[0]:
                lost.add(i)  # still blocked: left out until it answers again
                continue
            try:
                stats[i] = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                lost.add(i)
                continue
            if not stats[i].get("ok"):
                failed.append(i)
        return stats, lost, failed

    def _resend(self, workers: Mapping[int, Any], failed: list[int], version: int, fallback: Callable[[], Any]) -> None:
        """The weights by the object store to the workers whose collective receive failed."""
        ray = import_ray()
        ref = fallback()
        calls = {i: workers[i].set_weights.remote(ref, version) for i in failed}
        for i, call in calls.items():
            try:
                ray.get(call, timeout=self.timeout_s + 30.0)
                self.stats[i] = {**self.stats[i], "ok": True, "fallback": True}
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                self.lost.add(i)

    def _form(self, workers: Mapping[int, Any], pids: Mapping[int, int]) -> None:
        """(Re)form the weight group: learner rank 0 and the workers not on its GPU."""
        ray = import_ray()
        rank0 = self.group.actors[0]
        uuid, host = ray.get(rank0.weight_endpoint.remote())
        infos = dict(zip(workers, ray.get([w.device_info.remote() for w in workers.values()]), strict=True))
        self.ipc = {i for i, info in infos.items() if uuid is not None and info["device_uuid"] == uuid}
        far = [i for i in workers if i not in self.ipc]
        if far:
            backend = "nccl" if uuid is not None else "gloo"
            port = ray.get(rank0.weight_port.remote(host))
            spec = {
                "backend": backend,
                "host": host,
                "port": port,
                "world": 1 + len(far),
                "timeout_s": self.timeout_s,
                "bucket_bytes": self.bucket_bytes,
            }
            calls = [rank0.join_weight_group.remote({**spec, "rank": 0})]
            calls += [workers[i].join_weight_group.remote({**spec, "rank": 1 + k}) for k, i in enumerate(far)]
            ray.get(calls, timeout=self.timeout_s + 30.0)
        self.members = dict(pids)
        self.forms += 1


class CollectiveWeights:
    """What ``RayLearnerGroup.export_weights`` returns under ``weight_sync: collective``: a Ray rollout
    calls :meth:`deliver`; anything else iterates it (the weights through the object store).

    Attributes (after :meth:`deliver`): ``lost`` (workers to leave out until they answer) and
    ``metrics`` (the sync's ``sync/*`` breakdown).
    """

    def __init__(self, group: Any, dtype: torch.dtype | None, version: int):
        self.group, self.dtype, self.version = group, dtype, version
        self._ref: Any = None
        self.lost: set[int] = set()
        self.metrics: dict[str, float] = {}

    def deliver(self, workers: Mapping[int, Any], pids: Mapping[int, int], version: int) -> float:
        sync = self.group.collective
        seconds = sync.deliver(workers, pids, self.dtype or torch.float32, version, fallback=lambda: self.object_ref)
        self.lost, self.metrics = set(sync.lost), dict(sync.metrics)
        return seconds

    @property
    def object_ref(self) -> Any:
        """The weights put into the object store by rank 0 (made on first use: a restarted worker)."""
        if self._ref is None:
            self._ref = self.group.export_object_ref(self.dtype)
        return self._ref

    def __iter__(self) -> Any:
        yield from import_ray().get(self.object_ref).items()
