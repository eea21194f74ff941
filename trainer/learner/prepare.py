"""Batch preparation: a step's trajectories -> the token batch the update trains on.

One function, :func:`prepare_batch`, in the order the data flows:

1. drop failed trajectories (an env crash or timeout is never trained on);
2. shape the rewards (missing-EOS penalty, DAPO over-long penalty);
3. keep only informative groups (DAPO dynamic sampling: rewards not all equal);
4. pad into a :class:`~chatgym.trainer.learner.batch.TokenBatch`;
5. place the rewards on tokens (:func:`~chatgym.trainer.algos.place_rewards`);
6. zero the loss mask of budget-truncated completions (DAPO over-long filtering);
7. reference logprobs (KL), old-policy logprobs (several optimizer steps per batch), critic values;
8. advantages and returns (KL-in-reward first when configured); per-turn estimators also get the
   batch's turn structure (:mod:`~chatgym.trainer.learner.turns`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from chatgym.trainer.algos import (
    apply_kl_penalty,
    get_advantage_estimator,
    mask_truncated,
    missing_eos_penalty,
    overlong_reward_penalty,
    place_rewards,
    tppo_value_mask,
)
from chatgym.trainer.config.run import AlgoConfig
from chatgym.trainer.learner.batch import TokenBatch, collate
from chatgym.trainer.learner.forward import ForwardPlan, batch_logprobs, batch_values
from chatgym.trainer.learner.turns import anchor_stats, turn_inputs
from chatgym.trainer.rollout.types import Trajectory, hit_budget


def shape_rewards(trajs: Sequence[Trajectory], algo: AlgoConfig, max_response_tokens: int) -> torch.Tensor:
    """(B,) float32 rewards after the missing-EOS penalty and DAPO's overlong shaping (as configured)."""
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
    if algo.missing_eos_penalty > 0:
        no_eos = torch.tensor([hit_budget(t) for t in trajs])
        rewards = missing_eos_penalty(rewards, no_eos, penalty=algo.missing_eos_penalty)
    if algo.overlong_buffer > 0:
        lengths = torch.tensor([t.response_tokens for t in trajs])
        rewards = rewards + overlong_reward_penalty(
            lengths,
            max_length=max_response_tokens,
            buffer_length=min(algo.overlong_buffer, max_response_tokens),
            penalty_factor=algo.overlong_penalty,
        )
    return rewards


def informative_groups(group_ids: Sequence[int], rewards: torch.Tensor) -> list[int]:
    """Indices of the samples whose group's rewards are not all equal (DAPO dynamic sampling)."""
    by_group: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        by_group[g].append(i)
    values = rewards.tolist()  # one read: a tensor op per group is a GIL hand-off beside a rollout
    keep = []
    for rows in by_group.values():
        if any(values[r] != values[rows[0]] for r in rows):
            keep.extend(rows)
    return sorted(keep)


def token_rewards(trajs: Sequence[Trajectory], rewards: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """(B, T) float32 token rewards of ``batch`` (rows = ``trajs``): each turn's env reward on the last
    token it generated, the shaping on the last generated token (:func:`~.algos.place_rewards`)."""
    return place_rewards(rewards, batch.loss_mask, [t.rewards for t in trajs], batch.lengths)


def truncation_mask(batch: TokenBatch, trajs: Sequence[Trajectory]) -> TokenBatch:
    """``batch`` with the loss mask of budget-truncated trajectories zeroed (DAPO overlong filtering)."""
    truncated = torch.tensor([hit_budget(t) for t in trajs])
    batch.loss_mask = mask_truncated(batch.loss_mask, truncated)
    return batch


def compute_advantages(
    batch: TokenBatch,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    algo: AlgoConfig,
    **inputs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Apply KL-in-reward when configured, then the advantage estimator to (B, T) token ``rewards``
    (``inputs``: extra estimator inputs, e.g. T-PPO's :func:`tppo_inputs`, the per-turn estimators'
    :func:`~chatgym.trainer.learner.turns.turn_inputs`).

    Returns ``(advantages, returns, kl_in_reward)`` (B, T); ``kl_in_reward`` is the per-token KL
    that was subtracted (None when off). The behaviour policy of the KL is the engine's logprobs.
    """
    kl = None
    if algo.kl_in_reward and algo.kl_coef > 0:
        rewards, kl = apply_kl_penalty(
            rewards,
            batch.engine_logprobs,
            batch.ref_logprobs,
            batch.loss_mask,
            coef=algo.kl_coef,
            estimator=algo.kl_estimator,
        )
    estimator = get_advantage_estimator(algo.advantage)
    advantages, returns = estimator(
        rewards.double(),
        batch.loss_mask,
        group_ids=group_ids,
        values=None if batch.old_values is None else batch.old_values.double(),
        **inputs,
        **algo.advantage_kwargs,
    )
    return advantages.float(), returns.float(), kl


def estimator_inputs(
    trajs: Sequence[Trajectory], batch: TokenBatch, algo: AlgoConfig, critic: Any, plan: ForwardPlan
) -> dict[str, torch.Tensor]:
    """The inputs ``algo.advantage``'s estimator takes beyond rewards, mask and groups: T-PPO's
    (:func:`tppo_inputs`), or a per-turn estimator's turn of each token, turns per row and anchor
    states (:func:`~chatgym.trainer.learner.turns.turn_inputs`); {} for the others."""
    if algo.advantage == "tppo":
        return tppo_inputs(trajs, batch, critic, plan)
    return turn_inputs(trajs, batch, get_advantage_estimator(algo.advantage))


@torch.no_grad()
def tppo_inputs(
    trajs: Sequence[Trajectory], batch: TokenBatch, critic: Any, plan: ForwardPlan
) -> dict[str, torch.Tensor]:
    """T-PPO's extra estimator inputs (:mod:`chatgym.trainer.algos.tppo`): ``truncated`` (B,) bool, the rows whose
    response is unfinished (cut by a token budget, :func:`hit_budget`), and ``bootstrap_values`` (B,)
    float64, V(s_l) of each such row: the critic's value after its last token (one extra no-gradient
    pass over those rows only). Sets ``batch.value_mask`` so the value model trains on finished rows
    only."""
    truncated = torch.tensor([hit_budget(t) for t in trajs], dtype=torch.bool)
    boot = torch.zeros(len(trajs), dtype=torch.float64)
    rows = truncated.nonzero().flatten()
    for chunk in rows.split(max(plan.micro_batch_size, 1)):
        mb = batch.select(chunk).to(plan.device)
        with plan.autocast():
            out = critic(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
        values = out.logits.squeeze(-1).float()
        last = mb.attention_mask.sum(dim=1) - 1  # the head on the last real token: V(all tokens)
        boot[chunk] = values[torch.arange(len(chunk), device=values.device), last].double().cpu()
    batch.value_mask = tppo_value_mask(batch.loss_mask, truncated)
    return {"truncated": truncated, "bootstrap_values": boot}


def prepare_batch(
    trajs: Sequence[Trajectory],
    algo: AlgoConfig,
    *,
    max_response_tokens: int,
    pad_id: int,
    policy: Any,
    plan: ForwardPlan,
    reference: Any = None,
    critic: Any = None,
    pixels: Any = None,
) -> tuple[TokenBatch | None, dict[str, float]]:
    """The token batch a step trains on, with its metrics (see the module docstring for the order).

    Args:
        trajs: the step's trajectories, failed ones included (they are dropped here).
        algo: the algorithm settings.
        max_response_tokens: the collector's per-trajectory budget (L_max of the over-long shaping).
        pad_id: token id written after each row's end.
        policy: the policy, for old logprobs when a batch feeds several optimizer steps.
        plan: how the no-gradient passes run (micro-batches, device, sharing, packing, autocast).
        reference: a :class:`~chatgym.trainer.learner.reference.ReferencePolicy` (None: no KL).
        critic: the value model (None: no values).
        pixels: a vision-language policy's images -> pixel values
            (:class:`chatgym.trainer.models.vlm.ImagePixels`); None for a text-only policy.

    Returns:
        ``(batch, metrics)``. ``batch`` is None when nothing is left to train on (every trajectory
        failed, or dynamic sampling kept no group); otherwise it carries ``advantages`` and
        ``returns``, and ``ref_logprobs`` / ``old_logprobs`` / ``old_values`` where used. Metrics:
        ``batch/groups_kept``, ``batch/trajectories_trained``, ``batch/frac_reward_zero_std`` (the
        share of the groups of the trajectories that did not fail whose shaped rewards are all
        equal, before dynamic sampling; TRL's ``frac_reward_zero_std``) and, with a batch,
        ``batch/advantage_mean``, ``batch/advantage_abs_mean``, ``batch/trained_tokens``,
        ``reward/kl_penalty`` (KL in reward), ``timing/prepare_s``; for GiGPO ``batch/anchor/*``
        (:func:`~chatgym.trainer.learner.turns.anchor_stats`).
    """
    t0 = time.perf_counter()
    ok = [t for t in trajs if not t.failed]
    rewards = shape_rewards(ok, algo, max_response_tokens) if ok else torch.zeros(0)
    informative = informative_groups([t.group_id for t in ok], rewards) if ok else []
    keep = informative if algo.dynamic_sampling else list(range(len(ok)))
    metrics: dict[str, float] = {
        "batch/groups_kept": len({ok[i].group_id for i in keep}),
        "batch/trajectories_trained": len(keep),
    }
    if ok:  # groups whose rewards are all equal: no group-normalised advantage, no gradient
        groups = len({t.group_id for t in ok})
        metrics["batch/frac_reward_zero_std"] = 1 - len({ok[i].group_id for i in informative}) / groups
    if not keep:
        return None, metrics
    trained = [ok[i] for i in keep]
    batch = collate(trained, pad_id, pixels)
    placed = token_rewards(trained, rewards[keep], batch)
    if algo.mask_truncated:
        batch = truncation_mask(batch, trained)
    if reference is not None:
        batch.ref_logprobs = reference.logprobs(batch)
    if algo.ppo_epochs * algo.mini_batches > 1:
        batch.old_logprobs = batch_logprobs(policy, batch, plan)
    if critic is not None:
        batch.old_values = batch_values(critic, batch, plan)
    group_ids = torch.tensor([t.group_id for t in trained])
    inputs = estimator_inputs(trained, batch, algo, critic, plan)
    batch.advantages, batch.returns, kl_in_reward = compute_advantages(
        batch, placed, group_ids, algo, **inputs
    )
    if "state_ids" in inputs:  # GiGPO: how often its step groups form
        metrics.update(anchor_stats(inputs["state_ids"], inputs["turn_counts"], group_ids))

    mask = batch.loss_mask
    if kl_in_reward is not None:
        metrics["reward/kl_penalty"] = float((kl_in_reward * mask).sum() / mask.sum().clamp_min(1))
    any_trained = bool(mask.any())
    metrics["batch/advantage_mean"] = float(batch.advantages[mask].mean()) if any_trained else 0.0
    metrics["batch/advantage_abs_mean"] = float(batch.advantages[mask].abs().mean()) if any_trained else 0.0
    metrics["batch/trained_tokens"] = int(mask.sum())
    metrics["timing/prepare_s"] = time.perf_counter() - t0
    return batch, metrics
