"""The engine contract: token ids in, token ids + logprobs out.

Every inference backend (vLLM in-process, a vLLM/SGLang server, transformers) implements
:class:`Engine`. The collector only ever calls ``generate`` with token ids, so what the policy
sampled is kept exactly (never re-tokenized).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request.

    Attributes:
        max_tokens: most new tokens to generate (per turn), > 0.
        temperature: 0 means greedy.
        top_p, top_k: nucleus / top-k filtering (top_k = -1 disables it).
        stop_token_ids: generation ends after any of these ids (they are kept in ``token_ids``);
            the model's EOS ids are added by the engine.
        seed: per-request seed for reproducible sampling, or None.
        logprobs: return the sampled token's logprob for every generated token.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    logprobs: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError(f"SamplingParams.max_tokens must be > 0, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Completion:
    """One generated continuation.

    Attributes:
        token_ids: generated ids, exactly as sampled (``list[int]``, length n).
        logprobs: log-probability of each sampled id under the engine's model (``list[float]``,
            length n, aligned 1:1 with ``token_ids``); empty when not requested.
        finish_reason: ``stop`` (an EOS/stop id was sampled — judged on the completion's ids only),
            ``length`` (hit ``max_tokens``), ``abort`` (cancelled / engine error).
        text: the decoded ids (for display and parsing only; never re-encoded).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    text: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion: ...

    def update_weights(self, weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None: ...

    async def close(self) -> None: ...
