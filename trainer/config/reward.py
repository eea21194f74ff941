"""The ``reward:`` section of the run config: score episodes with an LLM judge (GenRM) on top of, or
instead of, the env's own reward.

    reward:
      model: genrm              # none (default): the env's reward only
      judge: policy             # the policy's own engine; or a model (packaged name / directory)
      template: null            # a prompt file; null: the shipped envs/<family>/prompts/genrm_score.txt
      verdict: score            # score (<score>N</score>, 0..10) | rating ([[N]], 1..10) | ab ([[A]]/[[B]])
      prefill: ""               # text the judge's reply starts with, e.g. "<score>" (given as prompt tokens)
      unparseable_reward: 0.0   # the judge score when no valid verdict came (counted in metrics)
      env_weight: 1.0           # reward = env_weight * env return + judge_weight * judge score
      judge_weight: 1.0

Split from :mod:`chatgym.trainer.config.run` to keep that module small; ``Config.reward`` holds it. The
wrapper that does the scoring is :class:`chatgym.envs.wrappers.genrm.GenRMEnv`; :mod:`chatgym.trainer.rewards.genrm`
builds it from this section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True)
class RewardConfig:
    """How episodes are scored (see the module docstring and :mod:`chatgym.envs.wrappers.genrm`).

    Attributes:
        model: ``none`` (the env's reward only) or ``genrm`` (an LLM judge scores each episode's end).
        judge: ``policy`` (the policy's own engine, current weights: the judge call joins the
            engine's batch) or a model for a separate engine (a packaged name such as ``smollm2`` or a
            Hugging Face directory).
        judge_backend: engine backend of a separate judge (None: ``engine.backend``).
        judge_options: the separate judge's ``engine.options`` (with ``judge_backend``).
        template: path of the judge prompt (placeholders ``{question}``, ``{response}``,
            ``{conversation}``, ``{reference}``); None: the shipped ``genrm_score.txt``.
        verdict: a shipped verdict format: ``score`` (``<score>N</score>``, 0..10), ``rating``
            (``[[N]]``, 1..10, MT-bench) or ``ab`` (``[[A]]`` = 1, ``[[B]]`` = 0).
        pattern, score_range, labels: override the format's regex (one capture group; the last match
            counts), numeric range mapped to [0, 1], and label -> score table.
        prefill: text the judge's reply starts with, given to a token engine as prompt tokens after
            the assistant header (its continuation is sampled); the verdict parser reads ``prefill``
            + the reply. ``"<score>"`` for the ``score`` verdict or ``"[["`` for ``rating`` makes a
            small judge write the verdict first (SmolLM2-135M-Instruct otherwise writes prose with
            no verdict). ``""``: none. Needs a token engine (not ``judge_backend: openai``).
        unparseable_reward: the judge score (before ``judge_weight``) when the verdict cannot be
            parsed after ``judge_retries`` extra samples.
        env_weight, judge_weight: the episode return is ``env_weight * env return + judge_weight *
            judge score``.
        max_tokens, temperature: the judge's sampling (tokens per verdict; 0 = greedy).
    """

    model: Literal["none", "genrm"] = "none"
    judge: str = "policy"
    judge_backend: str | None = None
    judge_options: dict[str, Any] = field(default_factory=dict)
    template: str | None = None
    verdict: str = "score"
    pattern: str | None = None
    score_range: tuple[float, float] | None = None
    labels: dict[str, float] = field(default_factory=dict)
    prefill: str = ""
    unparseable_reward: float = 0.0
    env_weight: float = 1.0
    judge_weight: float = 1.0
    judge_retries: int = 0
    max_tokens: int = 256
    temperature: float = 0.0

    def __post_init__(self) -> None:
        from chatgym.envs.wrappers.genrm import VERDICT_FORMATS, check_template

        if self.verdict not in VERDICT_FORMATS:
            raise ValueError(
                f"reward.verdict: unknown {self.verdict!r}; choose one of {sorted(VERDICT_FORMATS)}"
            )
        try:
            self.verdict_parser()
        except ValueError as exc:  # its messages start with the field's name (pattern, score_range, labels)
            raise ValueError(f"reward.{exc}") from None
        if self.template is not None:
            path = Path(self.template)
            if not path.is_file():
                raise ValueError(f"reward.template: no such file {self.template!r}")
            try:
                check_template(path.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise ValueError(f"reward.template: {self.template}: {exc}") from None
        if self.judge_retries < 0:
            raise ValueError(f"reward.judge_retries must be >= 0, got {self.judge_retries}")
        if self.max_tokens < 1:
            raise ValueError(f"reward.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"reward.temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.prefill, str):
            raise ValueError(f"reward.prefill must be a string, got {self.prefill!r}")
        if self.prefill and self.judge_backend == "openai":
            raise ValueError(
                "reward.prefill needs a token engine for the judge; the openai chat engine has no prompt tokens"
            )
        if not self.judge:
            raise ValueError("reward.judge must be 'policy' or a model name/path, got ''")
        if self.judge_backend is not None:
            from chatgym.trainer.engines import ENGINES

            if self.judge_backend not in ENGINES:
                raise ValueError(
                    f"reward.judge_backend: unknown {self.judge_backend!r}; choose one of {sorted(ENGINES)}"
                )

    def verdict_parser(self) -> Any:
        """The :class:`~chatgym.envs.wrappers.genrm.VerdictParser` of ``verdict`` with this section's overrides.

        Raises:
            ValueError: a bad pattern, range or label score.
        """
        from chatgym.envs.wrappers.genrm import VerdictParser

        return VerdictParser.named(
            self.verdict,
            pattern=self.pattern,
            score_range=tuple(self.score_range) if self.score_range is not None else None,
            labels=dict(self.labels) or None,
        )

    def template_text(self) -> str | None:
        """The template file's text (None: the shipped default)."""
        return None if self.template is None else Path(self.template).read_text(encoding="utf-8")
