"""Name -> function registries for the RL algorithms (the verl ``core_algos`` pattern).

Each family (advantage estimators, policy losses, KL estimators, loss aggregation modes) is a plain
dict filled by a decorator, so a config can say ``advantage: grpo`` and a user can add their own
estimator with ``@register_advantage_estimator("mine")`` without touching the trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Any]] = {}
POLICY_LOSSES: dict[str, Callable[..., Any]] = {}
KL_ESTIMATORS: dict[str, Callable[..., Any]] = {}
AGGREGATION_MODES: dict[str, Callable[..., Any]] = {}


def _register(table: dict[str, Callable[..., Any]], kind: str, name: str) -> Callable[[F], F]:
    def decorator(fn: F) -> F:
        if name in table and table[name] is not fn:
            raise ValueError(f"{kind} {name!r} is already registered (by {table[name].__qualname__})")
        table[name] = fn
        return fn

    return decorator


def _lookup(table: dict[str, Callable[..., Any]], kind: str, name: str) -> Callable[..., Any]:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}") from None


def register_advantage_estimator(name: str) -> Callable[[F], F]:
    """Decorator: register ``fn(token_rewards, mask, *, group_ids=None, values=None, **params)``."""
    return _register(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Decorator: register ``fn(logprobs, old_logprobs, advantages, mask, **params) -> PolicyLossOutput``."""
    return _register(POLICY_LOSSES, "policy loss", name)


def register_kl_estimator(name: str) -> Callable[[F], F]:
    """Decorator: register ``fn(logprobs, ref_logprobs) -> per-token KL``."""
    return _register(KL_ESTIMATORS, "KL estimator", name)


def register_aggregation_mode(name: str) -> Callable[[F], F]:
    """Decorator: register ``fn(loss, mask, **params) -> scalar`` as a loss aggregation mode."""
    return _register(AGGREGATION_MODES, "loss aggregation mode", name)


def get_advantage_estimator(name: str) -> Callable[..., Any]:
    """The advantage estimator registered as ``name``; ValueError listing the known names otherwise."""
    return _lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def get_policy_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as ``name``; ValueError listing the known names otherwise."""
    return _lookup(POLICY_LOSSES, "policy loss", name)


def get_kl_estimator(name: str) -> Callable[..., Any]:
    """The KL estimator registered as ``name``; ValueError listing the known names otherwise."""
    return _lookup(KL_ESTIMATORS, "KL estimator", name)


def get_aggregation_mode(name: str) -> Callable[..., Any]:
    """The loss aggregation function registered as ``name``; ValueError listing the known names otherwise."""
    return _lookup(AGGREGATION_MODES, "loss aggregation mode", name)
