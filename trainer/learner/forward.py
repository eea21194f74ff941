"""Forward passes of the learner: per-token logprobs (padded, shared-prompt or packed) and values
of a :class:`~chatgym.trainer.learner.batch.TokenBatch` under a model, and the no-gradient pass over a
whole batch in micro-batches (reference, old-policy logprobs, values).

All outputs are (B, T) float32 aligned with ``batch.input_ids``: position t holds the logprob of
token t given tokens < t (0 where nothing is predicted or trained).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from chatgym.trainer.algos.entropy import entropy_from_logits
from chatgym.trainer.learner.batch import (
    TokenBatch,
    micro_batches,
    pack_chunks,
    pack_rows,
    prompt_groups,
    shared_prefix_batches,
    shared_prompt_micro_batches,
)
from chatgym.trainer.learner.lm_head import final_hidden_states, packed_head_logprobs, padded_head_logprobs
from chatgym.trainer.learner.logprobs import logits_to_keep, token_logprobs
from chatgym.trainer.models.vlm import image_features, merge_image_features


@dataclass(frozen=True)
class ForwardPlan:
    """How the learner runs a model over a batch.

    Attributes:
        micro_batch_size: rows per forward (gradients are accumulated over micro-batches).
        device: where the micro-batches are moved.
        share_prefix: forward a GRPO group's common prompt once (:func:`forward_logprobs_shared`).
        pack: forward each micro-batch packed without padding (:func:`forward_logprobs_packed`).
        pack_max_tokens: tokens per packed forward at most (see :func:`resolve_pack`).
        autocast: returns a fresh mixed-precision context per forward (no-op by default).
        logprob_chunk_tokens: None (the model's own logits), or positions per chunk of the lm head
            and log-softmax (:func:`~chatgym.trainer.learner.logprobs.chunked_token_logprobs`), in
            the update and in the no-gradient passes (``model.logprob_chunk_tokens``).
        data_parallel: None (one learner), or this rank's share of a data-parallel update: an object
            with ``assign(mini, micro_batches)``, ``reduce_gradients(model)`` and ``reduce_metrics``
            (:class:`chatgym.trainer.distributed.learner.DataParallel`).
    """

    micro_batch_size: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    share_prefix: bool = False
    pack: bool = False
    pack_max_tokens: int = 512  # PACK_MAX_TOKENS
    autocast: Callable[[], Any] = contextlib.nullcontext
    data_parallel: Any = None
    logprob_chunk_tokens: int | None = None


def forward_logprobs(
    model: Any,
    mb: TokenBatch,
    *,
    with_entropy: bool,
    entropy_grad: bool = False,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T) logprobs (and entropies) of ``mb``'s tokens under ``model``; logits are only computed
    from the first trained position on (``logits_to_keep``), skipping the prompt. A batch with images
    feeds the token embeddings with the images' features at the ``<image>`` positions
    (:func:`model_inputs`). ``chunk_tokens``: the lm head runs on the final hidden states of those
    positions ``chunk_tokens`` at a time (:func:`~chatgym.trainer.learner.lm_head.padded_head_logprobs`)
    instead of inside the model."""
    keep = logits_to_keep(mb.loss_mask)
    inputs = {**model_inputs(model, mb), "attention_mask": mb.attention_mask, "use_cache": False}
    if chunk_tokens is not None:
        hidden = final_hidden_states(model, **inputs)[:, -keep:]
        return padded_head_logprobs(
            model,
            hidden,
            mb.input_ids,
            chunk_tokens=chunk_tokens,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )
    out = model(**inputs, logits_to_keep=keep)
    return token_logprobs(out.logits, mb.input_ids, with_entropy=with_entropy, entropy_grad=entropy_grad)


def model_inputs(model: Any, mb: TokenBatch) -> dict[str, torch.Tensor]:
    """``{"input_ids": ...}``, or for a batch with images ``{"inputs_embeds": ...}``: the token
    embeddings with the vision features of ``mb``'s images (vision tower + connector, with gradient
    when they train) written at the ``<image>`` positions, the same merge the engine's prefill does.

    Raises:
        ValueError: the rows' ``<image>`` tokens do not match their images.
    """
    images = mb.images()
    if images is None:
        return {"input_ids": mb.input_ids}
    features = image_features(model, *images)
    return {"inputs_embeds": merge_image_features(model, mb.input_ids, features)}


def forward_logprobs_shared(
    model: Any,
    mb: TokenBatch,
    prefix_len: int,
    *,
    with_entropy: bool,
    entropy_grad: bool = False,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`forward_logprobs` for rows that share their opening prompts by group: each group's
    prompt is run once (all groups' prompts in one forward, right-padded) and its KV cache selected
    for every row of the group, then all rows' continuations run in one forward over that cache (the
    gradient flows through the cache into the prompts' computation, so the result is the same as
    separate forwards up to float rounding, for G times fewer prompt tokens). Two forwards per call
    however many groups ``mb`` holds. Positions before a row's prompt end get 0 (never trained).

    Groups come from ``mb.prompt_lens`` (:func:`~chatgym.trainer.learner.batch.prompt_groups`); a row
    whose loss mask is set inside its prompt shares nothing (its own group, a one-token prompt).
    Without ``prompt_lens``, every row is taken to start with the same ``prefix_len`` tokens.
    ``chunk_tokens``: both forwards give final hidden states (the same positions) and the lm head
    runs on them in chunks, as in :func:`forward_logprobs`.

    Peers: Unsloth's "PrefixGrouper" (unslothai/unsloth#6871) and NeMo-RL's shared-prefix GRPO
    training (NVIDIA-NeMo/RL#4008) do the same with custom attention masks; here the stock KV cache
    does it for any Hugging Face causal LM. Checked against plain forwards in ``tests/test_trainer.py``.
    """
    from transformers import DynamicCache

    rows, length = mb.input_ids.shape
    device = mb.input_ids.device
    groups = _shareable_groups(mb, prefix_len)
    prompt_len = torch.tensor([p for _, p in groups], device=device)  # (G,)
    width = int(prompt_len.max())
    cols = torch.arange(width, device=device)
    prompt_mask = (cols[None, :] < prompt_len[:, None]).long()  # (G, width)
    first_row = torch.tensor([g[0] for g, _ in groups], device=device)
    prompts = mb.input_ids[first_row, :width] * prompt_mask
    group_of = torch.empty(rows, dtype=torch.long, device=device)
    for g, (members, _) in enumerate(groups):
        group_of[members] = g
    cache = DynamicCache(config=getattr(model, "config", None))
    head_out = _prompt_heads(model, prompts, prompt_mask, prompt_len, cache, chunk_tokens)
    cache.batch_select_indices(group_of)
    starts = prompt_len[group_of]  # (B,) where each row's continuation begins
    span = max(int((mb.lengths.to(device) - starts).max()), 1)
    index = (starts[:, None] + torch.arange(span, device=device)[None, :]).clamp(max=length - 1)
    inside = (starts[:, None] + torch.arange(span, device=device)[None, :]) < length
    suffix_mask = mb.attention_mask.gather(1, index) * inside
    tail_inputs = {
        "input_ids": mb.input_ids.gather(1, index),
        "attention_mask": torch.cat([prompt_mask[group_of], suffix_mask], dim=1),
        "position_ids": starts[:, None] + torch.arange(span, device=device)[None, :],
        "past_key_values": cache,
        "use_cache": True,
    }
    tail_out = (
        model(**tail_inputs).logits if chunk_tokens is None else final_hidden_states(model, **tail_inputs)
    )
    # Window of each row: positions start-1 .. start+span-1; out[j] predicts window token j+1.
    out = torch.cat([head_out[group_of][:, None], tail_out], dim=1)
    window = (starts[:, None] - 1 + torch.arange(span + 1, device=device)[None, :]).clamp(max=length - 1)
    ids = mb.input_ids.gather(1, window)
    if chunk_tokens is None:
        lp, ent = token_logprobs(out, ids, with_entropy=with_entropy, entropy_grad=entropy_grad)
    else:
        lp, ent = padded_head_logprobs(
            model, out, ids, chunk_tokens=chunk_tokens, with_entropy=with_entropy, entropy_grad=entropy_grad
        )
    return _unwindow(lp, starts - 1, length), (
        _unwindow(ent, starts - 1, length) if ent is not None else None
    )


def _prompt_heads(
    model: Any,
    prompts: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_len: torch.Tensor,
    cache: Any,
    chunk_tokens: int | None,
) -> torch.Tensor:
    """The shared prompts' forward of :func:`forward_logprobs_shared` (filling ``cache``): each
    prompt's last position, which predicts its first answer token: (G, V) logits, or with
    ``chunk_tokens`` (G, H) final hidden states."""
    inputs = {
        "input_ids": prompts,
        "attention_mask": prompt_mask,
        "past_key_values": cache,
        "use_cache": True,
    }
    rows = torch.arange(len(prompts), device=prompts.device)
    if chunk_tokens is not None:
        return final_hidden_states(model, **inputs)[rows, prompt_len - 1]
    keep = torch.unique(prompt_len - 1)
    head = model(**inputs, logits_to_keep=keep)
    return head.logits[rows, torch.searchsorted(keep, prompt_len - 1)]


def _shareable_groups(mb: TokenBatch, prefix_len: int) -> list[tuple[list[int], int]]:
    """``[(rows, prompt_len)]`` for :func:`forward_logprobs_shared`: prompt lengths >= 1, never over
    a trained position."""
    if mb.prompt_lens is None:
        return [(list(range(len(mb))), max(1, prefix_len))]
    out = []
    for members, p in prompt_groups(mb):
        if p >= 1 and not bool(mb.loss_mask[members, :p].any()):
            out.append((members, p))
        else:  # share nothing: position 0 is never predicted, so a one-token prompt changes no logprob
            out.extend(([r], 1) for r in members)
    return out


def _unwindow(values: torch.Tensor, offsets: torch.Tensor, length: int) -> torch.Tensor:
    """(B, W) values of windows starting at column ``offsets[b]`` placed into (B, length) zeros;
    window columns past ``length`` are dropped."""
    rows, width = values.shape
    out = torch.zeros(rows, length + width, dtype=values.dtype, device=values.device)
    cols = offsets[:, None] + torch.arange(width, device=values.device)[None, :]
    return out.scatter(1, cols, values)[:, :length]


# Packed tokens per forward at most: SDPA computes the block-diagonal mask as a dense (N, N)
# attention, so a longer pack spends more on masked-out scores. SmolLM2-135M forward+backward on 2
# cores of a Xeon (fp32): 169 tokens/s in packs of 348 tokens, 157 at 696, 118 at 1392. 512 holds a
# main-job group (a 57-token prompt + 8 answers of <= 64 tokens, ~300 tokens) in one pack.
PACK_MAX_TOKENS = 512
# On CUDA a forward is launch-bound well past 512 tokens for a small model, so fewer, longer packs
# win until the masked-out attention costs as much as the rest: for SmolLM2-135M (30 layers, hidden
# 576) the dense (N, N) scores cost 4*576*N flops per token per layer against ~7M for the linear
# layers, i.e. as much at N ~ 3000. 2048 holds a vs-TRL group (a ~60-token prompt + 8 answers of
# <= 128 tokens, <= 1100 tokens) in one pack; benchmarks/train_step_gpu.py sweeps the size.
PACK_MAX_TOKENS_CUDA = 2048


def resolve_pack(pack: bool | str, max_tokens: int | None, device: torch.device) -> tuple[bool, int]:
    """``model.pack`` and ``model.pack_max_tokens`` for the training ``device``: ``(pack, max_tokens)``.

    ``pack`` ``auto`` is packed on CPU (the layout benchmarks/train_step_cpu.py measured fastest there)
    and padded on CUDA until benchmarks/train_step_gpu.py has measured it on the H200; ``max_tokens``
    None is :data:`PACK_MAX_TOKENS` on CPU, :data:`PACK_MAX_TOKENS_CUDA` on CUDA."""
    if pack == "auto":
        pack = device.type == "cpu"  # the one line to change when packed wins on CUDA too
    default = PACK_MAX_TOKENS if device.type == "cpu" else PACK_MAX_TOKENS_CUDA
    return bool(pack), int(max_tokens or default)


def _packed_attention_mask(model: Any, allowed: torch.Tensor) -> torch.Tensor:
    """The 4D mask in the form the model's attention takes it: bool for SDPA (True = attend), an
    additive mask (0 / the dtype's min) in the model's dtype for eager attention — float32's min cast
    to bfloat16 would round to -inf (it is above bf16's largest finite value), as transformers' own
    masks avoid by taking ``finfo(model dtype).min``."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa")
    if impl == "sdpa":
        return allowed
    dtype = getattr(model, "dtype", torch.float32)
    if not dtype.is_floating_point:
        dtype = torch.float32
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )


def forward_logprobs_packed(
    model: Any,
    mb: TokenBatch,
    prefix_len: int = 0,
    *,
    with_entropy: bool,
    entropy_grad: bool = False,
    max_tokens: int = PACK_MAX_TOKENS,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`forward_logprobs` (and :func:`forward_logprobs_shared` when ``prefix_len`` > 0), with
    ``mb``'s rows packed into one sequence per forward (:func:`~chatgym.trainer.learner.batch.pack_rows`):
    position ids restart per row, a block-diagonal causal 4D mask keeps rows apart, the shared prompt
    (if any) is laid down once, and logits are computed only at the positions that predict trained
    tokens (``logits_to_keep`` as an index tensor). No padding token is ever computed, and neither is
    the lm-head / log-softmax of an untrained position.

    Runs of rows are packed up to ``max_tokens`` tokens each (:func:`~chatgym.trainer.learner.batch.pack_chunks`).
    ``chunk_tokens``: the lm head runs on the final hidden states of the kept positions in chunks
    (:func:`~chatgym.trainer.learner.lm_head.packed_head_logprobs`).

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
        inputs = {
            "input_ids": packed.input_ids,
            "attention_mask": _packed_attention_mask(model, packed.attention_mask()),
            "position_ids": packed.position_ids,
            "use_cache": False,
        }
        if chunk_tokens is not None:
            hidden = final_hidden_states(model, **inputs)[0, packed.logit_index]  # (K, H)
            lp, ent = packed_head_logprobs(
                model,
                hidden,
                packed.targets,
                chunk_tokens=chunk_tokens,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
            )
            lp_parts.append(lp)
            ent_parts.append(ent)
        else:
            out = model(**inputs, logits_to_keep=packed.logit_index)
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
    pack: bool = False,
    *,
    data_parallel: Any = None,
    lockstep: bool = False,
) -> torch.Tensor:
    """Run ``fn(micro_batch, prefix_len)`` (no gradient) over ``batch``; returns its (B, T) output on
    CPU. ``prefix_len`` is the shared prompt length of the micro-batch's rows (0: not shared; see
    :func:`micro_batch_plan`).

    With ``data_parallel`` (a learner rank's :class:`~chatgym.trainer.distributed.data_parallel.DataParallel`)
    each micro-batch of the same plan runs on exactly one rank (``assign``) and the ranks' rows are
    merged (``merge_rows``): every rank gets the whole (B, T) output, each token computed once, in the
    micro-batch it would have had on one learner (so the values are the one-learner values bit for
    bit). ``lockstep``: ``fn``'s model is FSDP-sharded, so every rank runs as many forwards (a rank
    with fewer micro-batches repeats its smallest one and drops the result)."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    plan = micro_batch_plan(batch, micro_batch_size, share_prefix, pack)
    if data_parallel is None:
        mine = [(rows, p, True) for rows, p in plan]
    else:
        mine = data_parallel.assign(batch, plan, lockstep=lockstep)
    for rows, prefix_len, active in mine:
        mb = batch.select(rows).to(device)
        values = fn(mb, prefix_len)
        if active:
            out[rows, : mb.input_ids.shape[1]] = values.float().cpu()
    if data_parallel is None:
        return out
    data_parallel.prepared_rows += sum(len(rows) for rows, _, active in mine if active)
    return data_parallel.merge_rows(out)


def micro_batch_plan(
    batch: TokenBatch, micro_batch_size: int, share_prefix: bool, pack: bool = False
) -> list[tuple[list[int], int]]:
    """``[(rows, prefix_len)]``: length-sorted rows, or with ``share_prefix`` rows sharing a prompt:
    one group per micro-batch when packed (the pack lays that prompt down once), several whole
    groups per micro-batch when padded (:func:`forward_logprobs_shared` runs them together)."""
    if share_prefix and pack:
        return shared_prefix_batches(batch, micro_batch_size)
    if share_prefix:
        return shared_prompt_micro_batches(batch, micro_batch_size)
    return [(rows, 0) for rows in micro_batches(batch.lengths, micro_batch_size)]


def policy_logprobs(
    model: Any,
    mb: TokenBatch,
    prefix_len: int,
    *,
    with_entropy: bool,
    entropy_grad: bool = False,
    pack: bool = False,
    pack_max_tokens: int = PACK_MAX_TOKENS,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`forward_logprobs_packed` with ``pack`` (packs of <= ``pack_max_tokens``), else
    :func:`forward_logprobs_shared` when ``prefix_len`` > 0, else :func:`forward_logprobs`, each with
    the lm head in chunks of ``chunk_tokens`` positions when set. A micro-batch with images always
    takes :func:`forward_logprobs` (padded, every row whole: its images' features are merged into its
    own embeddings) with the model's own logits: ``chunk_tokens`` is not applied there (a VLM's
    image micro-batch keeps the plain head)."""
    if mb.images() is not None:
        return forward_logprobs(model, mb, with_entropy=with_entropy, entropy_grad=entropy_grad)
    if pack:
        return forward_logprobs_packed(
            model,
            mb,
            prefix_len,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            max_tokens=pack_max_tokens,
            chunk_tokens=chunk_tokens,
        )
    if prefix_len:
        return forward_logprobs_shared(
            model,
            mb,
            prefix_len,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            chunk_tokens=chunk_tokens,
        )
    return forward_logprobs(
        model, mb, with_entropy=with_entropy, entropy_grad=entropy_grad, chunk_tokens=chunk_tokens
    )


def batch_logprobs(
    model: Any, batch: TokenBatch, plan: ForwardPlan, *, sharded_model: bool = True
) -> torch.Tensor:
    """(B, T) float32 logprobs of ``batch``'s tokens under ``model``, no gradient, on CPU (the
    old-policy and reference passes). With ``plan.data_parallel`` each rank runs its share of the
    micro-batches (:func:`per_token_pass`); ``sharded_model`` False says ``model`` is a full copy on
    every rank (the reference) even under FSDP, so no lockstep passes are needed."""

    def fn(mb: TokenBatch, prefix_len: int) -> torch.Tensor:
        with plan.autocast():
            return policy_logprobs(
                model,
                mb,
                prefix_len,
                with_entropy=False,
                pack=plan.pack,
                pack_max_tokens=plan.pack_max_tokens,
                chunk_tokens=plan.logprob_chunk_tokens,
            )[0]

    dp = plan.data_parallel
    return per_token_pass(
        fn,
        batch,
        plan.micro_batch_size,
        plan.device,
        plan.share_prefix,
        plan.pack,
        data_parallel=dp,
        lockstep=dp is not None and dp.sharded and sharded_model,
    )


def batch_values(critic: Any, batch: TokenBatch, plan: ForwardPlan) -> torch.Tensor:
    """(B, T) float32 values of ``batch`` under ``critic`` (:func:`forward_values`), no gradient, on CPU
    (each data-parallel rank its share, as :func:`batch_logprobs`)."""

    def fn(mb: TokenBatch, prefix_len: int) -> torch.Tensor:
        with plan.autocast():
            return forward_values(critic, mb)

    dp = plan.data_parallel
    return per_token_pass(
        fn,
        batch,
        plan.micro_batch_size,
        plan.device,
        data_parallel=dp,
        lockstep=dp is not None and dp.sharded,
    )
