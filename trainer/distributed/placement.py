"""Where the roles of a Ray run go (``trainer.ray.placement``).

* ``disaggregated`` (default): each learner and each rollout worker reserves its own resources
  (``learner_num_cpus/gpus``, ``worker_num_cpus/gpus``) and Ray places them. On GPUs: learners and
  engines on separate GPUs — no memory shared, generation and training can overlap (a pipelined run),
  weights cross GPUs by a NCCL broadcast.
* ``colocated``: learner rank i and rollout worker i share bundle i of one placement group (a bundle
  holds both roles' CPUs and, on GPUs, one GPU split by the two fractions, e.g. 0.5 / 0.5): half the
  GPUs for the same replicas, weights move in place on the GPU (CUDA IPC), but the policy, its
  optimizer state and the engine's weights and KV cache share one GPU's memory, and a synchronous
  step runs generation and training one after the other on it.

    opts = placement_options(cfg)       # .learners[i] / .workers[j]: extra actor .options(...)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from chatgym.trainer.distributed import import_ray


@dataclass
class Placement:
    """Extra ``.options(...)`` per learner rank and per rollout worker (None: Ray places them)."""

    learners: list[dict[str, Any]] | None = None
    workers: list[dict[str, Any]] | None = None
    group: Any = None
    bundles: list[dict[str, float]] = field(default_factory=list)


_CACHE: dict[int, tuple[Any, Placement]] = {}


def placement_options(cfg: Any) -> Placement:
    """The placement of ``cfg.trainer.ray`` (one placement group per config object, made once).

    Raises:
        ValueError: ``colocated`` with GPU fractions that do not fit one GPU (names the fields).
        TimeoutError: the cluster cannot hold the placement group (60 s).
    """
    rc = cfg.trainer.ray
    if rc.placement != "colocated":
        return Placement()
    key = id(cfg)
    if key in _CACHE and _CACHE[key][0] is cfg:
        return _CACHE[key][1]
    gpus = rc.learner_num_gpus + rc.worker_num_gpus
    if gpus > 1:
        raise ValueError(
            "trainer.ray.placement: colocated puts a learner and a rollout worker on one GPU; "
            f"learner_num_gpus + worker_num_gpus must be <= 1, got {rc.learner_num_gpus} + {rc.worker_num_gpus}"
        )
    ray = import_ray()
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    n = max(rc.num_learners, rc.num_rollout_workers)
    bundle = {"CPU": float(rc.learner_num_cpus + rc.worker_num_cpus)}
    if gpus > 0:
        bundle["GPU"] = float(math.ceil(gpus))
    bundles = [dict(bundle) for _ in range(n)]
    group = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=60)
    if not ready:
        ray.util.remove_placement_group(group)
        raise TimeoutError(f"trainer.ray.placement: colocated needs {n} bundles of {bundle}; the cluster has no room")

    def at(i: int) -> dict[str, Any]:
        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=i % n
            )
        }

    out = Placement(
        learners=[at(r) for r in range(rc.num_learners)],
        workers=[at(w) for w in range(rc.num_rollout_workers)],
        group=group,
        bundles=bundles,
    )
    _CACHE[key] = (cfg, out)
    return out
