"""Advantage estimators: GRPO, Dr.GRPO, RLOO, REINFORCE++ (plain and with a group baseline), GAE.

Every estimator is registered by name and called the same way::

    advantages, returns = get_advantage_estimator(name)(
        token_rewards, mask, group_ids=group_ids, values=values, **params)

Shapes and conventions, shared by all of them:

- ``token_rewards``: (B, T) float, the reward of each token position. An outcome reward sits on the
  last generated token (:func:`place_rewards`); a per-token KL penalty
  (:func:`chatgym.trainer.algos.kl.apply_kl_penalty`) may be added on generated tokens.
- ``mask``: (B, T) loss mask, nonzero on generated tokens.
- ``group_ids``: (B,) integer; samples of the same task in one batch share an id (GRPO's group).
- ``values``: (B, T) float, the value model's estimates (GAE only; the others ignore it).
- Returns ``(advantages, returns)``, both (B, T) in ``token_rewards``' dtype, 0 where the mask is 0,
  computed without gradient.

**Outcome estimators** (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline) score a sample by the sum of its
row of ``token_rewards`` over *all* positions, so a sample whose loss mask was zeroed (an over-long
completion filtered out) still counts in its group's baseline. Their ``returns`` is that score on
every generated token.

**Token-level estimators** (REINFORCE++, GAE) treat only generated tokens as time steps: a reward at a
non-generated position (e.g. after a tool result) is credited to the nearest *earlier* generated
token, observation tokens are skipped (values/TD errors are carried across them, as verl does for
multi-turn), and rewards before the first generated token have no action to credit and are dropped.

**Group edge cases**: a group whose scores are all identical gets advantages of exactly 0 (not
rounding noise); a group of one sample has no baseline to compare against, so its advantage is 0 —
mixing an unbaselined raw reward (verl's choice) into a batch of normalised advantages would give that
sample a different scale. Use REINFORCE++ when sampling one completion per task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from chatgym.trainer.algos.masked import (
    as_bool_mask,
    check_2d,
    check_finite,
    check_shape,
    group_statistics,
    masked_whiten,
)
from chatgym.trainer.algos.registry import register_advantage_estimator


class AdvantageOutput(NamedTuple):
    """``advantages`` and ``returns``, each (B, T), zero where the loss mask is zero."""

    advantages: torch.Tensor
    returns: torch.Tensor


def place_rewards(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    turn_rewards: Sequence[Sequence[float]] | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Put rewards on tokens: the one place where trajectory rewards become (B, T) token rewards.

    A row's generated tokens form one run of mask 1s per assistant turn. When ``turn_rewards[i]`` has
    as many entries as row i has runs, turn k's reward goes on run k's last token (token-level
    estimators then credit dense rewards to the turn that earned them), and what ``rewards[i]`` adds
    beyond their sum (shaping) goes on the row's last generated token. Otherwise (no turn rewards, or
    a different count) all of ``rewards[i]`` goes on the last generated token. A row without generated
    tokens gets its reward on its last real position ``lengths[i] - 1`` (default T - 1), so outcome
    estimators, which sum the row, still see it.

    Args:
        rewards: (B,) float, one (shaped) reward per trajectory.
        mask: (B, T) loss mask.
        turn_rewards: per row, the env's reward after each assistant turn (None: outcome only).
        lengths: (B,) long, real tokens per row (None: T for every row).

    Returns:
        (B, T) tensor of ``rewards``' dtype.

    Raises:
        ValueError: bad shapes, or T = 0.
    """
    check_2d("mask", mask)
    check_shape("rewards", rewards, mask.shape[:1])
    m = as_bool_mask("mask", mask, mask.shape)
    batch, length = m.shape
    if length == 0:
        raise ValueError("mask must have at least one position (T >= 1) to hold the reward")
    if turn_rewards is not None and len(turn_rewards) != batch:
        raise ValueError(f"turn_rewards has {len(turn_rewards)} rows, mask has {batch}")
    out = torch.zeros(batch, length, dtype=rewards.dtype, device=rewards.device)
    # Last position of each run of 1s: a 1 followed by a 0 (or the row's end).
    ends_mask = m & ~torch.nn.functional.pad(m[:, 1:], (0, 1))
    # One read of every run's end, then two indexed writes for the whole batch: a few tensor ops a
    # row cost a GIL hand-off each beside a rollout thread. Values and float rounding are the
    # per-row loop's: each turn's reward is written, then the row's remainder added to its last end.
    ends: list[list[int]] = [[] for _ in range(batch)]
    for i, j in ends_mask.nonzero().tolist():
        ends[i].append(j)
    values = rewards.tolist()
    turn_at: list[tuple[int, int, float]] = []  # (row, position, turn reward): written
    last_at: list[tuple[int, int, float]] = []  # (row, position, the rest of the row's reward): added
    for i, row_ends in enumerate(ends):
        if not row_ends:  # no generated token: the reward on the last real position
            last = int(lengths[i]) - 1 if lengths is not None else length - 1
            last_at.append((i, max(last, 0), values[i]))
            continue
        placed = 0.0
        turns = turn_rewards[i] if turn_rewards is not None else ()
        if len(row_ends) == len(turns):
            for end, r in zip(row_ends, turns, strict=True):
                turn_at.append((i, end, float(r)))
                placed += float(r)
        last_at.append((i, row_ends[-1], values[i] - placed))
    if turn_at:
        rows, cols, vals = zip(*turn_at, strict=True)
        out[list(rows), list(cols)] = torch.tensor(vals, dtype=out.dtype, device=out.device)
    if last_at:  # every row's; after the turns' (a one-turn row's reward goes to the same position)
        rows, cols, vals = zip(*last_at, strict=True)
        out[list(rows), list(cols)] += torch.tensor(vals, dtype=out.dtype, device=out.device)
    return out


def _check_inputs(
    token_rewards: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor | None, needs_groups: bool
) -> torch.Tensor:
    check_2d("token_rewards", token_rewards)
    if not token_rewards.is_floating_point():
        raise TypeError(f"token_rewards must be a floating-point tensor, got {token_rewards.dtype}")
    m = as_bool_mask("mask", mask, token_rewards.shape)
    check_finite("token_rewards", token_rewards)
    if needs_groups:
        if group_ids is None:
            raise ValueError("group_ids is required by group-relative advantage estimators")
        check_shape("group_ids", group_ids, token_rewards.shape[:1])
        if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
            raise TypeError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    return m


def _broadcast(per_sample: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    zero = torch.zeros((), dtype=per_sample.dtype, device=per_sample.device)
    return torch.where(mask, per_sample[:, None], zero)


def _outcome(scores: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> AdvantageOutput:
    return AdvantageOutput(_broadcast(advantages, mask), _broadcast(scores, mask))


@register_advantage_estimator("grpo")
@torch.no_grad()
def grpo_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    values: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """GRPO: ``A_i = (s_i - mean(group)) / (std(group) + eps)``, the same for every token of sample i.

    ``std`` is the unbiased (n-1) sample standard deviation, as ``torch.std`` in verl and TRL;
    ``eps`` (default 1e-6, verl's) only keeps the division finite — constant groups are set to 0
    explicitly. Example: group scores [1, 0, 0, 1] have mean 0.5 and std sqrt(1/3), so advantages are
    ±0.5/sqrt(1/3) = ±sqrt(3)/2 (with eps=0). ``values`` is ignored.

    Source: Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300), §4.1.2 outcome supervision; peer:
    verl ``compute_grpo_outcome_advantage``, TRL ``GRPOTrainer``.
    """
    m = _check_inputs(token_rewards, mask, group_ids, needs_groups=True)
    scores = token_rewards.sum(dim=-1)
    _, mean, std, count, constant = group_statistics(scores, group_ids)
    adv = (scores - mean) / (std + eps)
    adv = torch.where(constant | (count < 2), torch.zeros_like(adv), adv)
    return _outcome(scores, adv, m)


@register_advantage_estimator("dr_grpo")
@torch.no_grad()
def dr_grpo_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    values: torch.Tensor | None = None,
) -> AdvantageOutput:
    """Dr.GRPO: ``A_i = s_i - mean(group)`` — GRPO without the std division (its question-level
    difficulty bias). Pair it with the ``seq-mean-token-sum-norm`` aggregation (a constant instead of
    the per-sequence length) to also remove the length bias. ``values`` is ignored.

    Source: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"
    (arXiv:2503.20783), §3.1; peer: verl ``norm_adv_by_std_in_grpo=False``.
    """
    m = _check_inputs(token_rewards, mask, group_ids, needs_groups=True)
    scores = token_rewards.sum(dim=-1)
    _, mean, _, count, constant = group_statistics(scores, group_ids)
    adv = torch.where(constant | (count < 2), torch.zeros_like(scores), scores - mean)
    return _outcome(scores, adv, m)


@register_advantage_estimator("rloo")
@torch.no_grad()
def rloo_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    values: torch.Tensor | None = None,
) -> AdvantageOutput:
    """RLOO: ``A_i = s_i - mean(s_j for j != i in the group)`` (leave-one-out baseline).

    The baseline of sample i is ``(sum(group) - s_i) / (n - 1)``; no std normalisation, so a
    remainder with zero variance (e.g. [1, 0, 0]: sample 0's remainder is [0, 0]) is finite
    (advantages 1, -0.5, -0.5). ``values`` is ignored.

    Source: Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (ICLR DeepRLStructPred
    workshop); Ahmadian et al. 2024, "Back to Basics" (arXiv:2402.14740); peer: verl
    ``compute_rloo_outcome_advantage``, TRL ``RLOOTrainer``.
    """
    m = _check_inputs(token_rewards, mask, group_ids, needs_groups=True)
    scores = token_rewards.sum(dim=-1)
    total, _, _, count, constant = group_statistics(scores, group_ids)
    baseline = (total - scores) / (count - 1).clamp_min(1).to(scores.dtype)
    adv = torch.where(constant | (count < 2), torch.zeros_like(scores), scores - baseline)
    return _outcome(scores, adv, m)


def _discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Reward-to-go over generated tokens only (see the module docstring for the crediting rule)."""
    batch, length = token_rewards.shape
    zero = torch.zeros(batch, dtype=token_rewards.dtype, device=token_rewards.device)
    returns = torch.zeros_like(token_rewards)
    running, pending = zero, zero
    for t in reversed(range(length)):
        pending = pending + token_rewards[:, t]
        step = mask[:, t]
        running = torch.where(step, pending + gamma * running, running)
        pending = torch.where(step, zero, pending)
        returns[:, t] = torch.where(step, running, zero)
    return returns


@register_advantage_estimator("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> AdvantageOutput:
    """REINFORCE++: per-token reward-to-go ``G_t = sum_{k>=t} gamma^(k-t) r_k``, then normalised over
    all generated tokens of the batch (global batch whitening, unbiased variance, ``eps`` inside the
    square root). ``returns`` is ``G``. Works with groups of any size (``group_ids`` is ignored).

    Source: Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models"
    (arXiv:2501.03262); peer: OpenRLHF ``reinforce``, verl
    ``compute_reinforce_plus_plus_outcome_advantage``.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    m = _check_inputs(token_rewards, mask, None, needs_groups=False)
    returns = _discounted_returns(token_rewards, m, gamma)
    return AdvantageOutput(masked_whiten(returns, m, eps), returns)


@register_advantage_estimator("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    values: torch.Tensor | None = None,
    eps: float = 1e-8,
) -> AdvantageOutput:
    """REINFORCE++-baseline: ``s_i - mean(group)`` on every generated token, then normalised over
    all generated tokens of the batch (unbiased variance, ``eps`` inside the square root).

    Source: Hu 2025, "REINFORCE++" (arXiv:2501.03262, v3+ "REINFORCE++-baseline"); peer: OpenRLHF
    ``reinforce_baseline``, verl ``compute_reinforce_plus_plus_baseline_outcome_advantage``.
    """
    m = _check_inputs(token_rewards, mask, group_ids, needs_groups=True)
    scores = token_rewards.sum(dim=-1)
    _, mean, _, count, constant = group_statistics(scores, group_ids)
    centered = torch.where(constant | (count < 2), torch.zeros_like(scores), scores - mean)
    return AdvantageOutput(masked_whiten(_broadcast(centered, m), m, eps), _broadcast(scores, m))


def check_value_inputs(
    name: str, token_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None, gamma: float, lam: float
) -> torch.Tensor:
    """The checks every value-based estimator (``gae``, ``tppo``) makes; returns the bool loss mask.

    Raises:
        ValueError: gamma or lam outside [0, 1], no ``values``, bad shapes, non-finite values.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    m = _check_inputs(token_rewards, mask, None, needs_groups=False)
    if values is None:
        raise ValueError(f"values is required by the {name!r} advantage estimator (a value model)")
    check_shape("values", values, token_rewards.shape)
    check_finite("values", values, m)
    return m


def gae_scan(
    token_rewards: torch.Tensor,
    m: torch.Tensor,
    values: torch.Tensor,
    gamma: float,
    lam: float,
    last_value: torch.Tensor | None = None,
) -> torch.Tensor:
    """The GAE recursion over the generated tokens of each row, right to left: (B, T) advantages.

    ``m`` is the bool loss mask (its 1s are the time steps; rewards on other tokens are credited to
    the next generated token to their left); ``values`` are in ``token_rewards``' dtype;
    ``last_value`` (B,) is the value after each row's last generated token (None: 0, a finished
    response; T-PPO bootstraps an unfinished one from V(s_l)).
    """
    batch, length = token_rewards.shape
    zero = torch.zeros(batch, dtype=token_rewards.dtype, device=token_rewards.device)
    advantages = torch.zeros_like(token_rewards)
    next_value = zero if last_value is None else last_value
    last_gae, pending = zero, zero
    for t in reversed(range(length)):
        pending = pending + token_rewards[:, t]
        step = m[:, t]
        value = torch.where(step, values[:, t], zero)
        gae = pending + gamma * next_value - value + gamma * lam * last_gae
        last_gae = torch.where(step, gae, last_gae)
        next_value = torch.where(step, value, next_value)
        pending = torch.where(step, zero, pending)
        advantages[:, t] = torch.where(step, gae, zero)
    return advantages


@register_advantage_estimator("gae")
@torch.no_grad()
def gae_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    values: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten: bool = True,
    eps: float = 1e-8,
) -> AdvantageOutput:
    """Generalised advantage estimation with a value model (PPO).

    Over generated tokens t (observation tokens skipped, value after the last one = 0):
    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``,
    ``returns_t = A_t + V_t`` (the value target). With ``whiten`` (default, as verl and OpenRLHF)
    the advantages, not the returns, are then normalised over the batch's generated tokens.

    Args:
        values: (B, T) float, V(s_t) for each position; read only where the mask is set (must be
            finite there).
        gamma: discount in [0, 1]; lam: GAE lambda in [0, 1].

    Source: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation" (arXiv:1506.02438), eq. 16; PPO (arXiv:1707.06347); peer: verl
    ``compute_gae_advantage_return`` (multi-turn masking), OpenRLHF ``get_advantages_and_returns``.
    """
    m = check_value_inputs("gae", token_rewards, mask, values, gamma, lam)
    values = values.to(token_rewards.dtype)
    advantages = gae_scan(token_rewards, m, values, gamma, lam)
    returns = torch.where(m, advantages + values, torch.zeros_like(values))
    if whiten:
        advantages = masked_whiten(advantages, m, eps)
    return AdvantageOutput(advantages, returns)
