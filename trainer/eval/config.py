"""What ``chatgym eval`` runs: the models, envs, samples and budgets of one evaluation (:class:`EvalConfig`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chatgym.trainer.config.loader import check_seed
from chatgym.trainer.engines import TOKEN_ENGINES
from chatgym.trainer.rollout.config import RolloutConfig

REFERENCE = "reference"
LOCAL_WEIGHT_ENGINES = ("vllm", "hf")


@dataclass(frozen=True)
class EvalConfig:
    """Settings of one ``chatgym eval`` (token counts in the model's tokens; seconds).

    Attributes:
        engine: an engine name of :data:`chatgym.trainer.engines.ENGINES` or ``"reference"``.
        model: packaged model name / local directory (vllm, hf) or the served model's name.
        model_name: display name (default: ``model``; ``"reference"`` for the reference policy).
        model_hash: override of the weights hash (server/API engines cannot compute one).
        envs: env ids, or ``("all",)`` for every id in ``chatgym.envs.registration.ENV_SPECS``.
        split: a split name, or ``"auto"``: ``test`` where the env accepts it, else its default split.
        n_samples: samples per task (n of pass@k).
        seed: reset seed of task i is ``seed + i``; sampling seeds derive from it.
        max_tasks: first tasks of the split to use (None: all).
        db: the SQLite results file.
        traces_dir: where JSONL traces go (default: ``traces/`` next to ``db``).
        rollout: the collector's settings (:class:`~chatgym.trainer.rollout.config.RolloutConfig`:
            budgets, sampling, episode timeout, concurrency), the same section as ``chatgym train``'s
            ``rollout``; None: its defaults with temperature 0 (greedy) when ``n_samples == 1``, else
            1.0. Its ``seed`` is always ``seed`` (see :meth:`collector_config`).
        chat_template: ``auto`` | ``model`` | a shipped template name | a ``.jinja`` path (the tokenizer's).
        success_threshold: reward at or above which an episode counts as correct, for envs that
            state no success (``Trajectory.success`` None, e.g. a judged rating).
        retry_failed: run the grid's stored failed episodes (crash, timeout, engine error) again; by
            default a failed episode is a result like any other and is kept.
        env_kwargs, engine_kwargs: extra ``gym.make`` / engine keywords (env keywords are part of the
            env's identity).
        agent: evaluate an agent program (``"module:function"`` / ``"path/file.py:function"``, the
            ``trainer.gateway.agent`` of a training run) instead of the env's own loop: each episode
            is one program run against a gateway in front of the engine (token engines only;
            docs/gateway.md). Part of the grid's identity (``sampling``).
        agent_reward: ``env`` (the session's last reply scored by the env's scorer) or ``program``.
    """

    engine: str = "vllm"
    model: str = "smollm2"
    model_name: str | None = None
    model_hash: str | None = None
    envs: tuple[str, ...] = ("all",)
    split: str = "auto"
    n_samples: int = 1
    seed: int = 0
    max_tasks: int | None = None
    db: str = "runs/eval/results.sqlite"
    traces_dir: str | None = None
    rollout: RolloutConfig | None = None
    chat_template: str = "auto"
    success_threshold: float = 1.0
    retry_failed: bool = False
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    agent: str | None = None
    agent_reward: str = "env"

    def __post_init__(self) -> None:
        if self.agent is not None and (self.engine not in TOKEN_ENGINES or ":" not in self.agent):
            raise ValueError(
                f"agent: a 'module:function' program on a token engine ({', '.join(TOKEN_ENGINES)}), "
                f"got agent {self.agent!r} with engine {self.engine!r}"
            )
        if self.agent_reward not in ("env", "program"):
            raise ValueError(f"agent_reward must be 'env' or 'program', got {self.agent_reward!r}")
        if self.agent is not None:
            from chatgym.trainer.config.gateway import GatewayConfig

            try:
                GatewayConfig(agent=self.agent)  # the same checks as a training run's (file / module exists)
            except ValueError as exc:
                raise ValueError(str(exc).replace("trainer.gateway.agent", "agent")) from None
        from chatgym.trainer.engines import ENGINES

        if self.engine != REFERENCE and self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {[*sorted(ENGINES), REFERENCE]}, got {self.engine!r}")
        if not isinstance(self.n_samples, int) or self.n_samples < 1:
            raise ValueError(f"n_samples must be an int >= 1, got {self.n_samples!r}")
        check_seed("seed", self.seed)  # else gymnasium's reset, or the store's 64-bit column, refuses it mid-run
        if isinstance(self.success_threshold, bool) or not isinstance(self.success_threshold, (int, float)) \
                or not math.isfinite(self.success_threshold):
            raise ValueError(f"success_threshold must be a finite number, got {self.success_threshold!r}")
        if self.max_tasks is not None and self.max_tasks < 1:
            raise ValueError(f"max_tasks must be >= 1, got {self.max_tasks}")
        if not self.envs:
            raise ValueError("envs: give at least one env id (or 'all')")

    def collector_config(self) -> RolloutConfig:
        """The collector's settings of this evaluation: ``rollout`` (or the defaults, greedy for one
        sample per task) with ``seed`` as the sampling seed."""
        if self.rollout is None:
            return RolloutConfig(temperature=0.0 if self.n_samples == 1 else 1.0, seed=self.seed)
        return dataclasses.replace(self.rollout, seed=self.seed)

    def sampling(self) -> dict[str, Any]:
        """The sampling settings stored with every row (empty for the reference policy), and a
        ``success_threshold`` other than 1.0: the rows' success depends on it (envs that state none),
        so another threshold is another grid to run and another leaderboard row."""
        threshold = {} if self.success_threshold == 1.0 else {"success_threshold": self.success_threshold}
        if self.engine == REFERENCE:
            return threshold
        rollout = self.collector_config()
        out: dict[str, Any] = {
            "temperature": rollout.temperature,
            "top_p": rollout.top_p,
            "max_tokens": rollout.max_tokens,
            **threshold,
        }
        if self.engine in TOKEN_ENGINES:
            out.update(
                top_k=rollout.top_k,
                max_response_tokens=rollout.max_response_tokens,
                max_model_len=rollout.max_model_len,
                max_observation_tokens=rollout.max_observation_tokens,
                chat_template=self.chat_template,
            )
        if self.agent is not None:
            out.update(agent=self.agent, agent_reward=self.agent_reward)
        return out
