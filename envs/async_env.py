"""Which object to await for an env's ``areset``/``astep`` (shared by the rollout collector and by
env wrappers such as :class:`chatgym.envs.wrappers.genrm.GenRMEnv` that drive the env they wrap).

An env is driven through its async API (``areset``/``astep``, the ChatEnv contract) when it has one
and nothing in between would be skipped:

* the wrappers ``gym.make`` adds that only check call order (``OrderEnforcing``,
  ``PassiveEnvChecker``) are looked through;
* a wrapper with its own ``async areset``/``astep`` (an *async wrapper*) is itself the object to
  await — it drives what it wraps;
* any other wrapper (its sync ``step`` must run), or a ChatEnv subclass that overrides only the sync
  ``step`` below the async one (a CPU-bound env), makes the env sync: None.
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym

PASSTHROUGH_WRAPPERS = (gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker)


def _defining_index(cls: type, name: str) -> int:
    for i, klass in enumerate(cls.__mro__):
        if name in klass.__dict__:
            return i
    return len(cls.__mro__)


def _has_async_api(obj: Any) -> bool:
    if not (
        inspect.iscoroutinefunction(getattr(obj, "areset", None))
        and inspect.iscoroutinefunction(getattr(obj, "astep", None))
    ):
        return False
    cls = type(obj)
    # A subclass that re-implemented the sync step below the async one is a sync env.
    return _defining_index(cls, "step") >= _defining_index(cls, "astep")


def async_core(env: gym.Env) -> Any | None:
    """The object whose ``areset``/``astep`` may be awaited for ``env``, or None (run it sync); see
    the module docstring for the rules."""
    core: Any = env
    while isinstance(core, gym.Wrapper):
        if _has_async_api(core):
            return core
        if type(core) not in PASSTHROUGH_WRAPPERS:
            return None
        core = core.env
    return core if _has_async_api(core) else None
