"""The ``trainer:`` section of the run config: where the roles run and how rollout overlaps training.

    trainer:
      backend: ray          # local (default): everything in this process
      pipeline: sync        # sync | one_step_off | async
      max_staleness: 1      # async: how many weight versions old a trained-on group may be
      ray:
        num_rollout_workers: 2

Split from :mod:`chatgym.trainer.config` to keep that module small; ``Config.trainer`` holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class RayConfig:
    """Ray roles (``trainer.backend: ray``).

    Attributes:
        address: a running cluster to join (``ray start --head`` on a head node; also read from
            ``RAY_ADDRESS``); None: start a local cluster bound to 127.0.0.1.
        num_rollout_workers: rollout workers, each an engine replica with its envs and a collector.
        num_learners: data-parallel learner processes.
    """

    address: str | None = None
    num_rollout_workers: int = 1
    num_learners: int = 1

    def __post_init__(self) -> None:
        for name in ("num_rollout_workers", "num_learners"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"trainer.ray.{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class RunnerConfig:
    """How the training loop runs its roles.

    Attributes:
        backend: ``local`` (one process: engine, collector and learner) or ``ray`` (rollout workers and
            learners as Ray actors; see ``trainer.ray``).
        pipeline: ``sync`` (collect, then update, then sync weights), ``one_step_off`` (the rollout of
            step k+1 overlaps the update of step k), ``async`` (finished groups stream into a replay
            buffer; the learner trains as soon as enough are ready).
        max_staleness: ``async``: the most weight versions a trained-on group may lag the learner.
        ray: the Ray roles' settings.
    """

    backend: Literal["local", "ray"] = "local"
    pipeline: Literal["sync", "one_step_off", "async"] = "sync"
    max_staleness: int = 1
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ValueError(f"trainer.max_staleness must be an int >= 0, got {self.max_staleness!r}")
