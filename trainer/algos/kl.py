"""KL estimators k1, k2, k3 against a reference model, used as a loss term or as a per-token
penalty subtracted from the reward.

All three estimate KL(π_θ ‖ π_ref) from tokens sampled from π_θ, using only the two models'
logprobs of those tokens. With ``log_r = ref_logprobs − logprobs``:

- ``k1 = −log_r``: unbiased, high variance, can be negative per token;
- ``k2 = ½ · log_r²``: biased, low variance, always >= 0;
- ``k3 = (exp(log_r) − 1) − log_r``: unbiased, low variance, always >= 0.

Example (one token): π_θ = 0.5, π_ref = 0.25, so log_r = −ln 2: k1 = ln 2 ≈ 0.693147,
k2 = ½ (ln 2)² ≈ 0.240227, k3 = (0.5 − 1) + ln 2 ≈ 0.193147.

Source: Schulman 2020, "Approximating KL Divergence" (joschu.net/blog/kl-approx.html); peer: verl
``kl_penalty`` ("kl"/"mse"/"low_var_kl"), OpenRLHF ``compute_approx_kl``. ``log_r`` is clamped to
[−20, 20] first (verl does the same for k3) so a token the reference model deems impossible gives
a large finite value instead of inf or NaN.
"""

from __future__ import annotations

import torch

from chatgym.trainer.algos.masked import as_bool_mask, check_2d, check_shape, safe_log_ratio
from chatgym.trainer.algos.registry import get_kl_estimator, register_kl_estimator


def _log_ratio(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    check_shape("ref_logprobs", ref_logprobs, logprobs.shape)
    m = (
        torch.ones_like(logprobs, dtype=torch.bool)
        if mask is None
        else as_bool_mask("mask", mask, logprobs.shape)
    )
    return safe_log_ratio(ref_logprobs.to(logprobs.dtype), logprobs, m)


@register_kl_estimator("k1")
def kl_k1(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """k1 = ``logprobs − ref_logprobs`` per token (same shape as the inputs; 0 where ``mask`` is 0)."""
    return -_log_ratio(logprobs, ref_logprobs, mask)


@register_kl_estimator("k2")
def kl_k2(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """k2 = ``½ (logprobs − ref_logprobs)²`` per token (0 where ``mask`` is 0)."""
    return 0.5 * _log_ratio(logprobs, ref_logprobs, mask) ** 2


@register_kl_estimator("k3")
def kl_k3(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """k3 = ``exp(log_r) − 1 − log_r`` with ``log_r = ref_logprobs − logprobs`` (0 where ``mask`` is 0)."""
    log_r = _log_ratio(logprobs, ref_logprobs, mask)
    # expm1 keeps precision when the models nearly agree (log_r ~ 1e-8).
    return torch.expm1(log_r) - log_r


@torch.no_grad()
def apply_kl_penalty(
    token_rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float,
    estimator: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL in the reward: ``token_rewards − coef · KL_t`` on generated tokens (PPO-RLHF style).

    Args:
        token_rewards: (B, T) float.
        logprobs, ref_logprobs: (B, T) float, the behaviour policy's and the reference model's
            logprobs of the sampled tokens.
        mask: (B, T) loss mask; the penalty is applied only where it is set.
        coef: β >= 0.
        estimator: a registered KL estimator name (``k1``, ``k2``, ``k3``).

    Returns:
        ``(penalised_rewards, kl)``, both (B, T), computed without gradient.

    Source: Ouyang et al. 2022, "Training language models to follow instructions with human
    feedback" (arXiv:2203.02155), eq. 2; peer: verl ``apply_kl_penalty``, REINFORCE++ (k1 in reward).
    """
    check_2d("token_rewards", token_rewards)
    check_shape("logprobs", logprobs, token_rewards.shape)
    m = as_bool_mask("mask", mask, token_rewards.shape)
    if coef < 0:
        raise ValueError(f"coef must be >= 0, got {coef}")
    kl = get_kl_estimator(estimator)(logprobs, ref_logprobs, m).to(token_rewards.dtype)
    return token_rewards - coef * kl, kl
