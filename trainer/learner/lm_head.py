"""The model side of the chunked logprob head (``model.logprob_chunk_tokens``): a causal LM's final
hidden states from its usual forward, its lm head, and the check, at learner build, that the two
give the model's logits.

The logprobs themselves are :func:`chatgym.trainer.learner.logprobs.chunked_token_logprobs` (pure, on
tensors); the forwards that use these are in :mod:`chatgym.trainer.learner.forward`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from chatgym.trainer.learner.logprobs import chunked_token_logprobs, head_token_logprobs

# ``logits_to_keep`` as an index tensor of no position: the model runs its whole body and its lm head
# over zero positions, (B, 0, V) logits, so no logits exist. (An int 0 would mean "every position".)
NO_POSITIONS = torch.empty(0, dtype=torch.long)


def final_hidden_states(model: Any, **inputs: Any) -> torch.Tensor:
    """(B, T, H) final hidden states (after the last norm: what the lm head reads) of a forward
    ``model(**inputs)`` that computes no logits.

    The whole model is called, not its decoder alone, so every wrapper runs as in the plain forward:
    peft's (LoRA on the body; the reference's ``disable_adapter()``), and FSDP2's hooks on the root
    module, which gather the embedding, final norm and lm head it owns (and, on the root, keep them
    gathered after the forward, so :func:`output_head`'s weight read afterwards is whole). The
    decoder's output is taken by a forward hook on ``model.get_decoder()``.

    Raises:
        RuntimeError: the decoder did not run exactly once in the forward (a model this does not
            understand; the learner refuses such a model at build, :func:`chunked_head_refusal`).
    """
    with _decoder_outputs(model) as captured:
        model(**inputs, logits_to_keep=NO_POSITIONS.to(_device(model)))
    if len(captured) != 1:
        raise RuntimeError(f"the decoder ran {len(captured)} times in one forward; expected once")
    return captured[0]


@contextlib.contextmanager
def _decoder_outputs(model: Any) -> Iterator[list[torch.Tensor]]:
    """A list that receives the output hidden states of each run of ``model.get_decoder()`` inside
    the block (a forward hook, removed after)."""
    captured: list[torch.Tensor] = []

    def grab(module: Any, args: Any, output: Any) -> None:
        captured.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

    handle = model.get_decoder().register_forward_hook(grab)
    try:
        yield captured
    finally:
        handle.remove()


def output_head(model: Any) -> torch.nn.Linear:
    """The model's lm head (``get_output_embeddings()``), whose ``weight`` (V, H) and ``bias`` the
    chunked head multiplies by. Read its weight *after* the forward: under FSDP2 it is whole only then."""
    return model.get_output_embeddings()


def padded_head_logprobs(
    model: Any,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    chunk_tokens: int,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs``' (B, T) output from (B, K, H) final hidden states of the last K positions of
    ``input_ids``, through ``model``'s lm head in chunks
    (:func:`~chatgym.trainer.learner.logprobs.head_token_logprobs`). Call it after the forward that
    made ``hidden`` (:func:`output_head`)."""
    head = output_head(model)
    return head_token_logprobs(
        hidden,
        input_ids,
        head.weight,
        head.bias,
        chunk_tokens=chunk_tokens,
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
    )


def packed_head_logprobs(
    model: Any,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(K,) logprobs (and entropies) of ``targets`` (K,) from (K, H) final hidden states, through
    ``model``'s lm head in chunks (:func:`~chatgym.trainer.learner.logprobs.chunked_token_logprobs`).
    Call it after the forward that made ``hidden`` (:func:`output_head`)."""
    head = output_head(model)
    return chunked_token_logprobs(
        hidden,
        head.weight,
        head.bias,
        targets,
        chunk_tokens=chunk_tokens,
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
    )


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _architecture(model: Any) -> str:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return type(base).__name__


# Config fields of models whose logits are not lm_head(hidden): the fused path would skip the step.
_LOGIT_TRANSFORMS = {
    "final_logit_softcapping": "caps its logits with tanh",  # Gemma 2 / 3
    "logit_scale": "scales its logits",  # Cohere (Command-R)
}


def chunked_head_refusal(model: Any) -> str | None:
    """Why ``model.logprob_chunk_tokens`` would compute wrong logprobs for ``model`` (one line naming
    the setting), or None when the chunked head computes its logits.

    Checked, in order: a config (or a VLM's ``text_config``) that transforms the logits after the lm
    head (``final_logit_softcapping``: Gemma 2/3; ``logit_scale``: Cohere); an output embedding that
    is not a plain ``torch.nn.Linear`` (e.g. peft LoRA on ``lm_head``: the chunked head would multiply
    by the base weight alone and drop the adapter); and a probe: one no-gradient forward of 4 tokens
    whose logits must equal ``F.linear(final hidden states, weight, bias)`` (catches any other
    rescaling, e.g. Granite's ``logits_scaling``, and a decoder ``get_decoder()`` does not find).
    The probe leaves the RNG state as it found it. A value head (``model.value_head``) is no reason:
    the critic is a separate model whose forward does not use this path.
    """
    arch = _architecture(model)
    configs = [model.config, getattr(model.config, "text_config", None)]
    for config in configs:
        for field, what in _LOGIT_TRANSFORMS.items():
            value = getattr(config, field, None)
            if value is not None:
                return (
                    f"model.logprob_chunk_tokens: {arch} {what} after the lm head ({field}={value}), "
                    "which the chunked head does not do; leave it unset for this model"
                )
    head = output_head(model)
    if type(head) is not torch.nn.Linear:
        kind = f"{type(head).__module__}.{type(head).__qualname__}"
        return (
            f"model.logprob_chunk_tokens: the output embedding of {arch} is a {kind}, not a plain "
            "torch.nn.Linear (LoRA on lm_head?); the chunked head multiplies by its weight alone"
        )
    return _probe_refusal(model, arch)


@torch.no_grad()
def _probe_refusal(model: Any, arch: str) -> str | None:
    device = _device(model)
    ids = torch.tensor([[1, 2, 3, 4]], device=device)
    # fork_rng: a dropout layer's draws here must not shift the run's random stream.
    with (
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
        _decoder_outputs(model) as captured,
    ):
        logits = model(input_ids=ids, use_cache=False).logits
    if len(captured) != 1:
        return (
            f"model.logprob_chunk_tokens: {arch}'s decoder (get_decoder()) ran {len(captured)} times in a "
            "forward, not once; the chunked head cannot find its final hidden states"
        )
    head = output_head(model)
    fused = torch.nn.functional.linear(captured[0], head.weight, head.bias)
    # The same product on the same tensor: any difference beyond rounding is a step after the head.
    if fused.shape != logits.shape or not torch.allclose(fused.float(), logits.float(), rtol=1e-3, atol=1e-4):
        return (
            f"model.logprob_chunk_tokens: {arch}'s logits are not its lm head applied to its decoder's "
            "output (a probe forward differs); leave it unset for this model"
        )
    return None
