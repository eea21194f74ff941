"""The transformers engine's ``sampler: philox``: one Triton kernel draws every row's token of a step.

The default sampler (:mod:`.hf_sampling`) reproduces ``torch.multinomial`` with each row's own
``torch.Generator``: one ``exponential_`` launch a seeded row, then a division, an argmax, a
log-softmax, a gather and the packing for the read-back — at 64 rows 0.7-1.3 ms a decode step on an
H100 (``benchmarks/decode_step_gpu.py``; this kernel: 0.11-0.24 ms), against SmolLM2's whole captured
step of 1.7-1.9 ms. Here
one kernel, one program a row, reads the row's logits once in blocks and computes:

* the draw, by the Gumbel-max trick in its exponential form (as ``torch.multinomial``'s one-sample
  path): ``argmax_v (x_v / T - log q_v)`` with ``q_v = -log u_v``, ``u_v`` uniform in [0, 1);
  ``T = 0`` (greedy rows) takes ``argmax_v x_v``, the first one on ties, as ``torch.argmax``;
* ``u_v`` from counter-based Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
  3", SC 2011; as ``triton.language.philox``): key = the row's seed modulo 2**63, counter = (vocabulary index,
  the row's token index as two 32-bit words, 0), first output word as a float in [0, 1) (Triton's
  ``uint_to_uniform_float``). So a row's draws depend on its seed and on how many tokens it drew
  before, never on the rows beside it or on the order of steps;
* the raw logprob of the drawn id (``x_id - logsumexp(x)``, an online log-sum-exp over the blocks),
  which is what the default path reports;
* a validity flag (a nan or +inf logit, or every logit -inf, in a sampled row), as the default path.

It writes the ids twice: as int64 (the next step's inputs) and into the float64 ``[ids | logprobs |
flags]`` buffer the engine reads back in one copy (:func:`.hf_sampling.packed_to_host`), and advances
each row's token counter on the device, so a step launches this kernel and the copy, nothing else.

The ids differ from the default sampler's (another random stream) but follow the same distribution;
rows with top-k / top-p filters are drawn by the default path (the engine falls back for such a step).
Triton runs it on CUDA; the tests run it on the CPU in Triton's interpreter against a NumPy Philox
checked on Random123's known-answer vectors.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BLOCK = 4096  # vocabulary entries a program reads at a time


@dataclass
class PhiloxPlan:
    """The running rows' draw settings on the device (one entry a row, the engine's row order).

    Attributes:
        seeds: ``(rows,)`` int64 Philox keys.
        counts: ``(rows,)`` int64 tokens each row drew before the next draw; each draw adds one.
        inv_temps: ``(rows,)`` float32 ``1 / temperature``, 0 for greedy rows.
    """

    seeds: Any
    counts: Any
    inv_temps: Any


def build_plan(seeds: Sequence[int], counts: Sequence[int], temperatures: Sequence[float], device: Any) -> PhiloxPlan:
    """The :class:`PhiloxPlan` of rows with these seeds (reduced modulo 2**63), token counts and temperatures."""
    from chatgym.trainer.engines.hf_sampling import device_tensor

    return PhiloxPlan(  # Python ints and floats: int64 and float32 tensors
        seeds=device_tensor([s % (1 << 63) for s in seeds], device),
        counts=device_tensor([int(c) for c in counts], device),
        inv_temps=device_tensor([1.0 / t if t > 0 else 0.0 for t in temperatures], device),
    )


def draw(logits: Any, plan: PhiloxPlan) -> tuple[Any, Any]:
    """One id per row from ``logits`` ``(rows, vocab)`` (any float dtype, raw): ``(ids, packed)``, ``ids``
    ``(rows,)`` int64 and ``packed`` ``(3 * rows,)`` float64 ``[ids | raw logprobs | invalid flags]``
    (module doc). Advances ``plan.counts``. Nothing is read back to the host."""
    import torch

    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    ids = torch.empty(n, dtype=torch.int64, device=logits.device)
    packed = torch.empty(3 * n, dtype=torch.float64, device=logits.device)
    _kernel()[(n,)](logits, logits.stride(0), plan.seeds, plan.counts, plan.inv_temps, ids, packed, n, vocab,
                    BLOCK=BLOCK, num_warps=8)
    return ids, packed


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, defined at first use (Triton reads its interpreter switch then)."""
    import triton
    import triton.language as tl

    @triton.jit
    def philox_draw(logits, stride, seeds, counts, inv_temps, ids, packed, n, vocab, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        seed = tl.load(seeds + r)
        count = tl.load(counts + r)
        inv_t = tl.load(inv_temps + r)
        scale = tl.where(inv_t > 0, inv_t, 1.0)  # greedy rows: no 0 * -inf (nan) in masked lanes
        row = logits + r.to(tl.int64) * stride
        lane = tl.arange(0, BLOCK)
        zero = lane.to(tl.uint32) * 0
        count_lo = zero + (count & 0xFFFFFFFF).to(tl.uint32)
        count_hi = zero + ((count >> 32) & 0xFFFFFFFF).to(tl.uint32)
        key_lo = zero + (seed & 0xFFFFFFFF).to(tl.uint32)
        key_hi = zero + ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
        round_a, round_b = tl.full([BLOCK], 0xD2511F53, tl.uint32), tl.full([BLOCK], 0xCD9E8D57, tl.uint32)
        bump_a, bump_b = tl.full([BLOCK], 0x9E3779B9, tl.uint32), tl.full([BLOCK], 0xBB67AE85, tl.uint32)
        none = tl.full([BLOCK], float("-inf"), tl.float32)
        best, m = tl.max(none, 0), tl.max(none, 0)  # best score, running max of the raw logits
        total = tl.sum(tl.zeros([BLOCK], tl.float32), 0)  # sum of exp(x - m)
        best_x = total  # the raw logit of the best
        best_i = tl.sum(lane * 0, 0)
        bad = tl.sum(lane * 0, 0)
        for start in range(0, vocab, BLOCK):
            offs = start + lane
            inside = offs < vocab
            x = tl.load(row + offs, mask=inside, other=float("-inf")).to(tl.float32)
            bad += tl.sum(((x != x) | (x == float("inf"))).to(tl.int32), 0)
            top = tl.maximum(m, tl.max(x, 0))
            total = total * tl.exp(m - top) + tl.sum(tl.exp(x - top), 0)
            m = top
            # Philox-4x32-10, written out (Triton's tl.philox computes the same; a nested jit function
            # would not run in the interpreter the tests use): key (k0, k1), counter (c0, c1, c2, c3).
            c0, c1, c2, c3, k0, k1 = offs.to(tl.uint32), count_lo, count_hi, zero, key_lo, key_hi
            for _ in tl.static_range(10):
                hi0, lo0 = tl.umulhi(round_a, c0), round_a * c0
                hi1, lo1 = tl.umulhi(round_b, c2), round_b * c2
                c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
                k0, k1 = k0 + bump_a, k1 + bump_b
            signed = c0.to(tl.int32, bitcast=True)  # uniform in [0, 1): Triton's uint_to_uniform_float
            u = tl.where(signed < 0, -signed - 1, signed).to(tl.float32) * 4.6566127342e-10
            score = tl.where(inv_t > 0, x * scale - tl.log(-tl.log(u)), x)
            score = tl.where(inside, score, float("-inf"))
            block_best = tl.max(score, 0)
            at = tl.argmax(score, 0)
            take = block_best > best
            best_x = tl.where(take, tl.sum(tl.where(lane == at, x, 0.0), 0), best_x)
            best_i = tl.where(take, start + at, best_i)
            best = tl.where(take, block_best, best)
        invalid = ((bad > 0) | (m == float("-inf"))) & (inv_t > 0)
        tl.store(ids + r, best_i.to(tl.int64))
        tl.store(packed + r, best_i.to(tl.float64))
        tl.store(packed + n + r, (best_x - (m + tl.log(total))).to(tl.float64))
        tl.store(packed + 2 * n + r, invalid.to(tl.float64))
        tl.store(counts + r, count + 1)

    return philox_draw
