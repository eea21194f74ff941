"""GenRM rewards in a training run: the ``reward:`` section (:class:`~.reward_config.RewardConfig`)
turned into env factories that wrap each episode's env in :class:`chatgym.envs.wrappers.genrm.GenRMEnv`.

The rollout side (``LocalRollout``, built by ``roles.build_local_rollout`` with
:func:`genrm_env_source`) calls :func:`env_source` once per request::

    env, env_kwargs = env_source(genrm, request.env_id, request.env_kwargs)   # genrm None: unchanged
    await collector.collect(env, tasks, G, env_kwargs=env_kwargs, ...)

A Ray rollout worker builds its local part with the same function, so its episodes are judged alike.

The judge is the policy's own engine (``reward.judge: policy``: its requests join the engine's
continuous batch next to the policy's, and it judges with the current weights) or a separate engine
built from ``reward.judge`` (a packaged model name or a directory).

With ``reward.prefill`` the judge (a token engine) is a
:class:`~chatgym.trainer.engines.prefill.PrefillResponder`: its prompt ends with the prefill's ids
after the assistant header and its verdict text is prefill + reply. The judge's tokens (prefill
included) stay in ``info["genrm"]``, never in the policy's trajectory.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from chatgym.envs.wrappers.genrm import GenRMEnv
from chatgym.trainer.config.reward import RewardConfig
from chatgym.trainer.engines.base import SamplingParams
from chatgym.trainer.engines.prefill import PrefillResponder
from chatgym.trainer.rollout.env_runner import EnvSource, make_env


class GenRMReward:
    """The judge of a run and the env factories that use it.

    Args:
        cfg: the ``reward`` section (``model`` must be ``genrm``).
        engine: the policy's engine (the judge when ``cfg.judge == "policy"``).
        tokenizer: the policy's tokenizer.
        engine_cfg: the run's ``engine`` section (a separate judge copies it, with ``judge_backend``
            and ``judge_options``).
        seed: sampling seed of the judge's requests.
        max_model_len: context length (tokens) of a separate judge engine; a judge prompt longer than
            ``max_model_len - cfg.max_tokens`` fails its episode with a message saying so.
        chat_template: the template the policy's prompts use (``rollout.chat_template``); the judge
            renders with it when it is the policy.

    Raises:
        ValueError: ``cfg.model`` is not ``genrm``; ``cfg.prefill`` with a chat (``openai``) judge.
    """

    def __init__(
        self,
        cfg: RewardConfig,
        *,
        engine: Any,
        tokenizer: Any,
        engine_cfg: Any = None,
        seed: int = 0,
        max_model_len: int = 4096,
        chat_template: str | None = None,
    ):
        if cfg.model != "genrm":
            raise ValueError(f"GenRMReward needs reward.model 'genrm', got {cfg.model!r}")
        from chatgym.trainer.engines.responder import as_responder

        self.cfg = cfg
        self.owned_engine = None
        if cfg.judge == "policy":
            judge_engine, judge_tokenizer = engine, tokenizer
        else:
            from chatgym.trainer.chat.tokenizer import get_tokenizer
            from chatgym.trainer.engines import build_engine
            from chatgym.trainer.models.packaged import load_model_path

            path = load_model_path(cfg.judge)
            judge_tokenizer = get_tokenizer(path)
            base = engine_cfg if engine_cfg is not None else _default_engine_cfg()
            judge_cfg = dataclasses.replace(
                base, backend=cfg.judge_backend or base.backend, options=dict(cfg.judge_options)
            )
            judge_engine = self.owned_engine = build_engine(
                judge_cfg, path, judge_tokenizer, seed, max_model_len
            )
            chat_template = None
        params = SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=seed)
        kwargs: dict[str, Any] = {"params": params}
        if chat_template is not None:
            kwargs["chat_template"] = chat_template
        if _is_chat_engine(judge_engine):
            if cfg.prefill:
                raise ValueError(
                    "reward.prefill needs a token engine for the judge; "
                    f"{type(judge_engine).__name__} is a chat engine (no prompt tokens)"
                )
            self.responder = as_responder(judge_engine, judge_tokenizer, **kwargs)
        else:
            # The prefill's ids count against the judge's prompt budget (they are prompt tokens).
            kwargs["max_prompt_tokens"] = max(1, max_model_len - cfg.max_tokens)
            self.responder = PrefillResponder(judge_engine, judge_tokenizer, prefill=cfg.prefill, **kwargs)
        self.template = cfg.template_text()
        self.verdict = cfg.verdict_parser()

    def wrap(self, env: gym.Env) -> GenRMEnv:
        """``env`` scored by this run's judge."""
        cfg = self.cfg
        return GenRMEnv(
            env,
            self.responder,
            template=self.template,
            verdict=self.verdict,
            unparseable_reward=cfg.unparseable_reward,
            env_weight=cfg.env_weight,
            judge_weight=cfg.judge_weight,
            judge_retries=cfg.judge_retries,
        )

    async def aclose(self) -> None:
        """Close the judge's own engine (the policy's is the caller's)."""
        if self.owned_engine is not None:
            await self.owned_engine.close()
            self.owned_engine = None


def _default_engine_cfg() -> Any:
    from chatgym.trainer.config.run import EngineConfig

    return EngineConfig()


def _is_chat_engine(engine: Any) -> bool:
    from chatgym.trainer.engines.openai_chat import OpenAIChatEngine

    return isinstance(engine, OpenAIChatEngine)


def _make_wrapped(genrm: GenRMReward, env_id: str, env_kwargs: dict[str, Any]) -> gym.Env:
    return genrm.wrap(make_env(env_id, env_kwargs))


def env_source(
    genrm: GenRMReward | None, env_id: str, env_kwargs: Mapping[str, Any]
) -> tuple[EnvSource, dict[str, Any] | None]:
    """What to give the collector for ``env_id``: ``(env_id, env_kwargs)`` unchanged without GenRM,
    else a factory making ``GenRMEnv(gym.make(env_id, **env_kwargs))`` (and no kwargs: the factory
    holds them). The episode's ``env_id`` stays ``env_id`` (the wrapper keeps the env's spec)."""
    if genrm is None:
        return env_id, dict(env_kwargs)
    return functools.partial(_make_wrapped, genrm, env_id, dict(env_kwargs)), None


def genrm_env_source(run_cfg: Any, *, engine: Any, tokenizer: Any) -> Any:
    """The rollout side's env hook for a run (``LocalRollout(env_source=...)``): None when
    ``reward.model`` is ``none``, else a :class:`GenRMEnvSource` — ``(env_id, env_kwargs) -> (factory,
    None)`` wrapping each episode's env in the run's judge (built here, once), whose ``aclose``
    closes the judge's own engine (``LocalRollout.aclose`` calls it).

    Args:
        run_cfg: the run's :class:`~chatgym.trainer.config.run.Config`.
        engine: the policy's engine; tokenizer: its tokenizer.
    """
    cfg: RewardConfig = run_cfg.reward
    if cfg.model == "none":
        return None
    genrm = GenRMReward(
        cfg,
        engine=engine,
        tokenizer=tokenizer,
        engine_cfg=run_cfg.engine,
        seed=run_cfg.train.seed,
        max_model_len=run_cfg.rollout.max_model_len,
        chat_template=run_cfg.rollout.chat_template,
    )
    return GenRMEnvSource(genrm)


@dataclasses.dataclass
class GenRMEnvSource:
    """A run's GenRM env hook: calls :func:`env_source` with its judge; ``aclose`` closes the judge's
    own engine (none when the judge is the policy's engine)."""

    genrm: GenRMReward

    def __call__(self, env_id: str, env_kwargs: Mapping[str, Any]) -> tuple[EnvSource, dict[str, Any] | None]:
        return env_source(self.genrm, env_id, env_kwargs)

    async def aclose(self) -> None:
        await self.genrm.aclose()
