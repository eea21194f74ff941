"""Policy-gradient surrogates: PPO clip, clip-higher (DAPO), dual-clip, and the truncated
importance-sampling (TIS) correction for engine-vs-trainer logprob mismatch.

Sign convention: every function returns the per-token **objective** (the clipped surrogate, to be
*maximised*), and ``PolicyLossOutput.loss`` is its negation (to be *minimised*). With dual-clip
(ε = 0.2, c = 3) and ratio 5, advantage +2 gives objective ``min(5·2, 1.2·2) = 2.4`` (loss −2.4) and
advantage −2 gives ``max(min(5·(−2), 1.2·(−2)), 3·(−2)) = max(−10, −6) = −6.0`` (loss 6.0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from chatgym.trainer.algos.correction import rollout_correction
from chatgym.trainer.algos.masked import as_bool_mask, check_2d, check_shape, safe_log_ratio
from chatgym.trainer.algos.registry import register_policy_loss


@dataclass(frozen=True)
class PolicyLossOutput:
    """Per-token outputs of a policy loss, each (B, T).

    Attributes:
        objective: the clipped surrogate per token (float, differentiable w.r.t. ``logprobs``),
            to be maximised; 0 where the mask is 0.
        ratio: ``exp(logprobs - old_logprobs)`` (detached, clamped as described in ``masked``);
            1 where the mask is 0.
        clipped: bool, True where the clip bound was the active (smaller) term, i.e. the token's
            gradient was cut by ``ε``; the mean over generated tokens is the "clip fraction".
        dual_clipped: bool, True where the dual-clip lower bound ``c·A`` replaced the objective.
    """

    objective: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor
    dual_clipped: torch.Tensor

    @property
    def loss(self) -> torch.Tensor:
        """Per-token loss to minimise: ``-objective`` (B, T)."""
        return -self.objective


# The range checks of ε and c, each naming the argument as its caller takes it (``eps``, ``c``). A
# non-finite bound is no setting: ε_high = inf or c = inf would turn that clip off, which ``None``
# (dual clip) or another loss does explicitly; nan fails every comparison and is refused by each.
# Compared as floats: an int past float's range (10**400) passed ``1 < c < inf`` and overflowed in the
# loss's first product.
def _as_float(name: str, value: Any, rule: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number {rule}, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be {rule}, got an int of {len(str(abs(value)))} digits") from None


def _check_eps_low(name: str, value: float) -> None:
    if not 0.0 <= _as_float(name, value, "in [0, 1)") < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


def _check_eps_high(name: str, value: float) -> None:
    if not 0.0 <= _as_float(name, value, ">= 0 and finite") < math.inf:
        raise ValueError(f"{name} must be >= 0 and finite, got {value}")


def _check_dual_clip(name: str, value: float | None) -> None:
    if value is not None and not 1.0 < _as_float(name, value, "> 1 and finite (or None)") < math.inf:
        raise ValueError(f"{name} must be > 1 and finite (or None), got {value}")


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """The PPO clipped surrogate with asymmetric bounds and an optional dual clip.

    ``objective = min(r·A, clip(r, 1−eps_low, 1+eps_high)·A)`` per token, with
    ``r = exp(logprobs − old_logprobs)``. With ``dual_clip = c`` and ``A < 0`` it becomes
    ``max(objective, c·A)``: a negative-advantage token whose ratio exploded has its loss bounded
    (and no gradient). The lower bound never applies to ``A >= 0``. ``is_weights`` (e.g.
    :func:`truncated_is_weights`) multiply the objective, detached.

    Args:
        logprobs: (B, T) float, the current policy's logprob of each token (carries the gradient).
        old_logprobs: (B, T) float, the behaviour policy's logprobs (detached here).
        advantages: (B, T) float (detached here).
        mask: (B, T) loss mask; masked positions may hold any value, including ±inf.
        eps_low, eps_high: clip range below / above 1; eps_low in [0, 1), eps_high >= 0 and finite.
        dual_clip: ``c > 1`` and finite, or None (no dual clip).
        is_weights: (B, T) float per-token importance weights, or None.

    Raises:
        ValueError: a shape mismatch or out-of-range ε / c, naming the argument.

    Source: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv:1707.06347), eq. 7;
    Yu et al. 2025, "DAPO" (arXiv:2503.14476), §3.1 clip-higher; Ye et al. 2020, "Mastering Complex
    Control in MOBA Games with Deep Reinforcement Learning" (arXiv:1912.09729), eq. 5 dual-clip;
    peer: verl ``compute_policy_loss_vanilla`` (clip_ratio_low/high/c).
    """
    check_2d("logprobs", logprobs)
    check_shape("old_logprobs", old_logprobs, logprobs.shape)
    check_shape("advantages", advantages, logprobs.shape)
    m = as_bool_mask("mask", mask, logprobs.shape)
    _check_eps_low("eps_low", eps_low)
    _check_eps_high("eps_high", eps_high)
    _check_dual_clip("dual_clip", dual_clip)

    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    ratio = torch.exp(safe_log_ratio(logprobs, old_logprobs.detach(), m))
    adv = torch.where(m, advantages.detach().to(logprobs.dtype), zero)
    unclipped = ratio * adv
    clipped_term = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    objective = torch.minimum(unclipped, clipped_term)
    clipped = m & (clipped_term < unclipped)
    if dual_clip is not None:
        lower = dual_clip * adv
        dual_clipped = m & (adv < 0) & (objective < lower)
        objective = torch.where(dual_clipped, lower, objective)
    else:
        dual_clipped = torch.zeros_like(m)
    if is_weights is not None:
        check_shape("is_weights", is_weights, logprobs.shape)
        objective = objective * torch.where(m, is_weights.detach().to(logprobs.dtype), zero)
    return PolicyLossOutput(
        objective=torch.where(m, objective, zero),
        ratio=ratio.detach(),
        clipped=clipped,
        dual_clipped=dual_clipped,
    )


def check_policy_loss_kwargs(section: str, fn: Any, kwargs: Mapping[str, Any]) -> None:
    """``kwargs``' values for the registered policy loss ``fn``, checked at config load: numbers, and
    for this module's losses their own checks, run on a one-token batch (else a bad ε fails only at
    the first update, after the model loaded and the first rollout ran).

    Raises:
        ValueError: prefixed with ``section``: a value that is not a number (or None), or ``fn``'s own
            message for an out-of-range one.
    """
    for key, value in kwargs.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{section}: {key} must be a number, got {value!r}")
    if getattr(fn, "__module__", None) != __name__:  # a loss registered elsewhere: its own checks, at its call
        return
    one = torch.zeros(1, 1)
    try:
        fn(one, one, one, torch.ones(1, 1, dtype=torch.bool), **kwargs)
    except ValueError as exc:
        raise ValueError(f"{section}: {exc}") from None


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps: float = 0.2,
    is_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """PPO clip with one ε (default 0.2): :func:`clipped_surrogate` with ``eps_low = eps_high = eps``.

    Raises:
        ValueError: ``eps`` outside [0, 1) (named ``eps``), or as :func:`clipped_surrogate`.

    Source: Schulman et al. 2017 (arXiv:1707.06347), eq. 7; peer: verl ``vanilla`` policy loss.
    """
    _check_eps_low("eps", eps)
    return clipped_surrogate(
        logprobs, old_logprobs, advantages, mask, eps_low=eps, eps_high=eps, is_weights=is_weights
    )


@register_policy_loss("clip_higher")
def clip_higher_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """DAPO's clip-higher: a wider upper bound (default ε_low 0.2, ε_high 0.28, DAPO's values) lets
    low-probability tokens grow, against entropy collapse. Optionally combined with ``dual_clip``.

    Raises:
        ValueError: as :func:`clipped_surrogate` (``eps_low``, ``eps_high``, ``dual_clip`` named).

    Source: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
    (arXiv:2503.14476), §3.1 eq. 10; peer: verl ``clip_ratio_low``/``clip_ratio_high``.
    """
    return clipped_surrogate(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        eps_low=eps_low,
        eps_high=eps_high,
        dual_clip=dual_clip,
        is_weights=is_weights,
    )


@register_policy_loss("dual_clip")
def dual_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps: float = 0.2,
    c: float = 3.0,
    is_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """Dual-clip PPO: PPO clip (ε, default 0.2) plus the lower bound ``c·A`` (default c = 3) for
    negative advantages only. Ratio 5, ε 0.2, c 3: A = +2 → objective 2.4; A = −2 → −6.0.

    Raises:
        ValueError: ``eps`` outside [0, 1) or ``c`` not > 1 and finite (None: plain PPO clip), named as
            given, or as :func:`clipped_surrogate`.

    Source: Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep Reinforcement
    Learning" (AAAI, arXiv:1912.09729), eq. 5; peer: verl ``clip_ratio_c`` (default 3.0).
    """
    _check_eps_low("eps", eps)
    _check_dual_clip("c", c)
    return clipped_surrogate(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        eps_low=eps,
        eps_high=eps,
        dual_clip=c,
        is_weights=is_weights,
    )


@torch.no_grad()
def truncated_is_weights(
    old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor, cap: float = 2.0
) -> torch.Tensor:
    """Truncated importance-sampling weights for the engine-vs-trainer mismatch.

    ``w = min(exp(old_logprobs − engine_logprobs), cap)`` per token, detached: the rollout engine
    (vLLM, bf16 kernels) samples from a slightly different distribution than the trainer's copy of
    the same weights; weighting the policy objective by ``w`` corrects for it with bounded variance.

    Args:
        old_logprobs: (B, T) float, the trainer's logprobs of the sampled tokens under the weights
            that generated them.
        engine_logprobs: (B, T) float, the engine's logprobs of the same tokens.
        mask: (B, T) loss mask.
        cap: the truncation C > 0 (default 2, the paper's and verl's).

    Returns:
        (B, T) float weights in [0, cap], 0 where the mask is 0.

    Source: Yao, Liu et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training" (blog, fengyao.notion.site); Espeholt et al. 2018, "IMPALA" (arXiv:1802.01561)
    truncated IS; peer: verl ``tis_imp_ratio_cap`` / ``rollout_is``, SkyRL ``use_tis``.
    """
    return rollout_correction(old_logprobs, engine_logprobs, mask, mode="token_tis", cap=cap).weights
