"""Per-turn advantage estimators for multi-turn episodes: turn-level GRPO, GiGPO and a leave-one-out
per-turn baseline. Every token of assistant turn k of sample i gets one value ``A[i, k]``.

They are registered like the trajectory-level ones and called the same way, with three more inputs
that the trainer builds from the trajectories (:mod:`chatgym.trainer.learner.turns`)::

    advantages, returns = get_advantage_estimator("gigpo")(
        token_rewards, mask, group_ids=group_ids, turn_ids=turn_ids, turn_counts=turn_counts,
        state_ids=state_ids, **params)

Shapes and conventions, shared by all three:

- ``token_rewards``: (B, T) float, as for every estimator (:func:`~.advantages.place_rewards` puts
  turn k's env reward on turn k's last generated token, shaping on the row's last one).
- ``mask``: (B, T) loss mask; advantages are written only where it is set. A row whose mask was
  zeroed (an over-long completion filtered out) still counts in its group's baselines.
- ``group_ids``: (B,) integer, samples of one task share an id.
- ``turn_ids``: (B, T) integer, the assistant turn each position belongs to: turn k owns its
  generated tokens and the closing/observation tokens after them, the prompt belongs to turn 0, and
  -1 marks padding (which must carry no reward). The reward of turn k, ``r[i, k]``, is the sum of
  ``token_rewards`` over the positions of turn k, so a row's turn rewards sum to its row of
  ``token_rewards`` (KL-in-reward and shaping included).
- ``turn_counts``: (B,) integer, K_i, the number of assistant turns of sample i (>= 0); every id in
  row i of ``turn_ids`` is below it.
- Returns ``(advantages, returns)``, both (B, T) in ``token_rewards``' dtype, computed without
  gradient; ``returns`` is the turn's discounted return ``G[i, k] = sum_{j>=k} gamma^(j-k) r[i, j]``
  on each generated token of turn k; both are 0 where the mask is 0.

**Group edge cases** (as the trajectory-level estimators): a set of values compared with each other
that are all equal gets advantages of exactly 0; a value with nothing to compare to (a group of one,
a turn index only one sample reached, an anchor state seen once) gets 0.
"""

from __future__ import annotations

import math

import torch

from chatgym.trainer.algos.advantages import AdvantageOutput
from chatgym.trainer.algos.masked import as_bool_mask, check_2d, check_finite, check_shape, group_statistics
from chatgym.trainer.algos.registry import register_advantage_estimator

# The estimators of this module and the parameters each checks at config load.
TURN_ADVANTAGES = frozenset({"turn_grpo", "gigpo", "turn_rloo"})


def check_turn_params(name: str, params: dict) -> None:
    """Raise ValueError naming ``algo.advantage_kwargs.<key>`` for a bad ``gamma`` (outside [0, 1]),
    ``omega`` or ``eps`` (negative or infinite) or ``norm_by_std`` (not a bool) of the per-turn
    estimator ``name``."""
    if name not in TURN_ADVANTAGES:
        return
    gamma = params.get("gamma", 1.0)
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"algo.advantage_kwargs.gamma must be a number in [0, 1], got {gamma!r}")
    for key in ("omega", "eps"):
        value = params.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise ValueError(f"algo.advantage_kwargs.{key} must be a finite number >= 0, got {value!r}")
    if "norm_by_std" in params and not isinstance(params["norm_by_std"], bool):
        raise ValueError(f"algo.advantage_kwargs.norm_by_std must be true or false, got {params['norm_by_std']!r}")


def _check_turn_inputs(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    turn_ids: torch.Tensor,
    turn_counts: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The checks all three make; returns ``(bool mask, (B, K) turn rewards)``, K = max(1, max K_i)."""
    check_2d("token_rewards", token_rewards)
    if not token_rewards.is_floating_point():
        raise TypeError(f"token_rewards must be a floating-point tensor, got {token_rewards.dtype}")
    m = as_bool_mask("mask", mask, token_rewards.shape)
    check_finite("token_rewards", token_rewards)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    for name, tensor, shape in (
        ("group_ids", group_ids, token_rewards.shape[:1]),
        ("turn_ids", turn_ids, token_rewards.shape),
        ("turn_counts", turn_counts, token_rewards.shape[:1]),
    ):
        if tensor is None:
            raise ValueError(f"{name} is required by the per-turn advantage estimators")
        check_shape(name, tensor, shape)
        if tensor.is_floating_point() or tensor.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {tensor.dtype}")
    if bool((turn_counts < 0).any()):
        raise ValueError("turn_counts must be >= 0")
    if bool((turn_ids < -1).any()) or bool((turn_ids >= turn_counts[:, None]).any()):
        raise ValueError("turn_ids must be -1 (padding) or a turn index below the row's turn_counts")
    pad = turn_ids < 0
    if bool((token_rewards[pad] != 0).any()):
        raise ValueError("token_rewards must be 0 where turn_ids is -1 (no turn would get that reward)")
    k = max(1, int(turn_counts.max()) if turn_counts.numel() else 1)
    rewards = torch.zeros(token_rewards.shape[0], k, dtype=token_rewards.dtype, device=token_rewards.device)
    rewards.scatter_add_(1, turn_ids.clamp_min(0).long(), torch.where(pad, 0.0, token_rewards))
    return m, rewards


def turn_returns(turn_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, K) discounted returns ``G[:, k] = r[:, k] + gamma G[:, k+1]`` of (B, K) turn rewards
    (turns past a row's count have reward 0, so their return is 0 too)."""
    out = torch.zeros_like(turn_rewards)
    running = torch.zeros_like(turn_rewards[:, 0])
    for k in reversed(range(turn_rewards.shape[1])):
        running = turn_rewards[:, k] + gamma * running
        out[:, k] = running
    return out


def _on_tokens(per_turn: torch.Tensor, turn_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T): ``per_turn[i, turn_ids[i, t]]`` where the mask is set, 0 elsewhere."""
    picked = per_turn.gather(1, turn_ids.clamp_min(0).long())
    return torch.where(mask & (turn_ids >= 0), picked, torch.zeros((), dtype=per_turn.dtype))


def normalise_within(
    values: torch.Tensor, keys: torch.Tensor, *, norm_by_std: bool, eps: float
) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` (or ``x - mean``) of each value among those with the same key.

    Args:
        values: (M,) float. keys: (M, D) integer; rows that are equal form one set.

    Returns:
        (M,); exactly 0 for a set of one or a set whose values are all equal. ``std`` is the unbiased
        (n-1) sample standard deviation, as ``torch.std``.
    """
    if values.numel() == 0:
        return values.clone()
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    _, mean, std, count, constant = group_statistics(values, inverse)
    centred = values - mean
    adv = centred / (std + eps) if norm_by_std else centred
    return torch.where(constant | (count < 2), torch.zeros_like(adv), adv)


def _valid_turns(turn_counts: torch.Tensor, k: int) -> torch.Tensor:
    """(B, K) bool: turn k exists in row i (k < K_i)."""
    return torch.arange(k, device=turn_counts.device)[None, :] < turn_counts[:, None]


@register_advantage_estimator("turn_grpo")
@torch.no_grad()
def turn_grpo_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    turn_ids: torch.Tensor,
    turn_counts: torch.Tensor,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """Turn-level GRPO: each turn's discounted return, normalised among the group's samples at the same
    turn index. ``A[i, k] = (G[i, k] - mean_j G[j, k]) / (std_j G[j, k] + eps)`` over the samples j of
    i's group that have a turn k (``norm_by_std=False``: no division). ``values`` is ignored.

    **Unequal turn counts**: a sample that ended before turn k is not in turn k's set (it is not
    counted as a return of 0), so a turn index reached by one sample gets 0. Because which samples
    are in a set depends on when each one stopped, this baseline is action-dependent when the policy
    chooses to stop — the bias verl RFC #7244 describes; ``turn_rloo`` is the unbiased alternative.
    With outcome-only rewards and gamma = 1, turn 0's advantage is GRPO's.

    Example (gamma = 0.5, eps = 0): sample a has turn rewards [0, 1] (G = [0.5, 1]), sample b [1]
    (G = [1]). Turn 0's set is {0.5, 1}: mean 0.75, std sqrt(0.125), so a's turn 0 gets -0.7071 and
    b's +0.7071; a's turn 1 is alone in its set: 0.

    Source: the per-turn-index normalisation of MT-GRPO (Zeng et al. 2025, "Reinforcing Multi-Turn
    Reasoning in LLM Agents via Turn-Level Credit Assignment", arXiv:2505.11821, turn-level
    advantages) with the discounted per-turn returns of Kevin (Baronio et al. 2025, arXiv:2507.11948);
    the construction verl RFC #7244 ports and analyses.
    """
    m, rewards = _check_turn_inputs(token_rewards, mask, group_ids, turn_ids, turn_counts, gamma)
    returns = turn_returns(rewards, gamma)
    valid = _valid_turns(turn_counts, rewards.shape[1])
    rows, turns = valid.nonzero(as_tuple=True)
    keys = torch.stack([group_ids[rows].long(), turns], dim=1)
    adv = torch.zeros_like(returns)
    adv[rows, turns] = normalise_within(returns[rows, turns], keys, norm_by_std=norm_by_std, eps=eps)
    return AdvantageOutput(_on_tokens(adv, turn_ids, m), _on_tokens(returns, turn_ids, m))


@register_advantage_estimator("gigpo")
@torch.no_grad()
def gigpo_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    turn_ids: torch.Tensor,
    turn_counts: torch.Tensor,
    state_ids: torch.Tensor,
    values: torch.Tensor | None = None,
    gamma: float = 0.95,
    omega: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """GiGPO: an episode-level group advantage plus ω times a step-level one from anchor-state groups.

    - Episode level: ``A^E(τ_i) = (R(τ_i) - mean_j R(τ_j)) / F_norm`` over the N trajectories of the
      group, ``R`` the sum of the episode's rewards (the paper's episode relative advantage).
    - Anchor-state groups: among the group's trajectories, every turn (i, k) whose state is the same
      anchor state — equal ``state_ids[i, k]``, at *any* turn index and in any trajectory, a
      trajectory revisiting a state counting each visit — forms one step group ``G^S(s)``.
    - Step level: ``G[i, k] = sum_{j>=k} gamma^(j-k) r[i, j]`` (the discounted return of the step) and
      ``A^S(a[i, k]) = (G[i, k] - mean over G^S(s)) / F_norm`` over the step group.
    - Combined: ``A(a[i, k]) = A^E(τ_i) + omega * A^S(a[i, k])`` on every token of turn k.

    ``F_norm`` is the unbiased std plus ``eps`` (``norm_by_std=True``, the paper's default form) or 1
    (``norm_by_std=False``, the Dr.GRPO-style ``mean_norm`` mode of the authors' code). Defaults
    ``gamma = 0.95`` and ``omega = 1`` are the paper's settings. A step group of one (a state no other
    turn reached) has step advantage 0, so its turn gets ``A^E`` only. Turn 0 acts in the group's
    shared opening, so its step group is the episode group: with rewards at the end only its step
    advantage is ``A^E`` itself and turn 0 gets ``(1 + omega) A^E``; with one turn per episode
    GiGPO is GRPO scaled by ``1 + omega``. ``values`` is ignored.

    Args:
        state_ids: (B, K') integer, K' >= max(turn_counts): the anchor state of each turn; equal ids
            in one group mean identical environment states (-1 or anything past a row's count is
            never read).

    Source: Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training"
    (arXiv:2505.10978), §4: the episode relative advantage, anchor state grouping, the step relative
    advantage and their ω-weighted sum, as named above (equation numbers are not cited: only the
    abstract and summaries of the paper could be read here). The formulas follow the authors'
    verl-agent ``gigpo/core_gigpo.py`` (``episode_norm_reward``, ``build_step_group``,
    ``step_norm_reward``, ``compute_step_discounted_returns``; read in a fork of it). Difference: the
    episode mean here is over the N trajectories (the paper's definition), where that code by
    default averages over step rows, which weights a trajectory by its number of turns; and an episode
    group of one gets 0 here where that code gives the raw score.
    """
    m, rewards = _check_turn_inputs(token_rewards, mask, group_ids, turn_ids, turn_counts, gamma)
    k = rewards.shape[1]
    check_2d("state_ids", state_ids)
    if state_ids.is_floating_point() or state_ids.dtype == torch.bool:
        raise TypeError(f"state_ids must be an integer tensor, got {state_ids.dtype}")
    needed = int(turn_counts.max()) if turn_counts.numel() else 0
    if state_ids.shape[0] != rewards.shape[0] or state_ids.shape[1] < needed:
        raise ValueError(
            f"state_ids must have shape (B, >= {needed}) = max(turn_counts), got {tuple(state_ids.shape)}"
        )
    states = torch.full((rewards.shape[0], k), -1, dtype=torch.long, device=rewards.device)
    width = min(k, state_ids.shape[1])
    states[:, :width] = state_ids[:, :width].long()
    valid = _valid_turns(turn_counts, k)
    if bool((states[valid] < 0).any()):
        raise ValueError("state_ids must be >= 0 for every turn below the row's turn_counts")
    returns = turn_returns(rewards, gamma)
    scores = rewards.sum(dim=1)
    episode = normalise_within(scores, group_ids.long()[:, None], norm_by_std=norm_by_std, eps=eps)
    rows, turns = valid.nonzero(as_tuple=True)
    keys = torch.stack([group_ids[rows].long(), states[rows, turns]], dim=1)
    step = torch.zeros_like(returns)
    step[rows, turns] = normalise_within(returns[rows, turns], keys, norm_by_std=norm_by_std, eps=eps)
    adv = episode[:, None] + omega * step
    return AdvantageOutput(_on_tokens(adv, turn_ids, m), _on_tokens(returns, turn_ids, m))


@register_advantage_estimator("turn_rloo")
@torch.no_grad()
def turn_rloo_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    turn_ids: torch.Tensor,
    turn_counts: torch.Tensor,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
) -> AdvantageOutput:
    """Per-turn leave-one-out: ``A[i, k] = G[i, k] - mean_{j != i} G~[j, k]`` over all N samples of
    the group, where ``G~[j, k]`` is sample j's return from turn k, **0 when j ended before turn k**
    (a finished episode earns nothing more).

    Why it is unbiased: the baseline of turn (i, k) is a function of the *other* samples only, which
    are independent of sample i's actions, so ``E[grad log pi(a[i, k]) * b] = 0`` for every k — and
    every other sample counts at every turn index, so how many terms a baseline has never depends on
    when sample i (or any sample) chose to stop. Per-turn-index normalisation over the samples that
    reached turn k (``turn_grpo``) lacks both properties. No std division (it would use sample i's
    own return). With gamma = 1 and outcome-only rewards, turn 0's advantage is RLOO's.

    Example: returns (gamma = 1) a: [1, 1] (rewards [0, 1]), b: [0] (one turn), c: [2, 0]: turn 0
    a gets 1 - (0 + 2)/2 = 0; turn 1 a gets 1 - (0 + 0)/2 = 1, c gets 0 - (1 + 0)/2 = -0.5.
    Group of one: 0. All ``G~[:, k]`` equal in a group: 0 at index k. ``values`` is ignored.

    Source: verl RFC #7244 ("a turn-level baseline that stays unbiased under variable turn counts")
    names the bias of per-turn-index normalisation (an action-dependent baseline whose number of
    terms is set by the trajectory's own stopping turn); its proposed fix could not be read here (only
    the RFC's summary was available), so this is the closest well-defined estimator with that
    property: the leave-one-out baseline of RLOO (Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a
    Baseline for Free!"; Ahmadian et al. 2024, arXiv:2402.14740) applied to per-turn reward-to-go
    (REINFORCE with a state-independent baseline, Williams 1992), finished samples padded with 0.
    """
    m, rewards = _check_turn_inputs(token_rewards, mask, group_ids, turn_ids, turn_counts, gamma)
    returns = turn_returns(rewards, gamma)  # 0 past a row's last turn: the padding the baseline needs
    n_rows, k = returns.shape
    index = torch.arange(k, device=returns.device).repeat(n_rows)
    keys = torch.stack([group_ids.long().repeat_interleave(k), index], dim=1)
    flat = returns.reshape(-1)
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    total, _, _, count, constant = group_statistics(flat, inverse)
    baseline = (total - flat) / (count - 1).clamp_min(1).to(flat.dtype)
    adv = torch.where(constant | (count < 2), torch.zeros_like(flat), flat - baseline).reshape(n_rows, k)
    return AdvantageOutput(_on_tokens(adv, turn_ids, m), _on_tokens(returns, turn_ids, m))
