"""Loss aggregation: turn a (B, T) per-token loss into the scalar that is back-propagated.

The mode decides how much weight each token gets (Σ over generated tokens only):

- ``token-mean``: ``Σ_{i,t} l / N_tokens`` — every token weighs the same (DAPO's token-level loss);
- ``seq-mean-token-sum``: ``Σ_i (Σ_t l) / N_seq`` — long sequences weigh more;
- ``seq-mean-token-mean``: ``Σ_i (Σ_t l / n_i) / N_seq`` — every sequence weighs the same (the original
  GRPO objective; biased towards short correct and long wrong answers per Dr.GRPO);
- ``seq-mean-token-sum-norm``: ``Σ_i (Σ_t l / C) / N_seq`` with a constant C (Dr.GRPO: the maximum
  response length), so no length enters the normalisation.

``n_i`` is row i's number of generated tokens, ``N_tokens`` their total and ``N_seq`` the number of rows
with at least one generated token. With gradient accumulation, pass the *whole* batch's counts as
``num_tokens`` / ``num_sequences`` to every micro-batch: the summed micro-batch losses then equal the
loss of the whole batch (the micro-batch's own counts would weight micro-batches, not tokens).
Empty inputs (no generated token) aggregate to 0, never 0/0.

Source: verl ``agg_loss`` (same mode names); Yu et al. 2025, "DAPO" (arXiv:2503.14476) §3.3
token-level loss; Liu et al. 2025, "Dr. GRPO" (arXiv:2503.20783) §3.1.
"""

from __future__ import annotations

import torch

from chatgym.trainer.algos.masked import as_bool_mask, check_2d, masked_sum
from chatgym.trainer.algos.registry import get_aggregation_mode, register_aggregation_mode


def _denominator(
    count: torch.Tensor, override: float | int | None, name: str, dtype: torch.dtype
) -> torch.Tensor:
    if override is not None:
        if not override > 0:
            raise ValueError(f"{name} must be > 0, got {override}")
        return torch.as_tensor(float(override), dtype=dtype, device=count.device)
    return count.clamp_min(1).to(dtype)


def _seq_count(mask: torch.Tensor) -> torch.Tensor:
    return mask.any(dim=-1).sum()


@register_aggregation_mode("token-mean")
def token_mean(
    loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """``Σ l·m / N_tokens`` (``num_tokens`` overrides N_tokens)."""
    return masked_sum(loss, mask) / _denominator(mask.sum(), num_tokens, "num_tokens", loss.dtype)


@register_aggregation_mode("seq-mean-token-sum")
def seq_mean_token_sum(
    loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """``Σ_i Σ_t l·m / N_seq`` (``num_sequences`` overrides N_seq)."""
    return masked_sum(loss, mask) / _denominator(_seq_count(mask), num_sequences, "num_sequences", loss.dtype)


@register_aggregation_mode("seq-mean-token-mean")
def seq_mean_token_mean(
    loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """``Σ_i (Σ_t l·m / n_i) / N_seq``; rows without generated tokens contribute 0."""
    per_seq = masked_sum(loss, mask, dim=-1) / mask.sum(dim=-1).clamp_min(1).to(loss.dtype)
    return per_seq.sum() / _denominator(_seq_count(mask), num_sequences, "num_sequences", loss.dtype)


@register_aggregation_mode("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """``Σ_i (Σ_t l·m / C) / N_seq`` with ``C = norm_constant`` (required; Dr.GRPO uses the maximum
    response length in tokens)."""
    if norm_constant is None:
        raise ValueError("norm_constant is required by 'seq-mean-token-sum-norm' (e.g. max response tokens)")
    if not norm_constant > 0:
        raise ValueError(f"norm_constant must be > 0, got {norm_constant}")
    seqs = _denominator(_seq_count(mask), num_sequences, "num_sequences", loss.dtype)
    return masked_sum(loss, mask) / norm_constant / seqs


def aggregate_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar with the aggregation ``mode`` (see the module docstring).

    Args:
        loss: (B, T) float per-token loss; values at masked positions are ignored (may be inf/NaN).
        mask: (B, T) loss mask.
        mode: ``token-mean`` | ``seq-mean-token-sum`` | ``seq-mean-token-mean`` |
            ``seq-mean-token-sum-norm`` (or any registered name).
        num_tokens, num_sequences: global counts for gradient accumulation (> 0), or None for this
            batch's own counts.
        norm_constant: C for ``seq-mean-token-sum-norm`` (> 0, in tokens).

    Returns:
        A 0-dim tensor of ``loss``' dtype, differentiable w.r.t. ``loss``.

    Raises:
        ValueError: unknown ``mode`` (lists the known ones), a shape mismatch, a count <= 0.
    """
    fn = get_aggregation_mode(mode)
    check_2d("loss", loss)
    m = as_bool_mask("mask", mask, loss.shape)
    return fn(loss, m, num_tokens=num_tokens, num_sequences=num_sequences, norm_constant=norm_constant)
