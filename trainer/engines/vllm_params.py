"""Our sampling settings as vLLM's, and the sampled tokens' logprobs read back from its outputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatgym.trainer.engines.base import SamplingParams


def to_vllm_params(params: SamplingParams, detokenize: bool = False) -> Any:
    """Our :class:`SamplingParams` as ``vllm.SamplingParams`` (final output only, raw logprobs).

    Stop strings go to vLLM's ``stop`` with ``include_stop_str_in_output=True``: vLLM matches them on
    its incremental detokenization and ends the request on the token that completes one; the ids
    always hold that token (vLLM trims only the text otherwise, and we keep the text too). vLLM needs
    ``detokenize`` for that, so it is on whenever there are stop strings. Logprobs come flat
    (``flat_logprobs``: a few lists a request instead of a dict and a ``Logprob`` a token, which vLLM
    builds at every step and the garbage collector then walks); :func:`sampled_logprobs` reads both forms.
    Each call returns a new object for one request, so vLLM may take it without its deep copy
    (``skip_clone``, as vLLM's OpenAI server marks the parameters it builds a request; 256 deep copies
    took 5.9 ms of a 2-core CPU's time at ``add_request``): never share one between requests.
    """
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=max(params.top_k, 0),  # vLLM: 0 disables top-k (ours: -1)
        stop_token_ids=list(params.stop_token_ids),
        stop=list(params.stop) or None,
        include_stop_str_in_output=True,
        seed=params.seed,
        logprobs=0 if params.logprobs else None,  # 0 = the sampled token's logprob only
        flat_logprobs=bool(params.logprobs),
        # We decode ourselves (common.completion_text), identically for every engine; vLLM detokenizes
        # only to match stop strings, with the same settings as our decode.
        detokenize=detokenize or bool(params.stop),
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
        skip_clone=True,
    )


def sampled_logprobs(token_ids: Sequence[int], logprobs: Any) -> list[float]:
    """The logprob of each sampled token, 1:1 with ``token_ids``.

    Args:
        token_ids: a completion's sampled ids (``CompletionOutput.token_ids``).
        logprobs: its ``CompletionOutput.logprobs``: ``None`` (none asked for), vLLM's ``FlatLogprobs``
            (``flat_logprobs=True``: ``token_ids`` / ``logprobs`` lists, one entry a position when only
            the sampled token's is asked for) or a list of ``{token id: Logprob}`` dicts, one a position.

    Returns:
        ``list[float]`` of ``len(token_ids)`` (empty when ``logprobs`` is ``None``).

    Raises:
        RuntimeError: the positions do not match the ids (a count, or a sampled id without its logprob).
    """
    if logprobs is None:
        return []
    flat_ids = getattr(logprobs, "token_ids", None)
    if flat_ids is not None and len(flat_ids) == len(token_ids) and list(flat_ids) == list(token_ids):
        return list(map(float, logprobs.logprobs))  # one entry a position: the sampled token's
    if len(logprobs) != len(token_ids):
        raise RuntimeError(f"vLLM returned logprobs for {len(logprobs)} positions, {len(token_ids)} ids")
    try:  # more than one entry a position (flat or not): each position's dict by the sampled id
        return [float(step[tid].logprob) for tid, step in zip(token_ids, logprobs, strict=True)]
    except (KeyError, TypeError) as exc:
        raise RuntimeError(f"vLLM returned no logprob for a sampled id: {exc!r}") from exc
