"""The envs of an evaluation: the ids (``all`` expanded), and each env's identity and ``gym.make``
keywords, every env built once before anything runs or is stored."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

from chatgym.trainer.config.loader import ConfigError
from chatgym.trainer.eval.config import EvalConfig
from chatgym.trainer.eval.identity import EnvId, canonical_json, dataset_hash, env_version
from chatgym.trainer.rollout.env_runner import EnvBuildError, build_env


def resolve_env_ids(names: Sequence[str]) -> list[str]:
    """``["all"]`` -> every id of ``ENV_SPECS`` (envs added later included); others checked against the
    Gymnasium registry.

    Raises:
        ValueError: an unknown id (named).
    """
    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.envs.registration import ENV_SPECS

    out: list[str] = []
    for name in names:
        ids = list(ENV_SPECS) if name == "all" else [name]
        for env_id in ids:
            if env_id not in gym.registry:
                raise ValueError(f"unknown env id {env_id!r}; registered chatgym envs: {sorted(ENV_SPECS)}")
            if env_id not in out:
                out.append(env_id)
    return out


def make_eval_env(env_id: str, split: str, env_kwargs: Mapping[str, Any]) -> tuple[gym.Env, dict[str, Any]]:
    """The env and the ``gym.make`` keywords that build it for ``split`` (``auto``: ``test`` where the
    env accepts it, else the env's default split).

    Raises:
        EnvBuildError: the env cannot be built with an explicit split or with these keywords.
    """
    kwargs = dict(env_kwargs)
    if split != "auto":
        return build_env(env_id, {**kwargs, "split": split}), {**kwargs, "split": split}
    try:
        return build_env(env_id, {**kwargs, "split": "test"}), {**kwargs, "split": "test"}
    except EnvBuildError as exc:
        if not isinstance(exc.__cause__, (TypeError, ValueError)):  # no "test" split: the default one
            raise
        return build_env(env_id, kwargs), kwargs


def env_identity(env_id: str, split: str, env_kwargs: Mapping[str, Any]) -> tuple[EnvId, dict[str, Any]]:
    """The env's identity and its ``gym.make`` keywords.

    Raises:
        NotImplementedError: the env has no task list (nothing to enumerate).
    """
    env, kwargs = make_eval_env(env_id, split, env_kwargs)
    try:
        core = env.unwrapped
        tasks = core.tasks
        used_split = str(getattr(core, "split", kwargs.get("split", "default")))
    finally:
        env.close()
    extra = {k: v for k, v in kwargs.items() if k != "split"}
    ident = EnvId(
        env_id, env_version(env_id), dataset_hash(tasks), used_split, canonical_json(extra), len(tasks)
    )
    return ident, kwargs


def build_envs(config: EvalConfig, env_ids: Sequence[str]) -> dict[str, tuple[EnvId, dict[str, Any]] | str]:
    """Each env's identity and ``gym.make`` keywords (:func:`env_identity`), every env built once
    before anything runs or is stored. An env named in ``config.envs`` that cannot be built refuses
    the whole evaluation: evaluating the others would store a partial grid as if it were the
    requested one. An env that only ``all`` brought in gets the reason instead (skipped: ``all``
    means every env that builds with these arguments, e.g. ``--split train`` where an env has no
    train split), unless none builds.

    Raises:
        ConfigError: ``<fields>: <env id>: cannot build the env: <error>``; the fields are ``split``
            and/or ``env_kwargs`` (whichever fails alone), else ``envs``.
    """
    built: dict[str, tuple[EnvId, dict[str, Any]] | str] = {}
    for env_id in env_ids:
        try:
            built[env_id] = env_identity(env_id, config.split, config.env_kwargs)
        except Exception as exc:
            reason = str(exc if isinstance(exc, EnvBuildError) else EnvBuildError(exc))
            if env_id in config.envs:
                raise ConfigError(f"{_blame(config, env_id)}: {env_id}: {reason}") from None
            built[env_id] = reason
    if built and all(isinstance(b, str) for b in built.values()):
        env_id, reason = next(iter(built.items()))
        raise ConfigError(
            f"{_blame(config, env_id)}: none of the {len(built)} envs of 'all' can be built; {env_id}: {reason}"
        )
    return built


def leave_out_image_envs(
    config: EvalConfig, built: dict[str, tuple[EnvId, dict[str, Any]] | str], blind: str | None
) -> None:
    """For a policy that reads no images (``blind``: why, e.g. a token engine whose model has no image
    processor; None: it reads them), the envs whose observations carry images
    (``ChatEnv.image_observations``): those named in ``config.envs`` refuse the evaluation, since
    every episode would fail on its first observation; one that only ``all`` brought in gets the
    reason in ``built`` (skipped), as an env that cannot be built does.

    Raises:
        ConfigError: ``envs: <env id>: its observations carry images and <blind>: ...`` (several
            ids: ``their observations``).
    """
    if blind is None:
        return
    from chatgym.envs.registration import image_env_refusal

    reasons = {e: r for e, b in built.items() if not isinstance(b, str) and (r := image_env_refusal(e, blind))}
    named = [env_id for env_id in reasons if env_id in config.envs]
    if named:  # every such env named at once: the user fixes the command in one go
        reason = reasons[named[0]] if len(named) == 1 else image_env_refusal(named[0], blind, whose="their")
        them = "the env" if len(named) == 1 else "them"
        raise ConfigError(f"envs: {', '.join(named)}: {reason}: give a policy that reads images, or leave {them} out")
    built.update(reasons)


def _blame(config: EvalConfig, env_id: str) -> str:
    """The config field(s) that make ``env_id`` fail to build: ``split`` and/or ``env_kwargs``,
    whichever fails alone; ``envs`` when the env does not build even with its defaults."""

    def builds(split: str, kwargs: Mapping[str, Any]) -> bool:
        try:
            make_eval_env(env_id, split, kwargs)[0].close()
        except Exception:
            return False
        return True

    if not builds("auto", {}):
        return "envs"
    alone = [("split", config.split, {}), ("env_kwargs", "auto", config.env_kwargs)]
    given = [(field, split, kwargs) for field, split, kwargs in alone if split != "auto" or kwargs]
    failing = [field for field, split, kwargs in given if not builds(split, kwargs)]
    return " and ".join(failing) or "env_kwargs"
