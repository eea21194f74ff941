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


GREEDY_BELOW = 1e-5  # temperatures below this take the argmax (SamplingParams.greedy)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request.

    Attributes:
        max_tokens: most new tokens to generate (per turn), > 0.
        temperature: 0 means greedy, and so does any below :data:`GREEDY_BELOW` (vLLM's
            ``_SAMPLING_EPS``: logits over a tiny temperature overflow float32 to inf, and a draw from
            them is the argmax anyway).
        top_p, top_k: nucleus / top-k filtering (top_k = -1 disables it).
        stop_token_ids: generation ends after any of these ids (they are kept in ``token_ids``);
            the model's EOS ids are added by the engine. Ints >= 0 (``ValueError`` otherwise); an
            engine that knows its vocabulary refuses ids past it in ``generate``.
        stop: stop strings (vLLM/SGLang/OpenAI ``stop``): generation ends after the first token whose
            addition makes the decoded completion (``skip_special_tokens=False``) contain one of them.
            That whole token is kept, so the stop string's sampled ids stay in ``token_ids`` exactly as
            sampled (logprobs aligned), and a token that completes the match and carries more text
            (a ``">"``-plus-newline token after ``"</search"``) is kept whole: vLLM's
            ``include_stop_str_in_output`` behaviour. Only the completion's text is searched, never
            the prompt. A ``str`` is read as one stop string. See ``common.StopStringChecker``.
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
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        """Whether the engine takes the argmax (``temperature`` below :data:`GREEDY_BELOW`)."""
        return self.temperature < GREEDY_BELOW

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        bad = [s for s in stop if not isinstance(s, str) or not s]
        if bad:
            raise ValueError(f"SamplingParams.stop must hold non-empty strings, got {bad[:3]!r}")
        object.__setattr__(self, "stop", stop)  # frozen: a list given by the caller becomes a tuple
        if self.max_tokens <= 0:
            raise ValueError(f"SamplingParams.max_tokens must be > 0, got {self.max_tokens}")
        if not 0 <= self.temperature < float("inf"):  # nan fails it too: logits / nan samples nothing
            raise ValueError(f"SamplingParams.temperature must be >= 0 and finite, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        bad_ids = [i for i in self.stop_token_ids if isinstance(i, bool) or not isinstance(i, int) or i < 0]
        if bad_ids:
            raise ValueError(f"SamplingParams.stop_token_ids must be token ids (ints >= 0), got {bad_ids[:5]!r}")


@dataclass
class Completion:
    """One generated continuation.

    Attributes:
        token_ids: generated ids, exactly as sampled (``list[int]``, length n).
        logprobs: log-probability of each sampled id under the engine's model (``list[float]``,
            length n, aligned 1:1 with ``token_ids``); empty when not requested.
        finish_reason: ``stop`` (an EOS/stop id was sampled — judged on the completion's ids only —
            or a stop string was completed), ``length`` (hit ``max_tokens``), ``abort`` (cancelled /
            engine error).
        text: the decoded ids (for display and parsing only; never re-encoded). The final EOS/stop id
            of a ``stop`` completion is left out; a stop string is kept (it is content).
        stop_reason: what ended a ``stop`` completion: the stop string (``str``) that matched, or the
            EOS/stop id (``int``) sampled last; ``None`` for ``length``/``abort`` (vLLM's
            ``CompletionOutput.stop_reason``, except that an EOS id is named too).
        weight_versions: the policy weight version that sampled each token (``list[int]``, length n),
            for an engine whose weights can change during one generation; None: the whole completion
            was sampled with the engine's ``weight_version`` at the call.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    text: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    stop_reason: int | str | None = None
    weight_versions: list[int] | None = None


@runtime_checkable
class Engine(Protocol):
    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, images: Any = ()) -> Completion:
        """``images``: a vision-language model's prompt images (PIL), in the order of their placeholder
        runs in ``prompt_ids``; the collector passes it only when there are images, and an engine that
        cannot place images raises ``ValueError`` for any."""
        ...

    def update_weights(self, weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None: ...

    async def close(self) -> None: ...
