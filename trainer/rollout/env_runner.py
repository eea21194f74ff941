"""Run any Gymnasium env from asyncio: async envs natively, sync envs in a thread pool.

An env is driven through its async API (``areset``/``astep``/``aclose``, the ChatEnv contract) when
it has one and nothing in between would be skipped (:func:`chatgym.envs.async_env.async_core`): the
wrappers ``gym.make`` adds that only check call order are looked through, and a wrapper with its own
async API (``GenRMEnv``) is driven through it. A ChatEnv subclass that overrides only the sync
``step`` is a CPU-bound env and runs in the pool, as does any env behind other wrappers (their
``step`` must run).

A sync call that outlives its episode's timeout cannot be interrupted (Python threads cannot be
killed): its thread stays busy until the call returns, and the pool has that many fewer workers.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import gymnasium as gym

from chatgym.envs.async_env import async_core

__all__ = ["EnvBuildError", "EnvRunner", "EnvSource", "async_core", "build_env", "env_name", "make_env"]

# What an episode is made from: a registered id (``gym.make``) or a factory (not Gymnasium's EnvSpec).
EnvSource = str | Callable[[], gym.Env]


def make_env(spec: EnvSource, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """``gym.make(spec, **env_kwargs)`` for an id, ``spec()`` for a factory.

    Raises:
        TypeError: if ``spec`` is neither, or the factory returns something that is not a ``gym.Env``.
    """
    if isinstance(spec, str):
        return gym.make(spec, **(env_kwargs or {}))
    if callable(spec):
        env = spec()
        if not isinstance(env, gym.Env):
            raise TypeError(f"env factory {spec!r} returned {type(env).__name__}, not a gymnasium.Env")
        return env
    raise TypeError(
        f"envs: each entry must be an env id (str) or a factory returning a gym.Env, got {spec!r}"
    )


class EnvBuildError(ValueError):
    """An env that cannot be built from its id and ``gym.make`` keywords (a keyword it does not take,
    a bad value, an unknown id); the message is one line: ``cannot build the env: <error>``."""

    def __init__(self, cause: BaseException):
        super().__init__(f"cannot build the env: {type(cause).__name__}: {cause}")


def build_env(spec: EnvSource, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """:func:`make_env`, any failure raised as :class:`EnvBuildError`: what ``chatgym eval`` and
    ``chatgym rollout`` check once, before any model loads, instead of failing every episode.

    Raises:
        EnvBuildError: the env cannot be built (its cause chained).
    """
    try:
        return make_env(spec, env_kwargs)
    except Exception as exc:
        raise EnvBuildError(exc) from exc


def env_name(spec: EnvSource, env: gym.Env | None) -> str:
    if isinstance(spec, str):
        return spec
    if env is not None and env.spec is not None:
        return env.spec.id
    if env is not None:
        return type(env.unwrapped).__name__
    return getattr(spec, "__name__", repr(spec))


class EnvRunner:
    """One env instance, driven with awaitable ``reset``/``step``/``close``.

    Args:
        env: the env (wrapped or not).
        pool: executor for sync envs' calls.
    """

    def __init__(self, env: gym.Env, pool: Executor):
        self.env = env
        self.pool = pool
        self.core = async_core(env)

    @property
    def is_async(self) -> bool:
        return self.core is not None

    async def _in_pool(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, functools.partial(fn, *args, **kwargs)
        )

    async def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        if self.core is not None:
            return await self.core.areset(seed=seed, options=options)
        return await self._in_pool(self.env.reset, seed=seed, options=options)

    async def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self.core is not None:
            return await self.core.astep(action)
        return await self._in_pool(self.env.step, action)

    async def close(self) -> None:
        # Close on the loop that opened the env's resources (subprocess sessions, connections):
        # an async env's ``aclose`` runs here; ``close`` would run it again on a private loop.
        if self.core is not None and inspect.iscoroutinefunction(getattr(self.core, "aclose", None)):
            await self.core.aclose()
        else:
            await self._in_pool(self.env.close)
