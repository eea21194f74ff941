"""The ``cotrain:`` section of a co-training config (``chatgym cotrain``), and the party learner's config.

    cotrain:
      party: judge          # judge (Judge-v0) | user (UserSim-v0)
      model_path: smollm2
      lr: 1.0e-6
"""


from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from chatgym.trainer.config.loader import apply_overrides, from_dict, read_config_file
from chatgym.trainer.config.run import Config, ConfigError, check_env_id


@dataclass(frozen=True)
class CoTrainConfig:
    """The ``cotrain:`` section: the second party and how it learns.

    Attributes:
        party: ``judge`` (``Judge-v0``: the env's ``judge=``) or ``user`` (``UserSim-v0``: ``user=``).
        model_path: the party's model (a packaged name such as ``smollm2`` or a local directory).
        lr: the party's learning rate (its own optimizer; the rest of ``optim`` is shared).
        kl_coef: the party's ``algo.kl_coef`` (0: no reference model for it).
        max_tokens: tokens per party reply (also its learner's ``max_response_tokens``).
        temperature: the party's sampling temperature in training (evaluation uses
            ``env.eval_temperature``).
        max_prompt_tokens: a party prompt longer than this is refused (``ValueError`` in the env:
            that episode fails); None: no check.
        max_model_len: the party engine's context length (tokens).
        tasks: train only on these task indices of ``env.train_split`` (None: all).
        prefill: text every party reply starts with, given as prompt tokens (not trained on):
            ``"Rating: [["`` makes a 135M judge write a parseable MT-bench rating (without it
            SmolLM2-135M-Instruct wrote no ``[[r]]`` at all: parse rate 0, nothing to learn from).
        stop: stop strings of the party's replies (the whole token that completes one is kept, as
            vLLM's ``include_stop_str_in_output``): ``["]]"]`` ends a judge's reply at its rating, so
            only the rating's tokens are trained on. Without it a 135M judge wrote ~5 tokens of text
            after ``]]`` in an 8-token budget, each carrying the rating's advantage, and under
            ``token-mean`` aggregation the rating token held about an eighth of the gradient.
        eval_task_ids: evaluate on these task indices of ``env.eval_split`` (the first
            ``env.eval_tasks`` of them); None: its first ``env.eval_tasks`` tasks.
        calibration: judge only. Fractions in [0, 1]: beside the policy's answers, the judge also rates,
            for every task of a step (and of the evaluation), answers of set quality to its first
            question turn: the first fraction of the reference answer's words (1.0: all of it;
            0.0: another question's reference answer), ``train.group_size`` samples each (one at
            ``env.eval_temperature`` in evaluation), trained on with the same reward
            (:func:`~chatgym.trainer.cotrain.calibration.calibration_answer`). A small policy's answers all
            earn about the same reference rating, so with them alone the best constant rating is
            the judge's best policy; these give it answers of every quality. Arithmetic questions
            (``env.kwargs: {questions: arithmetic}``): the policy's own answer with its final answer
            set to the gold (any fraction > 0) or to another question's gold (0.0). Empty (the
            default): none.
        calibration_negative: judge only, arithmetic questions only: the ``0.0`` calibration answer.
            ``"other_gold"`` (the default): the policy's answer with another question's gold as its
            final answer. ``"policy"``: the policy's own answer as written when the rule-based check
            finds it wrong (no final answer included), another question's gold when it is right: the
            judge trains on the policy's actual mistakes (a GPU run's policy learned to write no final
            answer, which twins never show, and its judge rated that 9).
        train_on_answers: judge only: whether the judge also trains on its ratings of the policy's
            answers (the default). ``false``: on the calibration answers alone, which are balanced
            by construction where a weak policy's answers are nearly all wrong (a CPU run's judge,
            trained on both, drifted to rating everything 1); its ratings of the policy's answers
            still reward the policy and are reported (``judge/reward_mean``).
    """

    party: Literal["judge", "user"] = "judge"
    model_path: str = "smollm2"
    lr: float = 1e-6
    kl_coef: float = 0.0
    max_tokens: int = 128
    temperature: float = 1.0
    max_prompt_tokens: int | None = None
    max_model_len: int = 4096
    tasks: tuple[int, ...] | None = None
    prefill: str = ""
    stop: tuple[str, ...] = ()
    eval_task_ids: tuple[int, ...] | None = None
    calibration: tuple[float, ...] = ()
    calibration_negative: Literal["other_gold", "policy"] = "other_gold"
    train_on_answers: bool = True

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.max_tokens < 1 or self.max_model_len < 1:
            raise ValueError("max_tokens and max_model_len must be >= 1")
        if self.tasks is not None and not self.tasks:
            raise ValueError("tasks must be None or non-empty")
        if any(not 0.0 <= f <= 1.0 for f in self.calibration):
            raise ValueError(f"calibration must be fractions in [0, 1], got {list(self.calibration)}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {list(self.stop)}")
        if self.calibration and self.party != "judge":
            raise ValueError(
                f"cotrain.calibration: answers for a judge to rate; party {self.party!r} takes none"
            )
        if self.calibration_negative == "policy" and 0.0 not in self.calibration:
            raise ValueError(
                "cotrain.calibration_negative: policy sets the 0.0 calibration answer; cotrain.calibration"
                f" has none (got {list(self.calibration)})"
            )
        if not self.train_on_answers and not self.calibration:
            raise ValueError(
                "cotrain.train_on_answers: false leaves the party nothing to train on without cotrain.calibration"
            )


def load_cotrain_config(
    path: str | Path | None, overrides: Sequence[str] = ()
) -> tuple[Config, CoTrainConfig]:
    """A co-training YAML: the sections of ``chatgym train``'s config plus ``cotrain:``.

    Overrides may address either (``cotrain.lr=1e-5``, ``train.max_steps=2``).

    Raises:
        ConfigError: as :func:`chatgym.trainer.config.run.load_config`, with the dotted field name.
        FileNotFoundError: ``path`` does not exist.
    """
    data = apply_overrides(read_config_file(path) if path is not None else {}, overrides)
    section = data.pop("cotrain", None) or {}
    if not isinstance(section, dict):
        raise ConfigError("cotrain: must be a mapping")
    config = from_dict(Config, data)
    check_env_id(config.env)
    co = from_dict(CoTrainConfig, section, prefix="cotrain")
    if co.calibration_negative == "policy" and config.env.kwargs.get("questions") != "arithmetic":
        raise ConfigError(
            "cotrain.calibration_negative: policy needs Judge-v0's arithmetic questions"
            " (env.kwargs: {questions: arithmetic}): only they have a rule-based check of the policy's answer"
        )
    return config, co


def party_config(cfg: Config, co: CoTrainConfig) -> Config:
    """The party learner's :class:`Config`: the policy's with the party's model, lr, KL and budget."""
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, path=co.model_path, random_init=cfg.model.random_init),
        optim=dataclasses.replace(cfg.optim, lr=co.lr),
        algo=dataclasses.replace(cfg.algo, kl_coef=co.kl_coef),
        rollout=dataclasses.replace(cfg.rollout, max_response_tokens=co.max_tokens, max_tokens=co.max_tokens),
    )
