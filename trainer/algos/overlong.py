"""Over-long completions: DAPO's soft length penalty, masking truncated completions out of the
loss, and a penalty for completions that ran out of budget without emitting EOS."""

from __future__ import annotations

import torch

from chatgym.trainer.algos.masked import check_2d, check_shape


def overlong_reward_penalty(
    lengths: torch.Tensor, *, max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """DAPO's soft over-long punishment, to be *added* to each sample's reward.

    With ``L = lengths``, ``L_max = max_length`` and ``L_cache = buffer_length``::

        0                                      if L <= L_max − L_cache
        ((L_max − L_cache) − L) / L_cache      if L_max − L_cache < L <= L_max
        −1                                     if L > L_max

    times ``penalty_factor``. Example, L_max 20, L_cache 4: L = 16 → 0, 18 → −0.5, 20 → −1, 21 → −1.

    Args:
        lengths: (B,) integer or float, response lengths in tokens.
        max_length: L_max in tokens (> 0); buffer_length: L_cache in tokens, 0 < L_cache <= L_max.
        penalty_factor: scale (>= 0).

    Returns:
        (B,) float32 (float64 for float64 lengths), values in [−penalty_factor, 0].

    Source: Yu et al. 2025, "DAPO" (arXiv:2503.14476), §3.4 eq. 13; peer: verl ``overlong_buffer``
    in ``DAPORewardManager``.
    """
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1:
        raise ValueError("lengths must be a (B,) tensor of response lengths in tokens")
    if max_length <= 0:
        raise ValueError(f"max_length must be > 0, got {max_length}")
    if not 0 < buffer_length <= max_length:
        raise ValueError(f"buffer_length must be in (0, max_length={max_length}], got {buffer_length}")
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    length = lengths.to(torch.float64 if lengths.dtype == torch.float64 else torch.float32)
    start = max_length - buffer_length
    ramp = (start - length) / buffer_length
    penalty = torch.where(length <= start, torch.zeros_like(length), ramp)
    penalty = torch.where(length > max_length, torch.full_like(length, -1.0), penalty)
    return penalty * penalty_factor


def mask_truncated(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Overlong filtering: zero the loss mask of every truncated completion.

    A completion cut by the token budget has no final answer, so its reward says nothing about its
    tokens; dropping it from the loss (it still counts in its group's baseline when the outcome
    advantage estimators read its reward) avoids punishing sound but unfinished reasoning.

    Args:
        mask: (B, T) loss mask (any dtype); truncated: (B,) bool.

    Returns:
        A new (B, T) mask of ``mask``'s dtype with the truncated rows set to 0.

    Source: Yu et al. 2025, "DAPO" (arXiv:2503.14476), §3.4 "overlong filtering"; peer: SkyRL
    ``apply_overlong_filtering``.
    """
    check_2d("mask", mask)
    check_shape("truncated", truncated, mask.shape[:1])
    keep = ~truncated.bool()
    return mask * keep[:, None].to(mask.dtype) if mask.dtype != torch.bool else mask & keep[:, None]


def missing_eos_penalty(rewards: torch.Tensor, no_eos: torch.Tensor, *, penalty: float) -> torch.Tensor:
    """Subtract ``penalty`` from the reward of each completion that hit its token budget without
    emitting EOS (its last turn finished with ``length``).

    Args:
        rewards: (B,) float; no_eos: (B,) bool; penalty: >= 0, in reward units.

    Returns:
        (B,) float, ``rewards − penalty·no_eos``.

    Source: TRL ``missing_eos_penalty`` (PPO/RLOO/Online-DPO trainers), which subtracts a fixed
    amount from the score of completions without an EOS token.
    """
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        raise ValueError("rewards must be a (B,) tensor")
    check_shape("no_eos", no_eos, rewards.shape)
    if penalty < 0:
        raise ValueError(f"penalty must be >= 0, got {penalty}")
    return rewards - penalty * no_eos.to(rewards.dtype)
