"""The transformers engine's ``sampler: philox``: two Triton kernels draw every row's token of a step.

The default sampler (:mod:`.hf_sampling`) reproduces ``torch.multinomial`` with each row's own
``torch.Generator``: one ``exponential_`` launch a seeded row, then a division, an argmax, a
log-softmax, a gather and the packing for the read-back — at 64 rows 0.7-1.3 ms a decode step on an
H100 (``benchmarks/decode_step_gpu.py``), against SmolLM2's whole captured step of 1.7-1.9 ms. Here the
vocabulary is cut in chunks of :data:`CHUNK` entries, and a program per (row, chunk) reads its logits
once in blocks and computes:

* the draw, by the Gumbel-max trick in its exponential form (as ``torch.multinomial``'s one-sample
  path): ``argmax_v (x_v / T - log q_v)`` with ``q_v = -log u_v``, ``u_v`` uniform in [0, 1),
  computed in base 2 as ``argmax_v (x_v log2(e) / T - log2(-log2 u_v))`` (the same argmax: the
  score times ``log2(e)`` less a constant): ``-log2 u_v`` in full precision (near ``u = 1``, where the
  likely winners are, it is tiny), its log with the GPU's one-instruction ``lg2.approx``;
  ``T = 0`` (greedy rows) takes ``argmax_v x_v``, the first one on ties, as ``torch.argmax``;
* ``u_v`` from counter-based Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
  3", SC 2011; as ``triton.language.philox``): key = the row's seed modulo 2**63, counter = (``v // 4``,
  the row's token index as two 32-bit words, 0), output word ``v % 4`` as a float in [0, 1) (Triton's
  ``uint_to_uniform_float``): one Philox call gives four entries' uniforms, as cuRAND's and
  ``tl.rand4x`` do. So a row's draws depend on its seed and on how many tokens it drew before, never on
  the rows beside it, the order of steps or the chunking;
* the chunk's part of the raw logprob of the drawn id (its max logit and ``sum exp(x - max)``, an online
  log-sum-exp over the blocks) and of a validity flag (a nan or +inf logit).

Each of the program's lanes (a Philox call's four entries, in one thread) keeps its own best, max, sum
and flag count over the blocks; the lanes meet once, after the loop.

A second kernel, a program a row, joins the chunks (the best score, the first chunk on ties, so the
first id on ties as before; the log-sum-exp), flags a sampled row whose logits hold a nan or +inf or
are all -inf, as the default path does, and writes the ids twice: as int64 (the next step's inputs) and
into the float64 ``[ids | logprobs | flags]`` buffer the engine reads back in one copy
(:func:`.hf_sampling.packed_to_host`); it advances each row's token counter on the device. So a step
launches these two kernels and the copy, nothing else.

Why two kernels and four words a call: a program a row (this sampler's first form, one Philox call an
entry) took 0.261 ms a step at 64 rows of Qwen2.5-7B's 152,064 logits on an H100 — 64 of the card's
132 multiprocessors busy, each computing ten Philox rounds an entry (read-back included; 256 rows were
not timed), most of the engine's decode step outside its captured graph there
(``benchmarks/results/fp8_kv8_h100_2026-12-07``). Split: 0.112 ms at 64 rows, 0.258 at 256, read-back
included (``benchmarks/results/fp8_sampler_rope_h100_2026-12-07``). Then the lanes apart (they met in
five reductions across the warps a block) and base 2 (``tl.log`` is a polynomial of ~35 instructions,
``lg2.approx`` one): on one H100, draws queued without a read-back / with one a step, 64 and 256 rows:
0.066 / 0.118 and 0.172 / 0.287 ms (split), 0.052 / 0.112 and 0.165 / 0.258 (lanes apart), 0.051 / 0.094
and 0.092 / 0.226 with both logs ``lg2.approx`` (``benchmarks/results/fp8_row_quant_h100_2026-12-07/lease2/
sampler_ab.txt``). That last form was not kept: near ``u = 1`` ``-lg2.approx(u)`` (absolute error
~2^-22) is off by up to most of its value, and those entries are the likely winners. The kept form, the
inner log in full precision, compiles to 1,606 PTX instructions for sm_90a (2,145 with both logs in
full precision, 1,068 with both ``lg2.approx``: ``benchmarks/kernels_sm90.py``); its ``-m gpu`` test passed
on an H100 (``benchmarks/results/fp8_attention_values_h100_2026-12-07``), its time not yet measured.

The ids differ from the default sampler's (another random stream) but follow the same distribution;
rows with top-k / top-p filters are drawn by the default path (the engine falls back for such a step).
Triton runs it on CUDA; the tests run it on the CPU in Triton's interpreter against a NumPy Philox
checked on Random123's known-answer vectors.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chatgym.trainer.engines.base import GREEDY_BELOW

CHUNK = 8192  # vocabulary entries a program of the first kernel takes (Qwen2.5's 152,064: 19 chunks)
BLOCK = 2048  # of which it reads at a time (512 Philox calls)


@dataclass
class PhiloxPlan:
    """The running rows' draw settings on the device (one entry a row, the engine's row order).

    Attributes:
        seeds: ``(rows,)`` int64 Philox keys.
        counts: ``(rows,)`` int64 tokens each row drew before the next draw; each draw adds one.
        inv_temps: ``(rows,)`` float32 ``1 / temperature``, 0 for greedy rows (temperatures below
            :data:`~.base.GREEDY_BELOW`).
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
        inv_temps=device_tensor([1.0 / t if t >= GREEDY_BELOW else 0.0 for t in temperatures], device),
    )


def draw(logits: Any, plan: PhiloxPlan, chunk: int = CHUNK) -> tuple[Any, Any]:
    """One id per row from ``logits`` ``(rows, vocab)`` (float16 / bfloat16 / float32, raw; read as float32):
    ``(ids, packed)``, ``ids`` ``(rows,)`` int64 and ``packed`` ``(3 * rows,)`` float64 ``[ids | raw
    logprobs | invalid flags]`` (module doc). Advances ``plan.counts``. Nothing is read back to the host.
    ``chunk`` (a power of two >= 64, entries a program takes) changes the work's split only, never the draw
    (the tests split small vocabularies with it). A NaN logit never wins (``torch.argmax`` would take it; a
    sampled row holding one is flagged invalid).

    Raises:
        ValueError: ``chunk`` not a power of two >= 64, ``logits`` not floats, 2-D with at least one entry
            a row, or a plan of another number of rows.
    """
    import torch

    if chunk < 64 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 64, got {chunk}")
    if logits.dim() != 2 or logits.shape[1] == 0 or not logits.is_floating_point():
        raise ValueError(f"draw: logits must be floats (rows, vocab >= 1), got {tuple(logits.shape)} {logits.dtype}")
    n, vocab = logits.shape
    for name in ("seeds", "counts", "inv_temps"):
        if getattr(plan, name).numel() != n:
            raise ValueError(f"draw: the plan's {name} has {getattr(plan, name).numel()} rows, the logits {n}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    chunks = -(-vocab // chunk)
    device = logits.device
    # Each chunk's best score, its id and raw logit, max logit, sum of exp(x - max), count of nan / +inf.
    parts = torch.empty((6, n, chunks), dtype=torch.float32, device=device)
    ids = torch.empty(n, dtype=torch.int64, device=device)
    packed = torch.empty(3 * n, dtype=torch.float64, device=device)
    _chunk_kernel()[(n, chunks)](logits, logits.stride(0), plan.seeds, plan.counts, plan.inv_temps, parts, n, vocab,
                                 chunks, CHUNK=chunk, BLOCK=min(BLOCK, chunk),
                                 FAST_LOG=fast_log(), num_warps=4)
    _join_kernel()[(n,)](parts, plan.counts, plan.inv_temps, ids, packed, n, chunks,
                         CHUNKS=max(16, 1 << (chunks - 1).bit_length()), num_warps=1)
    return ids, packed


@functools.cache
def fast_log() -> bool:
    """Whether the chunk kernel takes its outer log with libdevice's ``fast_log2f`` (``lg2.approx``): on the GPU,
    not in Triton's interpreter (``TRITON_INTERPRET=1``), which has no libdevice (NumPy's log2 there). Read
    once a process, as Triton reads its interpreter switch."""
    return os.environ.get("TRITON_INTERPRET") != "1"


@functools.cache
def _chunk_kernel() -> Any:
    """The first Triton kernel, defined at first use (Triton reads its interpreter switch then)."""
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit
    def philox_chunk(logits, stride, seeds, counts, inv_temps, parts, n, vocab, chunks, CHUNK: tl.constexpr,
                     BLOCK: tl.constexpr, FAST_LOG: tl.constexpr):
        r, c = tl.program_id(0), tl.program_id(1)
        seed = tl.load(seeds + r)
        count = tl.load(counts + r)
        inv_t = tl.load(inv_temps + r)
        # The score in base 2: x / T * log2(e) - log2(-log2(u)) is (x / T - log(-log(u))) * log2(e) less a
        # constant, the same argmax. Greedy rows (scale 1 then, no 0 * -inf = nan in masked lanes) take x.
        scale = tl.where(inv_t > 0, inv_t, 1.0) * 1.4426950408889634
        row = logits + r.to(tl.int64) * stride
        calls = tl.arange(0, BLOCK // 4)  # lane i: a block's entries 4i .. 4i + 3, one Philox call's words
        word = tl.arange(0, 4)[None, :]  # (1, 4): entries as (lane, word), each lane's four in one thread
        zero = calls.to(tl.uint32) * 0
        count_lo = zero + (count & 0xFFFFFFFF).to(tl.uint32)
        count_hi = zero + ((count >> 32) & 0xFFFFFFFF).to(tl.uint32)
        key_lo = zero + (seed & 0xFFFFFFFF).to(tl.uint32)
        key_hi = zero + ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
        round_a, round_b = tl.full([BLOCK // 4], 0xD2511F53, tl.uint32), tl.full([BLOCK // 4], 0xCD9E8D57, tl.uint32)
        bump_a, bump_b = tl.full([BLOCK // 4], 0x9E3779B9, tl.uint32), tl.full([BLOCK // 4], 0xBB67AE85, tl.uint32)
        # Each lane keeps its own best (score, id, raw logit), running max and sum of exp(x - max) and
        # count of nan / +inf; the lanes meet once, after the loop (not in five reductions across the
        # program's warps a block: 0.172 -> 0.165 ms of draws at 256 rows on an H100).
        best = tl.full([BLOCK // 4], float("-inf"), tl.float32)
        m, total, best_i = best, tl.zeros([BLOCK // 4], tl.float32), calls * 0
        best_x, bad = total, best_i
        for start in range(c * CHUNK, c * CHUNK + CHUNK, BLOCK):
            # Philox-4x32-10, written out (Triton's tl.philox computes the same; a nested jit function
            # would not run in the interpreter the tests use): key (k0, k1), counter (c0, c1, c2, c3).
            c0, c1, c2, c3, k0, k1 = (start // 4 + calls).to(tl.uint32), count_lo, count_hi, zero, key_lo, key_hi
            for _ in tl.static_range(10):
                hi0, lo0 = tl.umulhi(round_a, c0), round_a * c0
                hi1, lo1 = tl.umulhi(round_b, c2), round_b * c2
                c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
                k0, k1 = k0 + bump_a, k1 + bump_b
            ids = start + 4 * calls[:, None] + word  # (lanes, 4); entry 4i + j takes word j of call i
            inside = ids < vocab
            x = tl.load(row + ids, mask=inside, other=float("-inf")).to(tl.float32)
            bad += tl.sum(((x != x) | (x == float("inf"))).to(tl.int32), 1)
            top = tl.maximum(m, tl.max(x, 1))
            ref = tl.where(top == float("-inf"), 0.0, top)  # a lane of -inf so far: total stays 0, not nan
            total = total * tl.exp(m - ref) + tl.sum(tl.exp(x - ref[:, None]), 1)
            m = top
            bits = tl.where(word == 0, c0[:, None], tl.where(word == 1, c1[:, None], tl.where(word == 2, c2[:, None],
                                                                                               c3[:, None])))
            signed = bits.to(tl.int32, bitcast=True)  # uniform in [0, 1): Triton's uint_to_uniform_float
            u = tl.where(signed < 0, -signed - 1, signed).to(tl.float32) * 4.6566127342e-10
            # -log2(u) in full precision: near u = 1 it is tiny (the likely winners), where lg2.approx's
            # absolute error (~2^-22) would be most of it. Its log on the GPU with lg2.approx, one
            # instruction (log2 is a ~35-instruction polynomial): an error of ~2^-22 of a score of at most
            # ~60, float32's own rounding there. In Triton's interpreter NumPy's log2.
            spent = -tl.log2(u)
            gumbel = libdevice.fast_log2f(spent) if FAST_LOG else tl.log2(spent)
            score = tl.where(inside, tl.where(inv_t > 0, x * scale - gumbel, x), float("-inf"))
            lane_best = tl.max(score, 1)
            j = tl.min(tl.where(score == lane_best[:, None], word, 4), 1)  # the lane's first word on ties
            take = lane_best > best  # a lane's blocks come in id order: the first id wins a tie
            best = tl.where(take, lane_best, best)
            best_i = tl.where(take, start + 4 * calls + j, best_i)
            best_x = tl.where(take, tl.sum(tl.where(word == j[:, None], x, 0.0), 1), best_x)
        chunk_best = tl.max(best, 0)
        first = tl.min(tl.where(best == chunk_best, best_i, 2147483647), 0)  # the first id on ties across lanes
        chunk_m = tl.max(m, 0)
        shift = tl.where(m == float("-inf"), float("-inf"), m - tl.where(chunk_m == float("-inf"), 0.0, chunk_m))
        at = parts + r * chunks + c
        plane = n * chunks
        tl.store(at, chunk_best)
        tl.store(at + plane, first.to(tl.float32))  # exact: ids < 2**24
        tl.store(at + 2 * plane, tl.sum(tl.where(best_i == first, best_x, 0.0), 0))  # lanes that never took: 0
        tl.store(at + 3 * plane, chunk_m)
        tl.store(at + 4 * plane, tl.sum(total * tl.exp(shift), 0))
        tl.store(at + 5 * plane, tl.sum(bad, 0).to(tl.float32))

    return philox_chunk


@functools.cache
def _join_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def philox_join(parts, counts, inv_temps, ids, packed, n, chunks, CHUNKS: tl.constexpr):
        r = tl.program_id(0)
        each = tl.arange(0, CHUNKS)
        real = each < chunks
        at = parts + r * chunks + each
        plane = n * chunks
        best = tl.load(at, mask=real, other=float("-inf"))
        m = tl.load(at + 3 * plane, mask=real, other=float("-inf"))
        top = tl.max(m, 0)
        shift = tl.where(m == float("-inf"), float("-inf"), m - top)  # no -inf - -inf (nan)
        total = tl.sum(tl.load(at + 4 * plane, mask=real, other=0.0) * tl.exp(shift), 0)
        bad = tl.sum(tl.load(at + 5 * plane, mask=real, other=0.0), 0)
        win = tl.argmax(best, 0)  # the first chunk on ties: the first id, as one pass over the row
        best_i = tl.sum(tl.where(each == win, tl.load(at + plane, mask=real, other=0.0), 0.0), 0)
        best_x = tl.sum(tl.where(each == win, tl.load(at + 2 * plane, mask=real, other=0.0), 0.0), 0)
        inv_t = tl.load(inv_temps + r)
        invalid = ((bad > 0) | (top == float("-inf"))) & (inv_t > 0)
        tl.store(ids + r, best_i.to(tl.int64))
        tl.store(packed + r, best_i.to(tl.float64))
        tl.store(packed + n + r, (best_x - (top + tl.log(total))).to(tl.float64))
        tl.store(packed + 2 * n + r, invalid.to(tl.float64))
        tl.store(counts + r, tl.load(counts + r) + 1)

    return philox_join
