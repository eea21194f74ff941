"""The update: the policy (and value) loss over a prepared batch, and the optimizer step.

The batch comes from :func:`chatgym.trainer.learner.prepare.prepare_batch` with its advantages (and
reference / old logprobs, values) filled in; this module only runs the forward passes with gradient
(:mod:`.forward`), the losses of :mod:`chatgym.trainer.algos`, and the optimizer steps.

Logprobs of the behaviour policy: when each rollout batch is used for exactly one optimizer step
(``ppo_epochs = mini_batches = 1``, the default), the policy before the step *is* the behaviour
policy, so ``old_logprobs = logprobs.detach()`` from the same forward pass — no extra pass. The
engine's own logprobs differ (other kernels, bf16 or FP8 weights); ``algo.rollout_correction`` weights
the objective for that (:mod:`chatgym.trainer.algos.correction`; the default is the token-level
truncated IS weight ``min(exp(old − engine), C)``), and the same ``old`` against the engine's gives the
``rollout/mismatch/*`` metrics at the cost of a few element-wise operations per micro-batch. Under
``one_step_off`` / ``async`` the learner may be ahead of the weights that sampled a token, so both
then cover the policy lag as well as the engine's numerics (``staleness/*`` says how far). With several updates per batch, batch preparation
computes ``old_logprobs`` first in one no-gradient pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from chatgym.trainer.algos import aggregate_loss, clipped_value_loss, get_kl_estimator, get_policy_loss
from chatgym.trainer.algos.correction import CorrectionOutput, rollout_correction
from chatgym.trainer.algos.masked import masked_sum
from chatgym.trainer.algos.mismatch import mismatch_terms
from chatgym.trainer.config.run import AlgoConfig
from chatgym.trainer.learner.batch import TokenBatch
from chatgym.trainer.learner.forward import ForwardPlan, forward_values, micro_batch_plan, policy_logprobs


class _Sums:
    """Token- or row-weighted running means for metrics over micro-batches."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.weight: dict[str, float] = defaultdict(float)
        self.maxima: dict[str, float] = {}

    def add_max(self, name: str, value: float) -> None:
        self.maxima[name] = max(self.maxima.get(name, value), value)

    def add(self, name: str, value: torch.Tensor | float, weight: float) -> None:
        self.total[name] += float(value) * weight
        self.weight[name] += weight

    def add_masked(self, name: str, values: torch.Tensor, mask: torch.Tensor) -> None:
        count = float(mask.sum())
        if count:
            self.total[name] += float(masked_sum(values.detach().float(), mask))
            self.weight[name] += count

    def means(self) -> dict[str, float]:
        return {**{k: self.total[k] / self.weight[k] for k in self.total if self.weight[k]}, **self.maxima}


@dataclass
class UpdateState:
    """What an update changes: the policy, its optimizer/scheduler, and optionally a critic with its own."""

    policy: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    critic: Any = None
    critic_optimizer: torch.optim.Optimizer | None = None
    critic_scheduler: Any = None


@dataclass(frozen=True)
class _Loss:
    """The loss pieces of one update, from its :class:`AlgoConfig`."""

    algo: AlgoConfig
    policy_loss: Callable[..., Any]
    kl: Callable[..., Any]
    kl_in_loss: bool  # the KL to the reference is a loss term (not folded into the reward)

    @classmethod
    def of(cls, algo: AlgoConfig) -> _Loss:
        kl_in_loss = algo.kl_coef > 0 and not algo.kl_in_reward
        return cls(algo, get_policy_loss(algo.policy_loss), get_kl_estimator(algo.kl_estimator), kl_in_loss)

    def aggregate(self, values: torch.Tensor, mask: torch.Tensor, totals: dict[str, float]) -> torch.Tensor:
        """``values`` reduced to the scalar loss by ``algo.loss_agg`` over the mini-batch's ``totals``."""
        mode, norm_constant = self.algo.loss_agg, self.algo.loss_norm_constant
        return aggregate_loss(values, mask, mode=mode, norm_constant=norm_constant, **totals)


def update(
    state: UpdateState,
    batch: TokenBatch,
    algo: AlgoConfig,
    plan: ForwardPlan,
    *,
    max_grad_norm: float | None,
    generator: torch.Generator,
) -> dict[str, float]:
    """``ppo_epochs`` passes of ``mini_batches`` optimizer steps over ``batch`` (on CPU; micro-batches
    of ``plan.micro_batch_size`` rows are moved to ``plan.device``). ``batch`` must carry
    ``advantages`` (and ``returns``/``old_values`` for a critic, ``ref_logprobs`` for a KL loss,
    ``old_logprobs`` when there is more than one step). With ``plan.share_prefix``, the rows of a GRPO
    group are forwarded together with their common prompt computed once
    (:func:`~.forward.forward_logprobs_shared`); with ``plan.pack``, each micro-batch's rows are
    forwarded packed without padding (:func:`~.forward.forward_logprobs_packed`; with sharing the
    group's prompt appears once in the pack). ``generator`` orders the mini-batches; ``max_grad_norm``
    clips the gradient (None: no clipping).

    Returns:
        Metrics (token-weighted means over the batch): ``actor/pg_loss``, ``actor/kl``,
        ``actor/entropy``, ``actor/clip_frac``, ``actor/dual_clip_frac``, ``actor/ratio_max``,
        ``actor/tis_weight`` (the rollout correction's mean weight), ``actor/engine_kl`` (k3 between
        trainer and engine logprobs), ``actor/grad_norm``, ``actor/lr``, ``critic/*`` with a critic,
        and the train/inference mismatch ``rollout/mismatch/mean_abs``, ``max_abs``, ``k3_kl``,
        ``seq_abs_log_ratio``, ``clip_frac`` (with a correction on), ``seq_clip_frac`` (sequence-level
        corrections): see :func:`add_mismatch_metrics`.
    """
    loss = _Loss.of(algo)
    sums = _Sums()
    lr = state.optimizer.param_groups[0]["lr"]  # the rate this update's first step uses
    ratio_max = 0.0
    steps = 0
    for _ in range(algo.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for chunk in order.chunk(algo.mini_batches):
            mini = batch.select(chunk)
            if float(mini.loss_mask.sum()) == 0:
                continue
            ratio_max = max(ratio_max, _accumulate_gradients(state, mini, loss, plan, sums))
            _optimizer_step(state, plan.data_parallel, max_grad_norm, sums)
            steps += 1
    if plan.data_parallel is not None:
        ratio_max = plan.data_parallel.reduce_metrics(sums.total, sums.weight, ratio_max, sums.maxima)
    metrics = sums.means()
    metrics["actor/ratio_max"] = ratio_max
    metrics["actor/optimizer_steps"] = steps
    metrics["actor/lr"] = lr
    return metrics


def _accumulate_gradients(
    state: UpdateState, mini: TokenBatch, loss: _Loss, plan: ForwardPlan, sums: _Sums
) -> float:
    """Forward and backward over the micro-batches of one mini-batch (this rank's, with data
    parallelism); returns the largest policy ratio seen (0.0 when no token counts)."""
    totals = _totals(mini.loss_mask)
    # The value loss's own totals where it trains on fewer tokens (T-PPO: finished rows only).
    vtotals = totals if mini.value_mask is None else _totals(mini.loss_mask.bool() & mini.value_mask.bool())
    mbs = micro_batch_plan(mini, plan.micro_batch_size, plan.share_prefix, plan.pack)
    # Data-parallel: this rank's micro-batches of the mini-batch; the losses keep the mini-batch's
    # totals, so the summed gradients are the one-learner gradient.
    dp = plan.data_parallel
    mine = dp.assign(mini, mbs) if dp is not None else [(rows, p, True) for rows, p in mbs]
    ratio_max = 0.0
    for rows, prefix_len, active in mine:
        mb = mini.select(rows).to(plan.device)
        # An inactive micro-batch is a lockstep pass of sharded learners: same collectives, adds nothing.
        mask = mb.loss_mask if active else torch.zeros_like(mb.loss_mask)
        ratio_max = max(
            ratio_max, _policy_backward(state.policy, mb, prefix_len, mask, loss, plan, totals, sums)
        )
        if state.critic is not None:
            _value_backward(state.critic, mb, mask, loss, plan, vtotals, sums)
    return ratio_max


def _policy_backward(
    policy: Any,
    mb: TokenBatch,
    prefix_len: int,
    mask: torch.Tensor,
    loss: _Loss,
    plan: ForwardPlan,
    totals: dict[str, float],
    sums: _Sums,
) -> float:
    """The policy loss of one micro-batch (policy gradient, KL, entropy) backward; returns its largest
    ratio over ``mask`` (0.0 for an empty mask)."""
    algo = loss.algo
    with plan.autocast():
        logp, entropy = policy_logprobs(
            policy,
            mb,
            prefix_len,
            with_entropy=True,
            entropy_grad=algo.entropy_coef > 0,
            pack=plan.pack,
            pack_max_tokens=plan.pack_max_tokens,
            chunk_tokens=plan.logprob_chunk_tokens,
        )
    old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
    correction = correction_of(old, mb.engine_logprobs, mask, algo)
    weights = correction.weights if correction is not None else None
    out = loss.policy_loss(logp, old, mb.advantages, mask, is_weights=weights, **algo.policy_loss_kwargs)
    total = loss.aggregate(out.loss, mask, totals)
    sums.add_masked("actor/pg_loss", out.loss, mask)
    if mb.ref_logprobs is not None:
        kl = loss.kl(logp, mb.ref_logprobs, mask)
        if loss.kl_in_loss:
            total = total + algo.kl_coef * loss.aggregate(kl, mask, totals)
        sums.add_masked("actor/kl", kl, mask)
    if algo.entropy_coef > 0:
        total = total - algo.entropy_coef * loss.aggregate(entropy, mask, totals)
    total.backward()
    sums.add_masked("actor/entropy", entropy, mask)
    sums.add_masked("actor/clip_frac", out.clipped.float(), mask)
    sums.add_masked("actor/dual_clip_frac", out.dual_clipped.float(), mask)
    # The tokens are the engine's samples, so k3 with the ratio learner/engine estimates KL(engine ‖
    # learner) without bias (Schulman 2020); the other order (used until now) is not a KL estimate.
    engine_kl = get_kl_estimator("k3")(mb.engine_logprobs, logp.detach(), mask)
    sums.add_masked("actor/engine_kl", engine_kl, mask)
    if weights is not None:
        sums.add_masked("actor/tis_weight", weights, mask)
    add_mismatch_metrics(sums, old, mb.engine_logprobs, mask, correction)
    return float(out.ratio[mask].max()) if bool(mask.any()) else 0.0


def correction_of(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, algo: AlgoConfig
) -> CorrectionOutput | None:
    """``algo.rollout_correction``'s weights for one micro-batch (whole rows), or None when it is off
    (``token_tis`` with ``algo.tis_cap`` None)."""
    if algo.rollout_correction == "token_tis" and algo.tis_cap is None:
        return None
    return rollout_correction(
        old, engine, mask, mode=algo.rollout_correction, cap=algo.tis_cap, band=tuple(algo.rollout_mask_band)
    )


def add_mismatch_metrics(
    sums: _Sums,
    old: torch.Tensor,
    engine: torch.Tensor,
    mask: torch.Tensor,
    correction: CorrectionOutput | None,
) -> None:
    """``rollout/mismatch/*`` of one micro-batch: the learner's logprobs of the sampled tokens under the
    rollout weights (``old``: this forward's own, detached, in the one-step update; the prepared
    no-gradient pass otherwise) against the engine's, on ``mask``
    (:mod:`chatgym.trainer.algos.mismatch`); ``clip_frac`` (and ``seq_clip_frac`` for a
    sequence-level correction) when a correction is on."""
    terms = mismatch_terms(old, engine, mask)
    if not bool(terms.mask.any()):
        return
    sums.add_masked("rollout/mismatch/mean_abs", terms.abs_diff, terms.mask)
    sums.add_masked("rollout/mismatch/k3_kl", terms.k3, terms.mask)
    sums.add_max("rollout/mismatch/max_abs", float(terms.abs_diff[terms.mask].max()))
    rows = terms.mask.any(dim=1)
    n_rows = float(rows.sum())
    sums.add("rollout/mismatch/seq_abs_log_ratio", float(terms.seq_log_ratio[rows].abs().mean()), n_rows)
    if correction is not None:
        sums.add_masked("rollout/mismatch/clip_frac", correction.clipped.float(), terms.mask)
        if correction.seq_clipped is not None:
            sums.add(
                "rollout/mismatch/seq_clip_frac", float(correction.seq_clipped[rows].float().mean()), n_rows
            )


def _value_backward(
    critic: Any,
    mb: TokenBatch,
    mask: torch.Tensor,
    loss: _Loss,
    plan: ForwardPlan,
    vtotals: dict[str, float],
    sums: _Sums,
) -> None:
    """The clipped value loss of one micro-batch backward."""
    algo = loss.algo
    with plan.autocast():
        values = forward_values(critic, mb)
    # T-PPO trains the value model on finished rows only (mb.value_mask, within mask).
    vmask = mask if mb.value_mask is None else mask & mb.value_mask.bool()
    vout = clipped_value_loss(values, mb.old_values, mb.returns, vmask, clip=algo.value_clip)
    vloss = algo.value_loss_coef * loss.aggregate(vout.loss, vmask, vtotals)
    vloss.backward()
    sums.add_masked("critic/value_loss", vout.loss, vmask)
    sums.add_masked("critic/clip_frac", vout.clipped.float(), vmask)
    sums.add_masked("critic/value_mean", values, vmask)


def _optimizer_step(state: UpdateState, dp: Any, max_grad_norm: float | None, sums: _Sums) -> None:
    """Sum the gradients over the data-parallel ranks (``dp`` None: one learner), then step the
    policy and the critic."""
    if dp is not None:
        dp.reduce_gradients(state.policy)
        if state.critic is not None:
            dp.reduce_gradients(state.critic)
    sums.add("actor/grad_norm", _step(state.policy, state.optimizer, state.scheduler, max_grad_norm), 1)
    if state.critic is not None:
        norm = _step(state.critic, state.critic_optimizer, state.critic_scheduler, max_grad_norm)
        sums.add("critic/grad_norm", norm, 1)


def _totals(mask: torch.Tensor) -> dict[str, float]:
    return {"num_tokens": float(mask.sum()), "num_sequences": float(mask.any(dim=1).sum())}


def _step(model: Any, optimizer: Any, scheduler: Any, max_grad_norm: float | None) -> float:
    params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    else:
        norm = (
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
            if params
            else torch.zeros(())
        )
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    # Sharded (FSDP2) parameters give the global norm as a replicated DTensor.
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
