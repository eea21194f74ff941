"""Entropy of the policy's next-token distribution, from logits, finite even with −inf/+inf logits."""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of ``softmax(logits)`` over the last dimension.

    ``H = logsumexp(z) − Σ softmax(z)·z`` with ``z = logits − max(logits)`` (max detached; H is
    shift-invariant). The textbook ``−Σ p log p`` gives ``0 · (−inf) = NaN`` for a masked-out
    vocabulary entry (logit −inf); here such entries contribute exactly 0, in the forward *and* the
    backward pass. Examples: [0, −inf] → 0; [0, 0, −inf] → ln 2; [0, 0, 0, 0] → ln 4.

    Edge cases: a row whose logits are all −inf has no distribution and gets entropy 0; +inf logits
    are read as "certain": the distribution is uniform over the +inf entries (one +inf → 0).
    Half-precision logits are upcast to float32 (softmax in bf16 loses too much).

    Args:
        logits: (..., V) float.

    Returns:
        (...) float32 (or float64 for float64 logits), differentiable w.r.t. ``logits``.

    Source: the definition (Shannon 1948); same formula as verl ``entropy_from_logits``.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError("logits must be a floating-point torch.Tensor")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(
            f"logits must have a non-empty last (vocabulary) dimension, got {tuple(logits.shape)}"
        )
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    zero = torch.zeros((), dtype=logits.dtype, device=logits.device)
    pos = torch.isposinf(logits)
    has_pos = pos.any(dim=-1, keepdim=True)
    logits = torch.where(has_pos, torch.where(pos, zero, neg_inf), logits)
    alive = logits > float("-inf")
    has_alive = alive.any(dim=-1, keepdim=True)
    # Rows with nothing alive become all-zero (uniform) so softmax is defined; their H is zeroed below.
    logits = torch.where(has_alive, logits, zero)
    alive = alive | ~has_alive
    z = logits - logits.amax(dim=-1, keepdim=True).detach()
    p = torch.softmax(z, dim=-1)
    # Replace −inf by 0 *before* the product so the backward pass never sees 0 · (−inf).
    z_safe = torch.where(alive, z, zero)
    entropy = torch.logsumexp(z, dim=-1) - (p * z_safe).sum(dim=-1)
    return torch.where(has_alive.squeeze(-1), entropy, zero)
