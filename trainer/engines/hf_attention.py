"""The fused decode step's attention in one Triton kernel a layer, cache writes included.

With ``fused_step: compiled`` on CUDA the step's attention is this kernel (``"triton"``); otherwise, and
for a head size that is not a power of two, the default (``"sdpa"``): two ``index_put`` kernels write the
step's keys and values into the cache, then ``scaled_dot_product_attention`` reads every row's first
``width`` columns under a mask. On an H100 they cost 2 x 4.0 + 13.3 us a layer at 64 rows x 256
columns (SmolLM2; cuDNN's SDPA, allowed in that run), 2 x 4.4 + 33.1 at 256 rows: 0.64 of the 1.73 ms
step, masked columns read too (``benchmarks/results/vs_trl_h100_2026-12-06/decode_step_smollm2.txt``). With this kernel on an H200
SmolLM2's compiled step took 1.099 / 1.343 ms at 64 / 256 rows against 1.884 / 2.703, the Qwen2.5-7B
shape's 5.063 / 8.403 against 5.764 / 10.006 (``benchmarks/results/attention_stream_2026-12-06``).
``CHATGYM_DECODE_ATTENTION`` (``sdpa`` / ``triton``) overrides the choice for a process (benchmarks).

The kernel runs a program per (row, key/value head):

* it writes the row's new key and value at the row's position (the columns later steps read);
* it attends the head's group of query heads (grouped-query attention: query heads ``h * group .. (h
  + 1) * group - 1`` read key/value head ``h``, the model's own order) over the row's columns ``0 ..
  position`` only: the earlier columns from the cache in blocks (:func:`launch_config`), the new one from
  registers (nothing is read back after the write), with FlashAttention's online softmax (Dao et al.,
  NeurIPS 2022) in one pass a row, as the decode kernels of vLLM and SGLang do (without their split of
  long rows over several programs: rollout batches have many rows);
* ``q . k`` and ``p @ v`` run on tensor cores (``tl.dot``; the group padded to 16 query rows), the
  softmax in float32, ``p`` rounded to the cache's dtype before ``p @ v`` as flash attention rounds it;
  float32 caches multiply in full float32 (no TF32).

It computes what the default computes up to float rounding (tests/test_engines_hf_attention.py, in
Triton's interpreter on the CPU, and ``-m gpu``).

:func:`decode_qkv` takes the q/k/v projection's output as the GEMM left it and does in the same kernel
what ran before it as kernels of their own: the ``"unit"`` FP8 GEMM's row and channel scales, the q/k/v
bias and RoPE on q and k (each program loads its heads' halves a second time, rotated). At the
Qwen2.5-7B shape on an H100 those were 11.0 us (RoPE) + 4.8 us (scales and bias) a layer at 256 rows,
3.9 + ~2.5 at 64 (``benchmarks/results/fp8_kv8_h100_2026-12-07/step_7b.txt``); the kernel reads the
same bytes either way.

An FP8 KV cache (``engine.options.kv_cache_dtype: fp8``, float8_e4m3fn with a unit scale, as vLLM's
``kv_cache_dtype="fp8"`` without calibrated scales) is read by this kernel alone: it saturates the new
key and value at +-448 (e4m3fn's largest), stores them in e4m3 and attends to them as stored; earlier
columns are read in e4m3 and widened before the products: to fp16 with bf16 / fp16 queries (every e4m3
value is an fp16 one; the queries, times the score's factor, rounded to fp16, which keeps 3 more bits
than bf16; widened to bf16 the 7B step's attention took 0.632 ms at 256 rows on an H100, to fp16 0.599
on another), to float32 with float32 queries. With fp16 products the values are read as 16-bit pairs
(each two neighbouring dimensions of a column; the low byte the even one, as CUDA is little-endian),
``p @ v`` taken over the even and the odd dimensions apart and the two interleaved at the end (the same
fp16 products and float32 sums): ``p @ v`` sums over the cache's columns, the strided dimension, and
Hopper's ``ldmatrix`` transposes only 16-bit elements, so e4m3 values were staged in shared memory and
read back a byte at a time (40 ``ld.shared.b8`` a thread a block at 32 columns); as pairs a block is
two ``ldmatrix.trans`` (``benchmarks/kernels_sm90.py``: 80 registers against 103, 6 programs a
multiprocessor against 4). On an H100 at the 7B shape, 256 rows: the kernel 29.6 against 30.5 us a
layer at (32, 4, 3) (best launches 26.5 / 28.4), the engine's decode step 5.914 against 5.996 ms
(``benchmarks/results/fp8_value_pairs_h100_2026-12-07``). It halves the bytes a
step's attention reads (57,344 -> 28,672 a token at the Qwen2.5-7B shape); keys and values carry e4m3's
rounding (2^-4 relative), one more source of the engine/learner mismatch (``rollout/mismatch/*``).
"""

from __future__ import annotations

import functools
import os
from typing import Any

ATTENTIONS = ("sdpa", "triton")
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
BLOCK = 64  # cache columns a program reads at a time
MIN_DOT = 16  # tl.dot's least size along each dimension
# The override's bounds: more columns or stages than these outgrow a multiprocessor's shared memory at head
# size 128 in bf16. benchmarks/attention_gpu.py measures 36 launches within them (BLOCK 16-128, WARPS 2-8).
MAX_BLOCK, MAX_STAGES = 128, 3
# The launch (cache columns a program reads at a time, warps, software-pipelining stages) by the cache's
# dtype: "model" (the model's dtype) or "fp8". CHATGYM_DECODE_ATTENTION_CONFIG overrides it for a process
# (benchmarks/attention_gpu.py measures the choices): "BLOCK,WARPS,STAGES" for both, or
# "model=BLOCK,WARPS,STAGES;fp8=BLOCK,WARPS,STAGES". On an e4m3 cache 32 columns a block: the least time
# summed over 64 and 256 rows at the Qwen2.5-7B shape in both H100 sweeps (45.2 / 41.6 us a layer against
# (64, 4, 3)'s 46.0 / 43.4; 103 registers a thread against 137, 4 programs a multiprocessor against 3, in the
# byte form of the values before the pairs: 80 and 6 now), and with the pairs the engine's step was slower at
# the pairs sweep's least summed launch (64, 4, 2): 5.938 ms against 5.914 at 256 rows.
LAUNCH = {"model": (BLOCK, 4, 3), "fp8": (32, 4, 3)}


def supports(head_dim: int) -> bool:
    """Whether the kernel takes this head size (``tl.arange`` needs a power of two, ``tl.dot`` >= 16)."""
    return head_dim >= MIN_DOT and head_dim & (head_dim - 1) == 0


def default_attention(compiled: bool, cuda: bool, head_dim: int | None = None) -> str:
    """The fused step's attention: ``"triton"`` with compiled pieces on CUDA for a head size the kernel
    takes (``head_dim`` None: not known yet, as at config load), else ``"sdpa"``.

    Raises:
        ValueError: ``CHATGYM_DECODE_ATTENTION`` set to a value not in :data:`ATTENTIONS`, or to
            ``"triton"`` without CUDA or for a head size the kernel does not take.
    """
    chosen = os.environ.get("CHATGYM_DECODE_ATTENTION")
    if not chosen:
        ok = head_dim is None or supports(head_dim)
        return "triton" if compiled and cuda and ok else "sdpa"
    if chosen not in ATTENTIONS:
        raise ValueError(f"CHATGYM_DECODE_ATTENTION must be one of {ATTENTIONS}, got {chosen!r}")
    if chosen == "triton" and not cuda:
        raise ValueError("CHATGYM_DECODE_ATTENTION=triton is a Triton kernel: it needs a CUDA GPU")
    if chosen == "triton" and head_dim is not None and not supports(head_dim):
        raise ValueError(f"CHATGYM_DECODE_ATTENTION=triton: head size {head_dim} is not a power of two >= 16")
    return chosen


def launch_config(fp8: bool) -> tuple[int, int, int]:
    """``(block, warps, stages)`` of the kernel's launch on a cache in e4m3 (``fp8``) or the model's dtype:
    :data:`LAUNCH`, or ``CHATGYM_DECODE_ATTENTION_CONFIG`` (read once a process).

    Raises:
        ValueError: the variable malformed or naming a cache twice, a block that is not a power of two
            from 16 to 128, warps not 1, 2, 4 or 8, stages not 1 to 3.
    """
    return _launch_configs()["fp8" if fp8 else "model"]


@functools.cache
def _launch_configs() -> dict[str, tuple[int, int, int]]:
    text = os.environ.get("CHATGYM_DECODE_ATTENTION_CONFIG", "").strip()
    if not text:
        return dict(LAUNCH)
    pairs = [[w.strip() for w in p.split("=", 1)] if "=" in p else ("both", p) for p in text.split(";") if p.strip()]
    parts = dict(pairs)
    if set(parts) - {"both", "model", "fp8"} or ("both" in parts and len(pairs) > 1) or len(parts) < len(pairs):
        twice = " (a cache named twice)" if len(parts) < len(pairs) else ""
        raise ValueError(f"CHATGYM_DECODE_ATTENTION_CONFIG must be 'BLOCK,WARPS,STAGES' or "
                         f"'model=BLOCK,WARPS,STAGES;fp8=BLOCK,WARPS,STAGES', got {text!r}{twice}")
    out = dict(LAUNCH)
    for key, value in parts.items():
        try:
            block, warps, stages = (int(v) for v in value.split(","))
        except ValueError:
            raise ValueError(f"CHATGYM_DECODE_ATTENTION_CONFIG: {value!r} is not BLOCK,WARPS,STAGES (three integers)") from None
        if not MIN_DOT <= block <= MAX_BLOCK or block & (block - 1) or warps not in (1, 2, 4, 8) or not 1 <= stages <= MAX_STAGES:
            raise ValueError(f"CHATGYM_DECODE_ATTENTION_CONFIG: {value!r}: BLOCK a power of two from {MIN_DOT} to "
                             f"{MAX_BLOCK}, WARPS 1, 2, 4 or 8, STAGES 1 to {MAX_STAGES}")
        for name in (("model", "fp8") if key == "both" else (key,)):
            out[name] = (block, warps, stages)
    return out


def decode(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, positions: Any, scale: float) -> Any:
    """One decode step's attention for ``n`` rows, writing their keys and values into the caches.

    Args:
        q: ``(n, heads, d)`` the rows' roped queries (any strides with the last one 1).
        k, v: ``(n, kv_heads, d)`` their roped keys and their values (last stride 1).
        k_cache, v_cache: ``(slots >= n, kv_heads, max_len, d)`` of one layer, the same strides, last 1;
            row ``r`` is slot ``r``; ``q``'s dtype, or float8_e4m3fn (module doc).
        positions: ``(n,)`` int64, each row's position: its column written, the last it attends.
        scale: the score's factor (``head_dim ** -0.5`` for most models).

    Returns:
        ``(n, heads, d)`` in ``q``'s dtype, contiguous: each query head's attention output.

    Raises:
        ValueError: caches of other strides or dtypes, a last dimension that is not dense, or with bf16 / fp16 queries an
            e4m3 value cache whose start or slot, head or column stride is odd in bytes (it is read in 16-bit
            pairs).
    """
    return _launch(q, k, v, k_cache, v_cache, positions, scale)


def decode_qkv(qkv: Any, heads: int, k_cache: Any, v_cache: Any, positions: Any, scale: float, cos: Any,
               sin: Any, a: Any = None, s: Any = None, bias: Any = None) -> Any:
    """:func:`decode` from the q/k/v projection's raw output: scales, bias and RoPE applied in the kernel.

    Element by element, in float32 and rounded to ``qkv``'s dtype after each step as the pieces it
    replaces round (:func:`.hf_fp8.dequantize_out`, the bias add, :func:`.hf_elementwise.rope`):
    ``x = qkv · a · s`` (with ``a``), ``x = x + bias`` (with ``bias``), then for q and k
    ``x · cos + roll(x, d/2) · sin``.

    Args:
        qkv: ``(n, (heads + 2 kv_heads) d)`` q, k then v (last stride 1), bf16 / fp16 / fp32.
        heads: query heads (``kv_heads`` and ``d`` are the caches').
        k_cache, v_cache, positions, scale: as :func:`decode`.
        cos, sin: ``(n, 1, d)`` or ``(n, d)`` RoPE's cosines and signed sines at each row's position
            (:mod:`.hf_fused`'s ``sin'``: the first half negated), last stride 1.
        a: ``(n, 1)`` float32 row scales of a ``"unit"`` FP8 GEMM, with ``s`` ``(1, (heads + 2 kv_heads) d)``
            float32 channel scales; None: ``qkv`` is already scaled.
        bias: ``((heads + 2 kv_heads) d,)`` in ``qkv``'s dtype, or None (none, or added already).

    Returns:
        ``(n, heads, d)`` as :func:`decode`.

    Raises:
        ValueError: ``a`` without ``s``, ``qkv``'s width not ``(heads + 2 kv_heads) d``, or what
            :func:`decode` refuses.
    """
    n, kv_heads, d = qkv.shape[0], k_cache.shape[1], k_cache.shape[-1]
    if (a is None) != (s is None):
        raise ValueError("decode_qkv: the unit GEMM's scales come together (a and s)")
    if qkv.dim() != 2 or qkv.shape[1] != (heads + 2 * kv_heads) * d:
        raise ValueError(f"decode_qkv: qkv must be (n, {(heads + 2 * kv_heads) * d}), got {tuple(qkv.shape)}")
    q, k, v = (part.view(n, -1, d) for part in qkv.split((heads * d, kv_heads * d, kv_heads * d), dim=1))
    return _launch(q, k, v, k_cache, v_cache, positions, scale, None if s is None else (a, s), bias,
                   (cos.reshape(n, d), sin.reshape(n, d)))


def _launch(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, positions: Any, scale: float, scales: Any = None,
            bias: Any = None, rope: Any = None) -> Any:
    """The kernel over ``q``, ``k``, ``v`` (views, last stride 1); ``scales`` ``(a, s)`` and ``bias`` over
    the columns of the q/k/v product q, k and v are views of, ``rope`` ``(cos, sin)``, as
    :func:`decode_qkv` applies them."""
    import torch

    n, heads, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if k_cache.stride() != v_cache.stride() or any(t.stride(-1) != 1 for t in (q, k, v, k_cache)):
        raise ValueError("decode attention: the caches must share strides, and every last dimension be dense")
    if k_cache.dtype != v_cache.dtype:  # the kernel reads both as k_cache's (an e4m3 one as pairs: wrong values)
        raise ValueError(f"decode attention: the caches must share a dtype, got {k_cache.dtype} and {v_cache.dtype}")
    if rope is not None and any(t.stride(-1) != 1 or t.stride(0) != rope[0].stride(0) for t in rope):
        raise ValueError("decode attention: cos and sin must share strides, their last dimension dense")
    out = torch.empty((n, heads, d), dtype=q.dtype, device=q.device)
    group_rows = max(MIN_DOT, 1 << (group - 1).bit_length())
    half = q.dtype != torch.float32  # products in fp16 / bf16 (the kernel's HALF)
    precision = "tf32" if half else "ieee"
    unused = q  # a pointer a disabled part never reads
    a, s = scales if scales is not None else (unused, unused)
    cos, sin = rope if rope is not None else (unused, unused)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8 and half and (v_cache.data_ptr() % 2 or any(st % 2 for st in v_cache.stride()[:3])):
        raise ValueError("decode attention: an e4m3 value cache is read in 16-bit pairs: its start and its slot, "
                         f"head and column strides must be even (bytes), got start offset {v_cache.storage_offset()} "
                         f"and strides {v_cache.stride()[:3]}")
    block, warps, stages = launch_config(fp8)
    _kernel()[(n, kv_heads)](
        q, k, v, k_cache, v_cache, positions, out, float(scale),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), out.stride(0), out.stride(1),
        a, s, unused if bias is None else bias, heads * d, (heads + kv_heads) * d, cos, sin, cos.stride(0),
        GROUP=group, GROUP_ROWS=group_rows, D=d, BLOCK=block, PRECISION=precision,
        FP8=fp8, FP8_MAX=FP8_MAX, SCALED=scales is not None, BIAS=bias is not None, ROPE=rope is not None,
        HALF=half, RAW=_raw_value(), num_warps=warps, num_stages=stages,
    )
    return out


@functools.cache
def _raw_value() -> Any:
    """The kernel's step from the q/k/v product's raw output to a value, a Triton function it takes as
    ``RAW`` (a helper of a kernel must come as an argument: Triton's interpreter does not see closures):
    ``x`` times the ``"unit"`` GEMM's row scale and channel scales ``s[cols]``, then plus the bias
    ``b[cols]``, each in float32 and rounded to ``x``'s dtype (as :func:`.hf_fp8.dequantize_out` and the
    bias add round); ``mask`` and ``other`` the loads' (None, None: every column)."""
    import triton
    import triton.language as tl

    @triton.jit
    def raw_value(x, row_scale, s, b, cols, mask, other, SCALED: tl.constexpr, BIAS: tl.constexpr):
        if SCALED:
            x = (x.to(tl.float32) * row_scale * tl.load(s + cols, mask=mask, other=other)).to(x.dtype)
        if BIAS:
            x = (x.to(tl.float32) + tl.load(b + cols, mask=mask, other=other).to(tl.float32)).to(x.dtype)
        return x

    return raw_value


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, defined at first use (Triton reads its interpreter switch then)."""
    import triton
    import triton.language as tl

    @triton.jit
    def decode_attention(q, k, v, k_cache, v_cache, positions, out, scale,
                         q_row, q_head, k_row, k_head, v_row, v_head, c_slot, c_head, c_col, o_row, o_head,
                         a, s, b, k_col, v_col, cos, sin, cs_row,
                         GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                         PRECISION: tl.constexpr, FP8: tl.constexpr, FP8_MAX: tl.constexpr, SCALED: tl.constexpr,
                         BIAS: tl.constexpr, ROPE: tl.constexpr, HALF: tl.constexpr, RAW: tl.constexpr):
        r, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
        pos = tl.load(positions + r)
        dim = tl.arange(0, D)
        heads = h * GROUP + tl.arange(0, GROUP_ROWS)
        real = heads < h * GROUP + GROUP
        q_cols = heads[:, None] * D + dim[None, :]  # in the scales and bias (k's from k_col, v's from v_col)
        row_scale = tl.load(a + r) if SCALED else 1.0
        qs = RAW(tl.load(q + r * q_row + heads[:, None] * q_head + dim[None, :], mask=real[:, None], other=0.0),
                 row_scale, s, b, q_cols, real[:, None], 0.0, SCALED, BIAS)
        k_new = RAW(tl.load(k + r * k_row + h * k_head + dim), row_scale, s, b, k_col + h * D + dim, None, None, SCALED,
                    BIAS)
        v_new = RAW(tl.load(v + r * v_row + h * v_head + dim), row_scale, s, b, v_col + h * D + dim, None, None, SCALED,
                    BIAS)
        dtype = qs.dtype
        if ROPE:  # x * cos + roll(x) * sin', in float32, rounded once (as the compiled piece)
            turned = (dim + D // 2) % D  # the rotated halves: roll(x, D/2)[j] = x[(j + D/2) % D]
            qt = RAW(tl.load(q + r * q_row + heads[:, None] * q_head + turned[None, :], mask=real[:, None], other=0.0),
                     row_scale, s, b, heads[:, None] * D + turned[None, :], real[:, None], 0.0, SCALED, BIAS)
            kt = RAW(tl.load(k + r * k_row + h * k_head + turned), row_scale, s, b, k_col + h * D + turned, None,
                     None, SCALED, BIAS)
            c, sn = tl.load(cos + r * cs_row + dim).to(tl.float32), tl.load(sin + r * cs_row + dim).to(tl.float32)
            qs = (qs.to(tl.float32) * c[None, :] + qt.to(tl.float32) * sn[None, :]).to(dtype)
            k_new = (k_new.to(tl.float32) * c + kt.to(tl.float32) * sn).to(dtype)
        if FP8:  # saturated and stored in e4m3; the new column is attended to as stored
            k_new = tl.clamp(k_new.to(tl.float32), -FP8_MAX, FP8_MAX).to(k_cache.dtype.element_ty)
            v_new = tl.clamp(v_new.to(tl.float32), -FP8_MAX, FP8_MAX).to(v_cache.dtype.element_ty)
        base = r * c_slot + h * c_head
        tl.store(k_cache + base + pos * c_col + dim, k_new)
        tl.store(v_cache + base + pos * c_col + dim, v_new)
        # The new column opens the online softmax: its score is the running max, its weight 1.
        m = tl.sum(qs.to(tl.float32) * k_new.to(tl.float32)[None, :], 1) * scale  # (GROUP_ROWS,)
        total = tl.full([GROUP_ROWS], 1.0, tl.float32)
        acc = tl.zeros([GROUP_ROWS, D], tl.float32) + v_new.to(tl.float32)[None, :]  # (the pairs form: two halves)
        qd, factor, offs = qs, scale, tl.arange(0, BLOCK)
        if FP8 and HALF:  # e4m3 widens to fp16 exactly; q times the factor in fp16 too (|q| < 65504 / factor)
            qd, factor = (qs.to(tl.float32) * scale).to(tl.float16), 1.0
            # the values in 16-bit pairs (module doc): the even and the odd dimensions apart
            v_even, v_odd = tl.split(tl.reshape(v_new.to(tl.float32), (D // 2, 2)))
            acc_even = tl.zeros([GROUP_ROWS, D // 2], tl.float32) + v_even[None, :]
            acc_odd = tl.zeros([GROUP_ROWS, D // 2], tl.float32) + v_odd[None, :]
            pairs, pair = v_cache.to(tl.pointer_type(tl.uint16)), tl.arange(0, D // 2)
        for start in range(0, pos, BLOCK):
            cols = start + offs
            earlier = cols < pos
            at = base + cols[:, None] * c_col + dim[None, :]
            ks = tl.load(k_cache + at, mask=earlier[:, None], other=0.0).to(qd.dtype)  # (BLOCK, D)
            score = tl.dot(qd, tl.trans(ks), input_precision=PRECISION) * factor  # (GROUP_ROWS, BLOCK) float32
            score = tl.where(earlier[None, :], score, float("-inf"))
            top = tl.maximum(m, tl.max(score, 1))
            p = tl.exp(score - top[:, None])
            alpha = tl.exp(m - top)
            total = total * alpha + tl.sum(p, 1)
            if FP8 and HALF:
                vp = tl.load(pairs + (base + cols[:, None] * c_col) // 2 + pair[None, :], mask=earlier[:, None], other=0)
                even = (vp & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
                odd = (vp >> 8).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
                acc_even = acc_even * alpha[:, None] + tl.dot(p.to(tl.float16), even, input_precision=PRECISION)
                acc_odd = acc_odd * alpha[:, None] + tl.dot(p.to(tl.float16), odd, input_precision=PRECISION)
            else:
                vs = tl.load(v_cache + at, mask=earlier[:, None], other=0.0).to(qd.dtype)
                acc = acc * alpha[:, None] + tl.dot(p.to(qd.dtype), vs, input_precision=PRECISION)
            m = top
        if FP8 and HALF:
            acc = tl.reshape(tl.join(acc_even, acc_odd), (GROUP_ROWS, D))
        tl.store(out + r * o_row + heads[:, None] * o_head + dim[None, :],
                 (acc / total[:, None]).to(out.dtype.element_ty), mask=real[:, None])

    return decode_attention
