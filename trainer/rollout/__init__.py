"""The rollout side: envs + an engine -> token-exact trajectories.

Holds the collector (:mod:`.collector`: many episodes at once, budgets, failure isolation), its
settings (:mod:`.config`, the only type the run config takes from here), the guarded episode runner
shared with evaluation (:mod:`.episode`), the env runner (:mod:`.env_runner`: async and sync envs
from asyncio), the turn budgets (:mod:`.turn`), the
trajectory types (:mod:`.types`), traces (:mod:`.trace`) and the ``chatgym rollout`` CLI (:mod:`.cli`).

May import: ``chatgym.envs`` (messages, the env contract), ``chatgym.trainer.chat`` (the chat-template
delta, its probe, the tokenizer), ``chatgym.trainer.engines``,
``chatgym.trainer.models`` and the generic config loader ``chatgym.trainer.config.loader`` (the CLI's
``rollout.KEY=VALUE`` overrides). Never the learner (``chatgym.trainer.learner``), the run config or
the training loop: a rollout worker runs without torch training code.

The package exports the collector, its config and result types (``from chatgym.trainer.rollout import
Collector, RolloutConfig``), loaded on first use so that importing :mod:`.config` alone stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Collector": "collector",
    "CollectStats": "collector",
    "EpisodeFailure": "episode",
    "summarize": "collector",
    "RolloutConfig": "config",
    "Trajectory": "types",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
