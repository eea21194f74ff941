"""One RL update on a batch of trajectories: rewards -> advantages -> policy (and value) loss ->
optimizer step. Pure orchestration of :mod:`chatgym.trainer.algos` around the models; the loop in
:mod:`chatgym.trainer.train` calls these.

Logprobs of the behaviour policy: when each rollout batch is used for exactly one optimizer step
(``ppo_epochs = mini_batches = 1``, the default), the policy before the step *is* the behaviour
policy, so ``old_logprobs = logprobs.detach()`` from the same forward pass — no extra pass. The
engine's own logprobs differ slightly (other kernels, bf16); the truncated importance-sampling weight
``min(exp(old − engine), C)`` corrects for that. With several updates per batch, one no-grad pass
computes ``old_logprobs`` first.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .algos import (
    aggregate_loss,
    apply_kl_penalty,
    clipped_value_loss,
    get_advantage_estimator,
    get_kl_estimator,
    get_policy_loss,
    mask_truncated,
    missing_eos_penalty,
    overlong_reward_penalty,
    truncated_is_weights,
)
from .algos.entropy import entropy_from_logits
from .algos.masked import masked_sum
from .batch import TokenBatch, micro_batches, pack_chunks, pack_rows, shared_prefix_batches
from .config import AlgoConfig
from .logprobs import logits_to_keep, token_logprobs
from .types import Trajectory

BUDGETS = ("max_tokens", "max_response_tokens", "max_model_len")


def hit_budget(traj: Trajectory) -> bool:
    """True when the trajectory ended because a token budget ran out, not with EOS: its last turn
    finished with ``length``, or the collector truncated it by a token budget before a turn."""
    if traj.finish_reasons and traj.finish_reasons[-1] == "length":
        return True
    return bool(traj.truncated and traj.info.get("truncated_by") in BUDGETS)


def is_correct(traj: Trajectory) -> bool:
    """Whether the episode solved its task: the env's ``reward_components`` ``correct``/``pass``
    score (else the reward) is at least 1."""
    components = traj.info.get("reward_components") or {}
    score = components.get("correct", components.get("pass", traj.reward))
    try:
        return float(score) >= 1.0 - 1e-9
    except (TypeError, ValueError):
        return False


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
    keep = []
    for rows in by_group.values():
        values = rewards[rows]
        if bool((values != values[0]).any()):
            keep.extend(rows)
    return sorted(keep)


def place_turn_rewards(trajs: Sequence[Trajectory], rewards: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """(B, T) token rewards: each turn's reward on the last token it generated.

    A trajectory's generated tokens form one run of loss-mask 1s per assistant turn; when there are
    as many runs as ``traj.rewards`` entries, turn k's reward goes on run k's last token (so
    token-level estimators credit dense rewards to the turn that earned them). Any difference between
    ``rewards[i]`` (shaped) and the sum of the turn rewards goes on the last generated token; a row
    without generated tokens gets its reward on its last position (outcome estimators sum rows).
    """
    mask = batch.loss_mask
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for i, traj in enumerate(trajs):
        row = mask[i]
        ends = (row & ~torch.nn.functional.pad(row[1:], (0, 1))).nonzero().flatten().tolist()
        if not ends:
            out[i, max(int(batch.attention_mask[i].sum()) - 1, 0)] = rewards[i]
            continue
        placed = 0.0
        if len(ends) == len(traj.rewards):
            for end, r in zip(ends, traj.rewards, strict=True):
                out[i, end] += float(r)
                placed += float(r)
        out[i, ends[-1]] += float(rewards[i]) - placed
    return out


def forward_logprobs(
    model: Any, mb: TokenBatch, *, with_entropy: bool, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T) logprobs (and entropies) of ``mb``'s tokens under ``model``; logits are only computed
    from the first trained position on (``logits_to_keep``), skipping the prompt."""
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        logits_to_keep=logits_to_keep(mb.loss_mask),
        use_cache=False,
    )
    return token_logprobs(out.logits, mb.input_ids, with_entropy=with_entropy, entropy_grad=entropy_grad)


def forward_logprobs_shared(
    model: Any, mb: TokenBatch, prefix_len: int, *, with_entropy: bool, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`forward_logprobs` for rows that all start with the same ``prefix_len`` prompt tokens:
    the prompt is run once and its KV cache repeated for every row (the gradient flows through the
    cache into the prompt's computation, so the result is the same as separate forwards up to float
    rounding, for G times fewer prompt tokens). Positions before ``prefix_len`` get 0 (never trained).

    Peers: Unsloth's "PrefixGrouper" (unslothai/unsloth#6871) and NeMo-RL's shared-prefix GRPO
    training (NVIDIA-NeMo/RL#4008) do the same with custom attention masks; here the stock KV cache
    does it for any Hugging Face causal LM. Checked against plain forwards in ``tests/test_trainer.py``.
    """
    from transformers import DynamicCache

    rows, length = mb.input_ids.shape
    config = getattr(model, "config", None)
    cache = DynamicCache(config=config)
    prompt = mb.input_ids[:1, :prefix_len]
    head = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(rows)
    suffix = mb.input_ids[:, prefix_len:]
    positions = torch.arange(prefix_len, length, device=suffix.device).expand(rows, -1)
    tail = model(
        input_ids=suffix,
        attention_mask=mb.attention_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    )
    # Positions prefix_len-1 .. T-1: the prompt's last one (predicts token prefix_len), then the
    # suffix's (the very last predicts nothing and is dropped by token_logprobs).
    logits = torch.cat([head.logits[:, -1:].expand(rows, 1, -1), tail.logits], dim=1)
    lp, ent = token_logprobs(
        logits, mb.input_ids[:, prefix_len - 1 :], with_entropy=with_entropy, entropy_grad=entropy_grad
    )
    pad = (prefix_len - 1, 0)
    logprobs = torch.nn.functional.pad(lp, pad)
    entropy = torch.nn.functional.pad(ent, pad) if ent is not None else None
    return logprobs, entropy


# Packed tokens per forward at most: SDPA computes the block-diagonal mask as a dense (N, N)
# attention, so a longer pack spends more on masked-out scores. SmolLM2-135M forward+backward on 2
# cores of a Xeon (fp32): 169 tokens/s in packs of 348 tokens, 157 at 696, 118 at 1392. 512 holds a
# main-job group (a 57-token prompt + 8 answers of <= 64 tokens, ~300 tokens) in one pack.
PACK_MAX_TOKENS = 512


def _packed_attention_mask(model: Any, allowed: torch.Tensor) -> torch.Tensor:
    """The 4D mask in the form the model's attention takes it: bool for SDPA (True = attend), an
    additive float mask (0 / dtype min) for eager attention."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa")
    if impl == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(torch.float32).min
    )


def forward_logprobs_packed(
    model: Any,
    mb: TokenBatch,
    prefix_len: int = 0,
    *,
    with_entropy: bool,
    entropy_grad: bool = False,
    max_tokens: int = PACK_MAX_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`forward_logprobs` (and :func:`forward_logprobs_shared` when ``prefix_len`` > 0), with
    ``mb``'s rows packed into one sequence per forward (:func:`~chatgym.trainer.batch.pack_rows`):
    position ids restart per row, a block-diagonal causal 4D mask keeps rows apart, the shared prompt
    (if any) is laid down once, and logits are computed only at the positions that predict trained
    tokens (``logits_to_keep`` as an index tensor). No padding token is ever computed, and neither is
    the lm-head / log-softmax of an untrained position.

    Runs of rows are packed up to ``max_tokens`` tokens each (:func:`~chatgym.trainer.batch.pack_chunks`).

    Returns:
        ``(logprobs, entropy)``: (B, T) float32; values only at ``mb.loss_mask`` positions (0 elsewhere),
        which is all the losses and KL terms read. ``entropy`` is None unless asked for.

    Packing with position ids and a block mask is how TRL (``padding_free``), verl (``use_remove_padding``)
    and OpenRLHF (``packing_samples``) train without padding; with a shared prompt it is the
    PrefixGrouper layout. Checked against padded forwards in ``tests/test_packing.py``.
    """
    rows_out, cols_out, lp_parts, ent_parts = [], [], [], []
    for chunk in pack_chunks(mb.lengths, prefix_len, max_tokens):
        sub = mb.select(chunk) if len(chunk) < len(mb) else mb
        packed = pack_rows(sub, prefix_len)
        if packed.targets.numel() == 0:
            continue
        out = model(
            input_ids=packed.input_ids,
            attention_mask=_packed_attention_mask(model, packed.attention_mask()),
            position_ids=packed.position_ids,
            logits_to_keep=packed.logit_index,
            use_cache=False,
        )
        logits = out.logits[0].float()  # (K, V)
        lp_parts.append(
            logits.gather(-1, packed.targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        )
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent_parts.append(entropy_from_logits(logits))
        index = torch.as_tensor(chunk, dtype=torch.long, device=packed.rows.device)
        rows_out.append(index[packed.rows])
        cols_out.append(packed.cols)
    shape = mb.input_ids.shape
    device = mb.input_ids.device
    if not lp_parts:
        zeros = torch.zeros(shape, dtype=torch.float32, device=device)
        return zeros, (zeros.clone() if with_entropy else None)
    where = (torch.cat(rows_out), torch.cat(cols_out))
    logprobs = torch.zeros(shape, dtype=torch.float32, device=device).index_put(where, torch.cat(lp_parts))
    entropy = None
    if with_entropy:
        entropy = torch.zeros(shape, dtype=torch.float32, device=device).index_put(
            where, torch.cat(ent_parts)
        )
    return logprobs, entropy


def forward_values(critic: Any, mb: TokenBatch) -> torch.Tensor:
    """(B, T) float32 values aligned like logprobs: position t holds V(tokens < t) (head on t−1)."""
    out = critic(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    values = out.logits.squeeze(-1).float()
    return torch.nn.functional.pad(values[:, :-1], (1, 0))


@torch.no_grad()
def per_token_pass(
    fn: Callable[[TokenBatch, int], torch.Tensor],
    batch: TokenBatch,
    micro_batch_size: int,
    device: torch.device,
    share_prefix: bool = False,
) -> torch.Tensor:
    """Run ``fn(micro_batch, prefix_len)`` (no gradient) over ``batch``; returns its (B, T) output on
    CPU. ``prefix_len`` is the shared prompt length of the micro-batch's rows (0: not shared)."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    for rows, prefix_len in micro_batch_plan(batch, micro_batch_size, share_prefix):
        mb = batch.select(rows).to(device)
        out[rows, : mb.input_ids.shape[1]] = fn(mb, prefix_len).float().cpu()
    return out


def micro_batch_plan(
    batch: TokenBatch, micro_batch_size: int, share_prefix: bool
) -> list[tuple[list[int], int]]:
    """``[(rows, prefix_len)]``: groups sharing a prompt when ``share_prefix``, else length-sorted rows."""
    if share_prefix:
        return shared_prefix_batches(batch, micro_batch_size)
    return [(rows, 0) for rows in micro_batches(batch.lengths, micro_batch_size)]


def policy_logprobs(
    model: Any,
    mb: TokenBatch,
    prefix_len: int,
    *,
    with_entropy: bool,
    entropy_grad: bool = False,
    pack: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`forward_logprobs_packed` with ``pack``, else :func:`forward_logprobs_shared` when
    ``prefix_len`` > 0, else :func:`forward_logprobs`."""
    if pack:
        return forward_logprobs_packed(
            model, mb, prefix_len, with_entropy=with_entropy, entropy_grad=entropy_grad
        )
    if prefix_len:
        return forward_logprobs_shared(
            model, mb, prefix_len, with_entropy=with_entropy, entropy_grad=entropy_grad
        )
    return forward_logprobs(model, mb, with_entropy=with_entropy, entropy_grad=entropy_grad)


def compute_advantages(
    batch: TokenBatch, token_rewards: torch.Tensor, group_ids: torch.Tensor, algo: AlgoConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Apply KL-in-reward when configured, then the advantage estimator.

    Returns ``(advantages, returns, kl_in_reward)`` (B, T); ``kl_in_reward`` is the per-token KL
    that was subtracted (None when off). The behaviour policy of the KL is the engine's logprobs.
    """
    kl = None
    if algo.kl_in_reward and algo.kl_coef > 0:
        token_rewards, kl = apply_kl_penalty(
            token_rewards,
            batch.engine_logprobs,
            batch.ref_logprobs,
            batch.loss_mask,
            coef=algo.kl_coef,
            estimator=algo.kl_estimator,
        )
    estimator = get_advantage_estimator(algo.advantage)
    advantages, returns = estimator(
        token_rewards.double(),
        batch.loss_mask,
        group_ids=group_ids,
        values=None if batch.old_values is None else batch.old_values.double(),
        **algo.advantage_kwargs,
    )
    return advantages.float(), returns.float(), kl


class _Sums:
    """Token- or row-weighted running means for metrics over micro-batches."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.weight: dict[str, float] = defaultdict(float)

    def add(self, name: str, value: torch.Tensor | float, weight: float) -> None:
        self.total[name] += float(value) * weight
        self.weight[name] += weight

    def add_masked(self, name: str, values: torch.Tensor, mask: torch.Tensor) -> None:
        count = float(mask.sum())
        if count:
            self.total[name] += float(masked_sum(values.detach().float(), mask))
            self.weight[name] += count

    def means(self) -> dict[str, float]:
        return {k: self.total[k] / self.weight[k] for k in self.total if self.weight[k]}


@dataclass
class Models:
    """What an update touches: the policy, its optimizer/scheduler, and optionally a critic with its own."""

    policy: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    critic: Any = None
    critic_optimizer: torch.optim.Optimizer | None = None
    critic_scheduler: Any = None


def update(
    models: Models,
    batch: TokenBatch,
    algo: AlgoConfig,
    *,
    micro_batch_size: int,
    max_grad_norm: float | None,
    device: torch.device,
    generator: torch.Generator,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    share_prefix: bool = False,
    pack: bool = False,
) -> dict[str, float]:
    """``ppo_epochs`` passes of ``mini_batches`` optimizer steps over ``batch`` (on CPU; micro-batches
    are moved to ``device``). ``batch`` must carry ``advantages`` (and ``returns``/``old_values`` for
    a critic, ``ref_logprobs`` for a KL loss, ``old_logprobs`` when there is more than one step).
    With ``share_prefix``, the rows of a GRPO group are forwarded together with their common prompt
    computed once (:func:`forward_logprobs_shared`; not with gradient checkpointing, which turns the
    KV cache off). With ``pack``, each micro-batch's rows are forwarded packed without padding
    (:func:`forward_logprobs_packed`; with ``share_prefix`` the group's prompt appears once in the pack).

    Returns:
        Metrics (token-weighted means over the batch): ``actor/pg_loss``, ``actor/kl``,
        ``actor/entropy``, ``actor/clip_frac``, ``actor/dual_clip_frac``, ``actor/ratio_max``,
        ``actor/tis_weight``, ``actor/engine_kl`` (k3 between trainer and engine logprobs),
        ``actor/grad_norm``, ``actor/lr``, and ``critic/*`` with a critic.
    """
    policy_loss = get_policy_loss(algo.policy_loss)
    kl_fn = get_kl_estimator(algo.kl_estimator)
    kl_loss = algo.kl_coef > 0 and not algo.kl_in_reward
    agg = {"mode": algo.loss_agg, "norm_constant": algo.loss_norm_constant}
    sums = _Sums()
    lr = models.optimizer.param_groups[0]["lr"]  # the rate this update's first step uses
    ratio_max = 0.0
    steps = 0
    for _ in range(algo.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for chunk in order.chunk(algo.mini_batches):
            mini = batch.select(chunk)
            n_tokens = float(mini.loss_mask.sum())
            n_seqs = float(mini.loss_mask.any(dim=1).sum())
            if n_tokens == 0:
                continue
            totals = {"num_tokens": n_tokens, "num_sequences": n_seqs}
            for rows, prefix_len in micro_batch_plan(mini, micro_batch_size, share_prefix):
                mb = mini.select(rows).to(device)
                mask = mb.loss_mask
                with autocast():
                    logp, entropy = policy_logprobs(
                        models.policy,
                        mb,
                        prefix_len,
                        with_entropy=True,
                        entropy_grad=algo.entropy_coef > 0,
                        pack=pack,
                    )
                old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
                weights = (
                    truncated_is_weights(old, mb.engine_logprobs, mask, cap=algo.tis_cap)
                    if algo.tis_cap is not None
                    else None
                )
                out = policy_loss(
                    logp, old, mb.advantages, mask, is_weights=weights, **algo.policy_loss_kwargs
                )
                loss = aggregate_loss(out.loss, mask, **agg, **totals)
                sums.add_masked("actor/pg_loss", out.loss, mask)
                if mb.ref_logprobs is not None:
                    kl = kl_fn(logp, mb.ref_logprobs, mask)
                    if kl_loss:
                        loss = loss + algo.kl_coef * aggregate_loss(kl, mask, **agg, **totals)
                    sums.add_masked("actor/kl", kl, mask)
                if algo.entropy_coef > 0:
                    loss = loss - algo.entropy_coef * aggregate_loss(entropy, mask, **agg, **totals)
                loss.backward()
                sums.add_masked("actor/entropy", entropy, mask)
                sums.add_masked("actor/clip_frac", out.clipped.float(), mask)
                sums.add_masked("actor/dual_clip_frac", out.dual_clipped.float(), mask)
                engine_kl = get_kl_estimator("k3")(logp.detach(), mb.engine_logprobs, mask)
                sums.add_masked("actor/engine_kl", engine_kl, mask)
                if weights is not None:
                    sums.add_masked("actor/tis_weight", weights, mask)
                if bool(mask.any()):
                    ratio_max = max(ratio_max, float(out.ratio[mask].max()))
                if models.critic is not None:
                    with autocast():
                        values = forward_values(models.critic, mb)
                    vout = clipped_value_loss(values, mb.old_values, mb.returns, mask, clip=algo.value_clip)
                    vloss = algo.value_loss_coef * aggregate_loss(vout.loss, mask, **agg, **totals)
                    vloss.backward()
                    sums.add_masked("critic/value_loss", vout.loss, mask)
                    sums.add_masked("critic/clip_frac", vout.clipped.float(), mask)
                    sums.add_masked("critic/value_mean", values, mask)
            sums.add(
                "actor/grad_norm", _step(models.policy, models.optimizer, models.scheduler, max_grad_norm), 1
            )
            if models.critic is not None:
                norm = _step(models.critic, models.critic_optimizer, models.critic_scheduler, max_grad_norm)
                sums.add("critic/grad_norm", norm, 1)
            steps += 1
    metrics = sums.means()
    metrics["actor/ratio_max"] = ratio_max
    metrics["actor/optimizer_steps"] = steps
    metrics["actor/lr"] = lr
    return metrics


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
    return float(norm)


def truncation_mask(batch: TokenBatch, trajs: Sequence[Trajectory]) -> TokenBatch:
    """``batch`` with the loss mask of budget-truncated trajectories zeroed (DAPO overlong filtering)."""
    truncated = torch.tensor([hit_budget(t) for t in trajs])
    batch.loss_mask = mask_truncated(batch.loss_mask, truncated)
    return batch
