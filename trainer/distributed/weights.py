"""Weight sync learner rank 0 -> rollout workers without the object store (``trainer.ray.weight_sync:
collective``; ``auto`` picks it on CUDA).

    sync = CollectiveSync(group)                       # driver side, owned by RayLearnerGroup
    sync.deliver(workers, pids, torch.bfloat16, version)

Learner rank 0 lays the policy's weights (cast to the engine's dtype) into one flat buffer on its
device. A worker on **another GPU** (disaggregated) receives it by a NCCL broadcast from learner rank 0
over a process group of rank 0 and those workers (gloo on CPU, which is how it is tested here); a
worker on **the same GPU** (colocated — NCCL refuses two ranks on one device) maps the buffer through
CUDA IPC (``torch.multiprocessing.reductions.reduce_tensor``) and copies it into its engine's
parameters on the GPU, in place. Either way the worker loads views of the flat buffer with
``engine.update_weights`` and records the version. Same layout as verl's and OpenRLHF's NCCL weight
broadcast and their CUDA-IPC path for colocated engines.

The group is formed on the first sync and formed again when its members change (a worker restarted by
Ray has a new process); a restarted worker gets the weights from the object store until then.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch

from chatgym.trainer.distributed import import_ray

_TIMEOUT = timedelta(minutes=10)
_RECEIVER: dict[str, Any] = {}  # this worker process's group and layout (one per actor process)


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


def make_group(backend: str, host: str, port: int, rank: int, world: int) -> Any:
    """A standalone process group (not the default one: learner rank 0 is also in its learners'
    group) of ``world`` members over a TCP store at ``host:port`` served by rank 0."""
    import torch.distributed as dist

    store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=_TIMEOUT)
    prefix = dist.PrefixStore("chatgym_weights", store)
    if backend == "nccl":
        torch.cuda.set_device(0)
        return dist.ProcessGroupNCCL(prefix, rank, world)
    return dist.ProcessGroupGloo(prefix, rank, world, _TIMEOUT)


def broadcast(group: Any, flat: torch.Tensor) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([flat], opts).wait()
    if flat.is_cuda:
        torch.cuda.current_stream().synchronize()


def views(flat: torch.Tensor, layout: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views of the flat buffer in ``layout`` order."""
    out, offset = [], 0
    for name, shape in layout:
        n = 1
        for d in shape:
            n *= d
        out.append((name, flat[offset : offset + n].view(shape)))
        offset += n
    return out


def checksum(pairs: Any) -> float:
    """Sum over tensors of sum(x * (1 + position mod 7)) in float64: a cheap check that the same
    values arrived in the same places (tests)."""
    total = 0.0
    for _, t in pairs:
        x = t.detach().reshape(-1).double().cpu()
        total += float((x * (1 + torch.arange(x.numel(), dtype=torch.float64) % 7)).sum())
    return total


# ---- the learner side (rank 0) ------------------------------------------------------------------


class Stager:
    """Learner rank 0's flat buffer of the weights and its group to the workers."""

    def __init__(self) -> None:
        self.group: Any = None
        self.flat: torch.Tensor | None = None
        self.layout: list[tuple[str, tuple[int, ...]]] = []

    def stage(self, pairs: list[tuple[str, torch.Tensor]], device: torch.device, ipc: bool) -> Any:
        """Lay ``pairs`` into one flat buffer on ``device``; returns its CUDA IPC handle when ``ipc``."""
        self.layout = [(n, tuple(t.shape)) for n, t in pairs]
        dtype = pairs[0][1].dtype
        total = sum(t.numel() for _, t in pairs)
        self.flat = torch.empty(total, dtype=dtype, device=device)
        for (_, view), (_, t) in zip(views(self.flat, self.layout), pairs, strict=True):
            view.copy_(t.reshape(view.shape))
        if ipc:
            from torch.multiprocessing.reductions import reduce_tensor

            torch.cuda.current_stream().synchronize()
            return reduce_tensor(self.flat)
        return None

    def release(self) -> None:
        self.flat = None


# ---- the worker side ----------------------------------------------------------------------------


def worker_join(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Join the weight group as ``spec['rank']`` (a rollout worker's process)."""
    _RECEIVER["group"] = make_group(spec["backend"], spec["host"], spec["port"], spec["rank"], spec["world"])
    _RECEIVER["backend"] = spec["backend"]
    return {"pid": os.getpid(), "device_uuid": device_uuid()}


def worker_receive(local: Any, layout: list[tuple[str, tuple[int, ...]]], dtype: str, version: int) -> dict[str, Any]:
    """Receive the broadcast flat buffer and load it into ``local``'s engine with ``version``."""
    t0 = time.perf_counter()
    device = torch.device("cuda", 0) if _RECEIVER["backend"] == "nccl" else torch.device("cpu")
    total = sum(_numel(s) for _, s in layout)
    flat = torch.empty(total, dtype=getattr(torch, dtype), device=device)
    broadcast(_RECEIVER["group"], flat)
    pairs = views(flat, layout)
    local.set_weights(pairs, version)
    return {"seconds": time.perf_counter() - t0, "checksum": checksum(pairs), "bytes": flat.numel() * flat.element_size()}


def worker_load_shared(local: Any, handle: Any, layout: list[tuple[str, tuple[int, ...]]], version: int) -> dict[str, Any]:
    """Map learner rank 0's buffer on this GPU (CUDA IPC) and copy it into the engine in place."""
    t0 = time.perf_counter()
    rebuild, args = handle
    flat = rebuild(*args)
    pairs = views(flat, layout)
    local.set_weights(pairs, version)
    torch.cuda.current_stream().synchronize()
    out = {"seconds": time.perf_counter() - t0, "checksum": checksum(pairs), "bytes": flat.numel() * flat.element_size()}
    del pairs, flat  # the learner frees its buffer after every worker returned
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ---- the driver side ----------------------------------------------------------------------------


class CollectiveSync:
    """Driver-side coordinator of the collective weight sync of one :class:`RayLearnerGroup`.

    Args:
        group: the learner group (its rank-0 actor stages and broadcasts).
    """

    def __init__(self, group: Any):
        self.group = group
        self.members: dict[int, int] = {}  # worker index -> pid in the current weight group
        self.ipc: set[int] = set()  # workers on learner rank 0's GPU
        self.stats: dict[int, dict[str, Any]] = {}

    def deliver(self, workers: Mapping[int, Any], pids: Mapping[int, int], dtype: torch.dtype, version: int) -> float:
        """Send the weights to ``workers`` (index -> actor handle) and set ``version``; returns seconds.
        ``pids`` (index -> worker process id) tells a restarted worker from its dead incarnation."""
        ray = import_ray()
        t0 = time.perf_counter()
        if dict(pids) != self.members:
            self._form(workers, pids)
        name = str(dtype).removeprefix("torch.")
        handle, layout = self.group._all("stage_weights", name, bool(self.ipc))[0]
        calls = []
        far = [i for i in workers if i not in self.ipc]
        if far:
            calls.append(self.group.actors[0].broadcast_staged.remote())
        for i in far:
            calls.append(workers[i].receive_weights.remote(layout, name, version))
        for i in sorted(self.ipc):
            calls.append(workers[i].load_shared_weights.remote(handle, layout, version))
        results = ray.get(calls)
        worker_results = results[1:] if far else results
        self.stats = dict(zip([*far, *sorted(self.ipc)], worker_results, strict=True))
        self.group._all("release_staged")
        return time.perf_counter() - t0

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
            spec = {"backend": backend, "host": host, "port": port, "world": 1 + len(far)}
            calls = [rank0.join_weight_group.remote({**spec, "rank": 0})]
            calls += [workers[i].join_weight_group.remote({**spec, "rank": 1 + k}) for k, i in enumerate(far)]
            ray.get(calls)
        self.members = dict(pids)


class CollectiveWeights:
    """What ``RayLearnerGroup.export_weights`` returns under ``weight_sync: collective``: a Ray rollout
    calls :meth:`deliver`; anything else iterates it (the weights through the object store)."""

    def __init__(self, group: Any, dtype: torch.dtype | None, version: int):
        self.group, self.dtype, self.version = group, dtype, version
        self._ref: Any = None

    def deliver(self, workers: Mapping[int, Any], pids: Mapping[int, int], version: int) -> float:
        return self.group.collective.deliver(workers, pids, self.dtype or torch.float32, version)

    @property
    def object_ref(self) -> Any:
        """The weights put into the object store by rank 0 (made on first use: a restarted worker)."""
        if self._ref is None:
            self._ref = self.group.export_object_ref(self.dtype)
        return self._ref

    def __iter__(self) -> Any:
        yield from import_ray().get(self.object_ref).items()
