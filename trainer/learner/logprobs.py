"""Per-token logprobs (and entropies) of a causal LM's own tokens, from its logits.

Alignment: position t of the output describes token t of ``input_ids`` given tokens ``< t``, i.e. it
comes from the logits at position t-1 — the same positions as ``Trajectory.logprobs``. Position 0 has
no prefix and is 0.
"""

from __future__ import annotations

import torch

from chatgym.trainer.algos.entropy import entropy_from_logits


def token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    chunk_rows: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each token under the model that produced ``logits``.

    Args:
        logits: (B, K, V) float (any precision), the logits of the *last* K positions of
            ``input_ids`` (K = T for a full forward; K < T when the model was called with
            ``logits_to_keep=K`` to skip the prompt).
        input_ids: (B, T) long.
        with_entropy: also return the entropy (nats) of each token's predictive distribution.
        entropy_grad: keep the entropy differentiable (an entropy bonus); False computes it as a
            metric only, so no autograd graph over the (B, K, V) softmax is kept alive.
        chunk_rows: rows upcast to float32 at a time (bounds the extra memory to chunk_rows·K·V·4
            bytes).

    Returns:
        ``(logprobs, entropy)``: (B, T) float32, differentiable w.r.t. ``logits``; positions
        ``t < T − K + 1`` (no logits for them) are 0; ``entropy`` is None unless asked for.

    Raises:
        ValueError: mismatched batch sizes or K > T.
    """
    batch, length = input_ids.shape
    if logits.dim() != 3 or logits.shape[0] != batch:
        raise ValueError(f"logits must have shape (B={batch}, K, V), got {tuple(logits.shape)}")
    keep = logits.shape[1]
    if keep > length:
        raise ValueError(f"logits cover {keep} positions but input_ids has only {length}")
    first = length - keep  # the position of logits[:, 0]
    # logits[:, j] (position first + j) predicts token first + j + 1; the last one predicts nothing.
    targets = input_ids[:, first + 1 :]
    lp_parts, ent_parts = [], []
    for start in range(0, batch, chunk_rows):
        rows = logits[start : start + chunk_rows, :-1].float()
        tgt = targets[start : start + chunk_rows].unsqueeze(-1)
        lp_parts.append(rows.gather(-1, tgt).squeeze(-1) - torch.logsumexp(rows, dim=-1))
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent_parts.append(entropy_from_logits(rows))
    pad = (first + 1, 0)
    logprobs = torch.nn.functional.pad(torch.cat(lp_parts), pad)
    entropy = torch.nn.functional.pad(torch.cat(ent_parts), pad) if with_entropy else None
    return logprobs, entropy


def first_trained_position(loss_mask: torch.Tensor) -> int:
    """Smallest position with a nonzero loss mask in any row (T when none), to size ``logits_to_keep``."""
    cols = loss_mask.any(dim=0).nonzero()
    return int(cols[0]) if len(cols) else loss_mask.shape[1]


def logits_to_keep(loss_mask: torch.Tensor) -> int:
    """How many trailing positions' logits a forward pass needs so every trained token gets a logprob.

    Token t needs the logits at t-1, so K = T − first_trained_position + 1 (at least 1, at most T).
    """
    length = loss_mask.shape[1]
    return max(1, min(length, length - first_trained_position(loss_mask) + 1))
