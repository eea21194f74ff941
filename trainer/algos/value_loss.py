"""The PPO value-function loss with value clipping."""

from __future__ import annotations

from typing import NamedTuple

import torch

from chatgym.trainer.algos.masked import as_bool_mask, check_2d, check_shape


class ValueLossOutput(NamedTuple):
    """``loss``: (B, T) float per-token loss (0 where masked); ``clipped``: (B, T) bool, True where
    the clipped term was the larger one (the "value clip fraction")."""

    loss: torch.Tensor
    clipped: torch.Tensor


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.2,
) -> ValueLossOutput:
    """``½ · max((V − R)², (V_clip − R)²)`` per token with ``V_clip = V_old + clip(V − V_old, −c, c)``.

    The new value may move at most ``clip`` from the value used to compute the advantages before the
    loss stops pulling it (pessimistic, like the policy clip). ``clip=None`` gives ``½ (V − R)²``.
    Example: V = 0.9, V_old = 0.5, R = 1, c = 0.2: V_clip = 0.7, max(0.01, 0.09) → loss 0.045.

    Args:
        values: (B, T) float, the value head's current output (carries the gradient).
        old_values: (B, T) float, the values at rollout time (detached here).
        returns: (B, T) float, the targets, e.g. GAE's ``returns`` (detached here).
        mask: (B, T) loss mask.
        clip: c > 0, in reward units, or None.

    Source: OpenAI Baselines ``ppo2`` (Dhariwal et al. 2017) value clipping, as analysed by
    Engstrom et al. 2020, "Implementation Matters in Deep Policy Gradients" (arXiv:2005.12729);
    peer: verl ``compute_value_loss`` (``cliprange_value``), OpenRLHF ``ValueLoss``.
    """
    check_2d("values", values)
    check_shape("old_values", old_values, values.shape)
    check_shape("returns", returns, values.shape)
    m = as_bool_mask("mask", mask, values.shape)
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be > 0 (or None), got {clip}")
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    target = torch.where(m, returns.detach().to(values.dtype), zero)
    v = torch.where(m, values, zero)
    unclipped = (v - target) ** 2
    if clip is None:
        return ValueLossOutput(torch.where(m, 0.5 * unclipped, zero), torch.zeros_like(m))
    old = torch.where(m, old_values.detach().to(values.dtype), zero)
    v_clipped = old + (v - old).clamp(-clip, clip)
    clipped_sq = (v_clipped - target) ** 2
    loss = 0.5 * torch.maximum(unclipped, clipped_sq)
    return ValueLossOutput(torch.where(m, loss, zero), m & (clipped_sq > unclipped))
