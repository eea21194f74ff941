"""Per-token logprobs (and entropies) of a causal LM's own tokens, from its logits
(:func:`token_logprobs`) or from its final hidden states and lm head, a chunk of positions at a time
(:func:`head_token_logprobs`, :func:`chunked_token_logprobs`: ``model.logprob_chunk_tokens``).

Alignment: position t of the output describes token t of ``input_ids`` given tokens ``< t``, i.e. it
comes from the logits at position t-1 — the same positions as ``Trajectory.logprobs``. Position 0 has
no prefix and is 0.

The chunked head's costs: one more lm-head matmul per chunk in the backward (the recomputation),
and a weight gradient per chunk that autograd sums into the weight's, so the backward briefly holds
one (V, H) gradient more than the plain head (V·H·4 bytes in fp32: 0.11 GB for SmolLM2, 0.93 GB
for Qwen2.5-1.5B) -- small next to the (N, V) float32 logits it no longer keeps at training sizes
(13 GB for 64 x 1,024 tokens of SmolLM2, and the plain head's backward makes several more of that
size). benchmarks/logprob_memory.py (CPU, fp32): a loss at 256 positions, 3x less peak memory at
2,048.

Why torch's checkpoint and not a hand-written ``autograd.Function``: Liger's fused linear
cross-entropy computes the gradient inside the forward, which needs the loss there (cross-entropy);
these logprobs feed any loss (PPO ratio, KL, entropy bonus), so the gradient is known only in the
backward, where a Function would recompute each chunk exactly as checkpoint does and need the
entropy's gradient derived by hand. Checkpoint gets every gradient (logprob, entropy with or without
its gradient, bias) from the forward's own few lines, with autocast and the early stop of the
recomputation (an entropy taken as a metric is not recomputed) handled by a maintained library; a
Function would only add summing the weight's gradient into one buffer in place.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from chatgym.trainer.algos.entropy import entropy_from_logits

CHUNK_BYTES = 1 << 28  # float32 logits token_logprobs upcasts at a time (256 MiB)


def _first_kept(values: torch.Tensor, input_ids: torch.Tensor, name: str, width: str) -> int:
    """The position of ``values[:, 0]``: ``values`` (B, K, ``width``) describe the last K of
    ``input_ids``' T positions, so T − K.

    Raises:
        ValueError: ``values`` is not (B, K, *) for ``input_ids``' B, or K > T.
    """
    batch, length = input_ids.shape
    if values.dim() != 3 or values.shape[0] != batch:
        raise ValueError(f"{name} must have shape (B={batch}, K, {width}), got {tuple(values.shape)}")
    if values.shape[1] > length:
        raise ValueError(f"{name} covers {values.shape[1]} positions but input_ids has only {length}")
    return length - values.shape[1]


def token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each token under the model that produced ``logits``.

    Args:
        logits: (B, K, V) float (any precision), the logits of the *last* K positions of
            ``input_ids`` (K = T for a full forward; K < T when the model was called with
            ``logits_to_keep=K`` to skip the prompt).
        input_ids: (B, T) long.
        with_entropy: also return the entropy (nats) of each token's predictive distribution.
        entropy_grad: keep the entropy differentiable (an entropy bonus); False computes it as a
            metric only, so no autograd graph over the (B, K, V) softmax is kept alive.
        chunk_rows: rows upcast to float32 at a time (bounds the extra memory to chunk_rows·K·V·4
            bytes); None: as many as fit :data:`CHUNK_BYTES` (at least 1). A row a chunk issued
            ~31 operators a row, forward and backward (64 rows, the entropy as a metric: 1,994
            top-level operators against 43 in one chunk), each a kernel or more on a GPU.

    Returns:
        ``(logprobs, entropy)``: (B, T) float32, differentiable w.r.t. ``logits``; positions
        ``t < T − K + 1`` (no logits for them) are 0; ``entropy`` is None unless asked for.

    Raises:
        ValueError: mismatched batch sizes, K > T, K = 0 (no logits), ``chunk_rows`` < 1.
    """
    first = _first_kept(logits, input_ids, "logits", "V")
    if logits.shape[1] == 0:
        raise ValueError("logits cover no position (K = 0): a forward must keep at least one")
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_BYTES // max(1, 4 * (logits.shape[1] - 1) * logits.shape[2]))
    elif chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    # logits[:, j] (position first + j) predicts token first + j + 1; the last one predicts nothing.
    targets = input_ids[:, first + 1 :]
    lp_parts, ent_parts = [], []
    # Chunks of one split, not a slice each: a slice's backward writes a zero gradient as large as all
    # the logits and autograd adds it into theirs, a fill and an add of (B, K, V) a chunk (SmolLM2, 64
    # rows of 130: 50 of an update's 128 ms of kernels on an H200); a split's backward joins the chunks'
    # gradients in one write.
    for chunk, tgt in zip(logits[:, :-1].split(chunk_rows), targets.split(chunk_rows), strict=True):
        rows = chunk.float()
        tgt = tgt.unsqueeze(-1)
        lp_parts.append(rows.gather(-1, tgt).squeeze(-1) - torch.logsumexp(rows, dim=-1))
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent_parts.append(entropy_from_logits(rows))
    pad = (first + 1, 0)
    logprobs = torch.nn.functional.pad(torch.cat(lp_parts), pad)
    entropy = torch.nn.functional.pad(torch.cat(ent_parts), pad) if with_entropy else None
    return logprobs, entropy


def first_trained_position(loss_mask: torch.Tensor) -> int:
    """Smallest position with a nonzero loss mask in any row (T when none), to size ``logits_to_keep``."""
    cols = loss_mask.any(dim=0).nonzero()
    return int(cols[0]) if len(cols) else loss_mask.shape[1]


def logits_to_keep(loss_mask: torch.Tensor) -> int:
    """How many trailing positions' logits a forward pass needs so every trained token gets a logprob.

    Token t needs the logits at t-1, so K = T − first_trained_position + 1 (at least 1, at most T).
    """
    length = loss_mask.shape[1]
    return max(1, min(length, length - first_trained_position(loss_mask) + 1))


def chunked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    chunk_tokens: int,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each target token under the lm head ``(weight, bias)`` applied to ``hidden``, without
    ever holding more than ``chunk_tokens`` rows of logits, in the forward *or* the backward pass.

    Each chunk of ``<= chunk_tokens`` tokens runs lm-head matmul -> float32 -> log-softmax at its
    target (and the entropy) inside ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``:
    autograd keeps only the chunk's inputs (a view of ``hidden``, ``weight``, ``bias``, ``targets``) and
    the backward recomputes the chunk's logits right before it needs their gradient, so one (chunk, V)
    float32 block (plus its gradient) exists at a time instead of (N, V). The matmul runs under the
    caller's autocast (checkpoint recomputes under the same autocast state), so the values are those of
    ``token_logprobs`` on ``F.linear(hidden, weight, bias)`` up to float rounding (another GEMM
    blocking).

    Costs and the choice of checkpoint over a hand-written ``autograd.Function``: the module docstring.
    Peers: Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss``, torchtune's ``CEWithChunkedOutputLoss``,
    verl's ``use_fused_kernels``.

    Args:
        hidden: (N, H) the final hidden states (after the model's last norm) at the positions whose
            next token is scored; any float dtype.
        weight: (V, H) the lm head's weight (an output embedding tied to the input one is fine).
        bias: (V,) the lm head's bias, or None.
        targets: (N,) long, the token scored at each position.
        chunk_tokens: positions per chunk (>= 1); bounds the live logits to chunk_tokens·V·4 bytes
            (plus the compute-dtype copy and, in the backward, their gradients).
        with_entropy: also return the entropy (nats) of each position's predictive distribution.
        entropy_grad: keep the entropy differentiable; False computes it without a graph (a metric).

    Returns:
        ``(logprobs, entropy)``: (N,) float32, differentiable w.r.t. ``hidden``, ``weight`` and
        ``bias``; ``entropy`` is None unless asked for.

    Raises:
        ValueError: ``chunk_tokens`` < 1, or shapes that do not line up.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden (N, H) and weight (V, H) do not match: {tuple(hidden.shape)}, {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must have shape ({hidden.shape[0]},), got {tuple(targets.shape)}")
    # Without a graph to keep (no-grad passes) there is nothing to recompute: run the chunks directly,
    # which still bounds the live logits to one chunk.
    checkpointed = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias)
    )
    lp_parts, ent_parts = [], []
    # split, not slicing: one SplitBackward concatenates the chunks' hidden-state gradients, where each
    # slice's backward would zero-fill an (N, H) gradient of its own. (N = 0 splits into one empty chunk.)
    for rows, tgt in zip(hidden.split(chunk_tokens), targets.split(chunk_tokens), strict=True):
        args = (rows, weight, bias, tgt)
        if checkpointed:
            # preserve_rng_state=False: the head draws no random numbers, so there is no RNG state
            # to stash and restore per chunk.
            lp, ent = checkpoint(
                _head_chunk, *args, with_entropy, entropy_grad, use_reentrant=False, preserve_rng_state=False
            )
        else:
            lp, ent = _head_chunk(*args, with_entropy, entropy_grad)
        lp_parts.append(lp)
        ent_parts.append(ent)
    entropy = torch.cat(ent_parts) if with_entropy else None
    return torch.cat(lp_parts), entropy


def _head_chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk of :func:`chunked_token_logprobs`: (n,) logprobs and entropies from (n, H) hidden
    states; after the product, the same operations as :func:`token_logprobs` runs on (n, V) logits."""
    # weight @ hidden.T rather than F.linear(hidden, weight): the same product, but the weight's
    # gradient comes out a fresh (V, H) tensor, which autograd adds in place into its sum over the
    # chunks; F.linear's is a transposed view, which it cannot, so the backward held one more (V, H)
    # gradient (0.9 GB at Qwen2.5-1.5B's vocabulary in fp32; measured by benchmarks/logprob_memory.py).
    hidden_t = hidden.t()
    logits_t = torch.mm(weight, hidden_t) if bias is None else torch.addmm(bias[:, None], weight, hidden_t)
    logits = logits_t.t().to(torch.float32, memory_format=torch.contiguous_format)  # (n, V)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if not with_entropy:
        return logprobs, None
    # After the logprobs, so checkpoint's early stop skips a graph-free entropy in the recomputation.
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        return logprobs, entropy_from_logits(logits)


def head_token_logprobs(
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    chunk_tokens: int,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`token_logprobs` from the final hidden states instead of the logits: the same alignment
    and output, the lm head applied chunk by chunk (:func:`chunked_token_logprobs`).

    Args:
        hidden: (B, K, H) the final hidden states of the *last* K positions of ``input_ids``.
        input_ids: (B, T) long.
        weight, bias: the lm head, (V, H) and (V,) or None.
        chunk_tokens, with_entropy, entropy_grad: as :func:`chunked_token_logprobs`.

    Returns:
        ``(logprobs, entropy)``: (B, T) float32 as :func:`token_logprobs` gives them (positions
        ``t < T − K + 1`` are 0).

    Raises:
        ValueError: mismatched batch sizes, K > T, or ``chunk_tokens`` < 1.
    """
    first = _first_kept(hidden, input_ids, "hidden", "H")
    batch, keep = input_ids.shape[0], hidden.shape[1]
    # hidden[:, j] (position first + j) predicts token first + j + 1; the last one predicts nothing.
    # The reshape copies (B, K-1, H) hidden states: H/V of one copy of the logits.
    flat = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    lp, ent = chunked_token_logprobs(
        flat,
        weight,
        bias,
        input_ids[:, first + 1 :].reshape(-1),
        chunk_tokens=chunk_tokens,
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
    )
    pad = (first + 1, 0)
    logprobs = torch.nn.functional.pad(lp.view(batch, keep - 1), pad)
    entropy = torch.nn.functional.pad(ent.view(batch, keep - 1), pad) if ent is not None else None
    return logprobs, entropy
