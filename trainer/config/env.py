"""The ``env`` section of a run config: the environment, its keywords and task splits, and the check
:func:`~chatgym.trainer.config.run.load_config` makes of it (the id is registered).

Split from :mod:`chatgym.trainer.config.run` to keep that module small; ``Config.env`` holds it.
``chatgym train`` also builds the env at start-up with :meth:`EnvConfig.make_kwargs`
(:func:`chatgym.trainer.train_cli.check_env`), as the Trainer builds its episodes' envs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from chatgym.trainer.config.loader import ConfigError, check_env_seed


@dataclass(frozen=True)
class EnvConfig:
    """The environment and its task splits.

    Attributes:
        id: a registered Gymnasium env id (``Math-v0``, ``CodeSandbox-v0``, ...).
        kwargs: keyword arguments of ``gym.make`` (both splits). A ``seed`` among them (the task
            generator's: Math-v0, Search-v0, the visual envs) must be an int in [0, 2**32 - 1], as
            ``train.seed``, checked at load (a negative one would repeat other seeds' tasks in Math-v0,
            whose generator seeds by its absolute value, and fail in Search-v0 as its tasks are read).
        train_split, eval_split: the env's split names for training and held-out evaluation.
        eval_tasks: held-out tasks evaluated before and after training (0: no evaluation).
        eval_every: also evaluate every N steps (0: only before and after).
        eval_temperature: sampling temperature of evaluation (0: greedy; >= 0 and finite, checked at load).
    """

    id: str = "Math-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    eval_split: str = "test"
    eval_tasks: int = 64
    eval_every: int = 0
    eval_temperature: float = 0.0

    def __post_init__(self) -> None:
        for name in ("eval_tasks", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"env.{name} must be >= 0, got {getattr(self, name)}")
        if "split" in self.kwargs:
            raise ValueError("env.kwargs must not set 'split'; use env.train_split / env.eval_split")
        check_env_seed(self.kwargs, "env.kwargs.seed")
        # as rollout.temperature is checked at load (a bad one failed at the first evaluation, after
        # the models loaded)
        if not 0.0 <= self.eval_temperature < math.inf:
            raise ValueError(f"env.eval_temperature must be >= 0 and finite, got {self.eval_temperature}")

    def make_kwargs(self, *, eval: bool) -> dict[str, Any]:
        """The ``gym.make`` keywords of the training (``eval``: held-out) episodes: the split and ``kwargs``."""
        return {"split": self.eval_split if eval else self.train_split, **self.kwargs}


def check_env_id(env: EnvConfig) -> None:
    """Fail at load, before minutes of engine start-up, when ``env.id`` is not a registered Gymnasium
    id (run by :func:`~chatgym.trainer.config.run.load_config`; not in ``EnvConfig.__post_init__``, so building a config never
    reads the registry).

    Raises:
        ConfigError: ``env.id: unknown env ...`` with the chatgym env ids.
    """
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers the env ids)

    if env.id not in gym.registry:
        from chatgym.envs.registration import ENV_SPECS

        known = ", ".join(sorted(ENV_SPECS))
        raise ConfigError(f"env.id: unknown env {env.id!r}; chatgym envs: {known}")


def count_tasks(env: EnvConfig, split: str) -> int:
    """How many tasks the split ``split`` of ``env`` (its id and kwargs) holds."""
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers the env ids)

    made = gym.make(env.id, split=split, **env.kwargs)
    try:
        return len(made.unwrapped.tasks)
    finally:
        made.close()
