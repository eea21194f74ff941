"""The collector's settings: the one type the run config (and the learner) takes from the rollout side."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chatgym.trainer.config.loader import check_seed
from chatgym.trainer.engines.base import SamplingParams


@dataclass(frozen=True)
class RolloutConfig:
    """Settings of the collector (token counts are tokens of the model's tokenizer).

    Attributes:
        max_model_len: context length: most tokens in a trajectory (prompt included); at least 2.
        max_response_tokens: most generated tokens per trajectory (all turns together).
        max_tokens: most generated tokens per turn.
        max_observation_tokens: each observation message's content is cut to this many tokens (an
            env's observations; under the gateway, each tool message an agent sends).
        temperature, top_p, top_k: sampling (temperature 0 = greedy; top_k -1 = off).
        seed: base seed of per-request sampling seeds (None: engine's own randomness).
        episode_timeout_s: wall-clock seconds one episode may take before it is cancelled (None: none).
        max_concurrent_episodes: episodes in flight at once (the rest wait their turn).
        env_threads: worker threads for sync envs.
        eos_token_ids: every EOS id of the model; empty: the engine's, else the tokenizer's and the
            generation config's.
        chat_template: the template overriding the tokenizer's (None: the tokenizer's): Jinja text,
            ``auto``, ``model``, a shipped name (``chatml_tools``, ``qwen3``, ``qwq``) or a ``.jinja`` path.
        chat_template_kwargs: extra template variables passed with every rendering, e.g.
            ``{"enable_thinking": false}`` for Qwen3's non-thinking mode (None: none).
        trace_path: JSONL file that traced trajectories are appended to (None: no trace).
        trace_fraction: share of trajectories traced, in [0, 1].
    """

    max_model_len: int = 4096
    max_response_tokens: int = 2048
    max_tokens: int = 512
    max_observation_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    episode_timeout_s: float | None = 600.0
    max_concurrent_episodes: int = 256
    env_threads: int = 16
    eos_token_ids: tuple[int, ...] = ()
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    trace_path: str | None = None
    trace_fraction: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_model_len, int) or self.max_model_len < 2:
            # The collector (and the gateway) needs room for a prompt token and a generated one; at 1
            # every episode would fail as prompt_too_long.
            raise ValueError(
                "RolloutConfig.max_model_len must be an int >= 2 (a prompt token and a generated one), "
                f"got {self.max_model_len!r}"
            )
        for name in (
            "max_response_tokens",
            "max_tokens",
            "max_observation_tokens",
            "max_concurrent_episodes",
            "env_threads",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"RolloutConfig.{name} must be an int >= 1, got {value!r}")
        if self.episode_timeout_s is not None and not self.episode_timeout_s > 0:
            raise ValueError(
                f"RolloutConfig.episode_timeout_s must be > 0 or None, got {self.episode_timeout_s}"
            )
        check_seed("RolloutConfig.seed", self.seed)  # the engines' and the envs' readers refuse the rest
        if not 0.0 <= self.trace_fraction <= 1.0:
            raise ValueError(f"RolloutConfig.trace_fraction must be in [0, 1], got {self.trace_fraction}")
        if self.chat_template is not None:
            from chatgym.trainer.chat.tokenizer import check_chat_template_setting

            try:
                check_chat_template_setting(self.chat_template)
            except FileNotFoundError as exc:
                raise ValueError(f"RolloutConfig.chat_template: {exc}") from None
        kwargs = self.chat_template_kwargs
        if kwargs is not None and (not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs)):
            raise ValueError(f"RolloutConfig.chat_template_kwargs must be a dict with str keys, got {kwargs!r}")
        # SamplingParams validates temperature/top_p; build one now so a bad value fails here.
        try:
            SamplingParams(max_tokens=1, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        except ValueError as exc:
            raise ValueError(f"RolloutConfig: {exc}") from None
