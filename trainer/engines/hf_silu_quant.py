"""The FP8 step's ``silu(gate) * up`` quantized per row: one Triton kernel a row, or two spread over the row.

On FP8 weights the fused step's MLP feeds the down projection ``e4m3(y / a)`` with ``y = silu(gate) * up``
and ``a`` the row's ``max |y| / 448`` (:func:`.hf_elementwise.silu_mul_quant`). Compiled by Inductor that
is one kernel a row, whose program walks the row's 2 x 18,944 inputs (the Qwen2.5-7B shape) in
dependent chunks twice: 16.8 us a layer at 64 rows on an H200, 0.47 of the 3.69 ms step, with 64 of the
card's 132 multiprocessors busy and each waiting on one load at a time
(``benchmarks/results/attention_stream_2026-12-06/lease1_h200/step_7b.txt``).

With at least as many rows as the GPU has multiprocessors (rows of at most :data:`ONE_PASS_MAX`
outputs; :func:`one_pass_pays`) a program a row holds the whole row in registers: its largest power of
two of columns and the rest as a second, masked part (18,944 = 16,384 + 2,560 of 4,096), 16 warps (64
registers a thread, no spills, in ptxas for sm_90a): every load of the row is issued at once, ``y`` is
kept rounded to the input's dtype, and the row is read once and written once quantized (4 + 1 bytes an
output at bf16), nothing in between. On an H100 at the 7B shape: 13.9 us a
layer at 256 rows against the two kernels' 12.3 + 4.9, but 7.4 at 64 rows against 3.8 + 2.1, most
multiprocessors idle (``benchmarks/results/fp8_row_quant_h100_2026-12-07``).

Fewer rows (and wider ones, or ``one_pass=False``) take two kernels that cut each row in blocks of
:data:`BLOCK` columns, a program per (row, block):

1. ``y`` of the block (rounded to the input's dtype, as the eager pieces round it) is written to a
   scratch tensor, and the block's ``max |y|`` to ``(rows, blocks)`` partial maxima;
2. each program reads its row's partial maxima, takes ``a`` and writes the block quantized (the first
   block's program writes ``a``).

Both read every row at once from all the blocks' programs (64 rows x 10 blocks = 640 at the 7B shape),
the scratch's write and read adding 2 x 2 bytes an element. On an H100 they took 6.0 + 4.2 us a layer at
the 7B shape and 64 rows (13.5 + 7.4 at 256), and the FP8 step 4.463 -> 4.254 ms against Inductor's
(``benchmarks/results/packed_prefill_2026-12-06/``); with ``tl.fdiv`` (below) 3.8 + 2.1 and 12.3 + 4.9
(``benchmarks/results/fp8_row_quant_h100_2026-12-07/lease1``). With the ``"unit"`` FP8 GEMM
(:data:`.hf_fp8.GEMMS`) either form also applies the GEMM's row and channel scales, rounding to the
input's dtype as :func:`.hf_fp8.dequantize_out` does.

The result is the eager function's up to float rounding (``exp`` may differ in the last bits of
float32, and then rounding to bf16 by one step): on float32 inputs the tests take the scales within 2e-7
and the values within 2e-6 relative of the eager ones (``tests/test_engines_hf_silu_quant.py``, Triton's
interpreter on the CPU, whose casts to bf16 and e4m3 truncate where CUDA rounds to nearest); bf16 inputs
and e4m3 outputs ``-m gpu``. The two kernels were bound by their arithmetic, not their bytes (a first
pass without the scratch's store took as long), so the divisions are ``tl.fdiv`` (to ~2 ulp of float32)
rather than IEEE ones: at 256 rows on an H100 the first kernel took 12.4-15.0 us a layer in three runs
with IEEE division, 12.1 with ``tl.fdiv``, the second 7.4-7.5 -> 4.2 (64 rows: 5.9-6.1 -> 3.9, 4.1-4.2 ->
2.1; ``benchmarks/results/fp8_sampler_rope_h100_2026-12-07``).
"""

from __future__ import annotations

import functools
from typing import Any

from chatgym.trainer.engines import hf_fp8
from chatgym.trainer.engines.hf_fp8 import _MIN_SCALE, FP8_MAX

BLOCK = 2048  # columns of a row a program takes (16 a thread at 4 warps)
ONE_PASS_MAX = 32768  # outputs a row may have in one pass (ptxas for sm_90a: at most 128 registers, no spills)


def silu_mul_quant(gate_up: Any, a: Any = None, s: Any = None, out_dtype: Any = None,
                   one_pass: bool | None = None) -> tuple[Any, Any]:
    """:func:`.hf_elementwise.silu_mul_quant` in Triton: one kernel a row, or two (module doc).

    Args:
        gate_up: ``(M, 2 * I)`` float (bf16 / fp16 / fp32), the gate/up projection's output (last stride 1):
            gate in columns ``0 .. I-1``, up in ``I .. 2I-1``; with ``a``, the unscaled ``"unit"`` product.
        a: ``(M, 1)`` float32 activation scales of that GEMM, or None (``gate_up`` already scaled).
        s: ``(1, 2 * I)`` float32 weight scales of that GEMM (with ``a``).
        out_dtype: the quantized output's dtype, default float8_e4m3fn (float32 keeps the unrounded
            ``y / a``: the tests' view of it).
        one_pass: a program a row holding the whole row (:func:`one_pass_fits`) instead of the two
            kernels; None: :func:`one_pass_pays`.

    Returns:
        ``(X, a_out)``: ``X`` ``(M, I)`` in ``out_dtype``, ``a_out`` ``(M, 1)`` float32 row scales.

    A NaN or infinite input gives NaN where the eager piece gives NaN (the clamp keeps NaN); the row's
    scale and other values come from its other entries, where the eager piece's are NaN.

    Raises:
        ValueError: ``a`` without ``s``, ``gate_up`` not 2-D with an even last size of at least 2, a last
            dimension that is not dense, scales of other shapes or not dense (:func:`.hf_fp8.check_unit_scales`).
    """
    import torch

    if (a is None) != (s is None):
        raise ValueError("silu_mul_quant: the unit GEMM's scales come together (a and s)")
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.shape[1] == 0:
        raise ValueError(f"silu_mul_quant: gate_up must be (M, 2 * I) with I >= 1, got shape {tuple(gate_up.shape)}")
    if gate_up.stride(-1) != 1:
        raise ValueError("silu_mul_quant: the last dimension must be dense")
    m, width = gate_up.shape
    inner = width // 2
    device = gate_up.device
    if a is not None:
        hf_fp8.check_unit_scales(a, s, m, width, "silu_mul_quant")
    if one_pass is None:
        one_pass = one_pass_pays(m, inner, device)
    if one_pass:
        return _one_pass(gate_up, a, s, out_dtype)
    blocks = -(-inner // BLOCK)
    y = torch.empty((m, inner), dtype=gate_up.dtype, device=device)
    partial = torch.empty((m, blocks), dtype=torch.float32, device=device)
    out = torch.empty((m, inner), dtype=out_dtype or torch.float8_e4m3fn, device=device)
    scales = torch.empty((m, 1), dtype=torch.float32, device=device)
    scaled = a is not None
    first, second = _kernels()
    first[(m, blocks)](gate_up, a if scaled else gate_up, s if scaled else gate_up, y, partial, gate_up.stride(0),
                       inner, blocks, SCALED=scaled, BLOCK=BLOCK, num_warps=4)
    second[(m, blocks)](y, partial, out, scales, inner, blocks, FP8_MAX, _MIN_SCALE, BLOCK=BLOCK,
                        BLOCKS=max(16, 1 << (blocks - 1).bit_length()), num_warps=4)
    return out, scales


def one_pass_fits(inner: int) -> bool:
    """Whether a row of ``inner`` outputs fits one program (:data:`ONE_PASS_MAX`)."""
    return 0 < inner <= ONE_PASS_MAX


def one_pass_pays(rows: int, inner: int, device: Any) -> bool:
    """The default of :func:`silu_mul_quant`'s ``one_pass``: where the row fits and there are at least as many
    rows as the CUDA device has multiprocessors (a program a row leaves the others idle: on an H100 at the
    7B shape it took 7.4 us at 64 rows against the two kernels' 3.8 + 2.1, 13.9 at 256 against 12.3 + 4.9).
    Off CUDA: False (the two kernels)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not one_pass_fits(inner):
        return False
    return rows >= _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _multiprocessors(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def _one_pass(gate_up: Any, a: Any, s: Any, out_dtype: Any) -> tuple[Any, Any]:
    import torch

    m, inner = gate_up.shape[0], gate_up.shape[1] // 2
    if not one_pass_fits(inner):
        raise ValueError(f"silu_mul_quant: one pass takes rows of at most {ONE_PASS_MAX} outputs, got {inner}")
    head, tail, warps = one_pass_launch(inner)
    out = torch.empty((m, inner), dtype=out_dtype or torch.float8_e4m3fn, device=gate_up.device)
    scales = torch.empty((m, 1), dtype=torch.float32, device=gate_up.device)
    scaled = a is not None
    _row_kernel()[(m,)](gate_up, a if scaled else gate_up, s if scaled else gate_up, out, scales, gate_up.stride(0),
                        inner, FP8_MAX, _MIN_SCALE, SCALED=scaled, HEAD=head, TAIL=tail, num_warps=warps)
    return out, scales


def one_pass_launch(inner: int) -> tuple[int, int, int]:
    """The one-pass kernel's ``(HEAD, TAIL, warps)`` for rows of ``inner`` outputs: the largest power of two
    <= ``inner``, the power of two that covers the rest (0 for none), 4-16 warps by the first."""
    import triton

    head = 1 << (inner.bit_length() - 1)  # the largest power of two <= inner
    tail = triton.next_power_of_2(inner - head) if inner > head else 0
    return head, tail, max(4, min(16, head // 1024))


@functools.cache
def _row_kernel() -> Any:
    """The one-pass kernel, defined at first use (Triton reads its interpreter switch then)."""
    import triton
    import triton.language as tl

    @triton.jit
    def silu_mul_row(gate_up, a, s, out, scales, row_stride, inner, fp8_max, min_scale, SCALED: tl.constexpr,
                     HEAD: tl.constexpr, TAIL: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        row = gate_up + r * row_stride
        cols = tl.arange(0, HEAD)  # every column < inner
        gate = tl.load(row + cols)
        up = tl.load(row + inner + cols)
        dtype = gate.dtype
        if SCALED:  # dequantize_out: (raw.float() * a * s) rounded to raw's dtype
            row_scale = tl.load(a + r)
            gate = (gate.to(tl.float32) * row_scale * tl.load(s + cols)).to(dtype)
            up = (up.to(tl.float32) * row_scale * tl.load(s + inner + cols)).to(dtype)
        g = gate.to(tl.float32)
        y = ((tl.fdiv(g, 1.0 + tl.exp(-g)).to(dtype).to(tl.float32)) * up.to(tl.float32)).to(dtype)
        amax = tl.max(tl.abs(y.to(tl.float32)), 0)
        if TAIL > 0:  # columns HEAD .. inner - 1
            cols_t = HEAD + tl.arange(0, TAIL)
            inside = cols_t < inner
            gate_t = tl.load(row + cols_t, mask=inside, other=0.0)
            up_t = tl.load(row + inner + cols_t, mask=inside, other=0.0)
            if SCALED:
                gate_t = (gate_t.to(tl.float32) * row_scale * tl.load(s + cols_t, mask=inside, other=0.0)).to(dtype)
                up_t = (up_t.to(tl.float32) * row_scale * tl.load(s + inner + cols_t, mask=inside, other=0.0)).to(dtype)
            g_t = gate_t.to(tl.float32)
            y_t = ((tl.fdiv(g_t, 1.0 + tl.exp(-g_t)).to(dtype).to(tl.float32)) * up_t.to(tl.float32)).to(dtype)
            amax = tl.maximum(amax, tl.max(tl.abs(y_t.to(tl.float32)), 0))
        scale = tl.maximum(tl.div_rn(amax, fp8_max), min_scale)  # hf_fp8.quantize_rows' clamp_min
        q = tl.clamp(tl.fdiv(y.to(tl.float32), scale), -fp8_max, fp8_max, propagate_nan=tl.PropagateNan.ALL)
        tl.store(out + r * inner + cols, q.to(out.dtype.element_ty))
        if TAIL > 0:
            q_t = tl.clamp(tl.fdiv(y_t.to(tl.float32), scale), -fp8_max, fp8_max, propagate_nan=tl.PropagateNan.ALL)
            tl.store(out + r * inner + cols_t, q_t.to(out.dtype.element_ty), mask=inside)
        tl.store(scales + r, scale)

    return silu_mul_row


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """The two Triton kernels, defined at first use (Triton reads its interpreter switch then)."""
    import triton
    import triton.language as tl

    @triton.jit
    def silu_mul_partial(gate_up, a, s, y, partial, row_stride, inner, blocks, SCALED: tl.constexpr,
                         BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        b = tl.program_id(1)
        cols = b * BLOCK + tl.arange(0, BLOCK)
        inside = cols < inner
        gate = tl.load(gate_up + r * row_stride + cols, mask=inside, other=0.0)
        up = tl.load(gate_up + r * row_stride + inner + cols, mask=inside, other=0.0)
        dtype = gate.dtype
        if SCALED:  # dequantize_out: (raw.float() * a * s) rounded to raw's dtype
            row_scale = tl.load(a + r)
            gate = (gate.to(tl.float32) * row_scale * tl.load(s + cols, mask=inside, other=0.0)).to(dtype)
            up = (up.to(tl.float32) * row_scale * tl.load(s + inner + cols, mask=inside, other=0.0)).to(dtype)
        g = gate.to(tl.float32)
        silu = tl.fdiv(g, 1.0 + tl.exp(-g)).to(dtype)  # F.silu in float32 (the division to ~2 ulp), rounded
        prod = (silu.to(tl.float32) * up.to(tl.float32)).to(dtype)  # silu * up, rounded again
        tl.store(y + r * inner + cols, prod, mask=inside)
        tl.store(partial + r * blocks + b, tl.max(tl.abs(prod.to(tl.float32)), 0))

    @triton.jit
    def quantize_blocks(y, partial, out, scales, inner, blocks, fp8_max, min_scale, BLOCK: tl.constexpr,
                        BLOCKS: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        b = tl.program_id(1)
        each = tl.arange(0, BLOCKS)
        amax = tl.max(tl.load(partial + r * blocks + each, mask=each < blocks, other=0.0), 0)
        scale = tl.maximum(tl.div_rn(amax, fp8_max), min_scale)  # hf_fp8.quantize_rows' clamp_min
        cols = b * BLOCK + tl.arange(0, BLOCK)
        inside = cols < inner
        x = tl.load(y + r * inner + cols, mask=inside, other=0.0).to(tl.float32)
        q = tl.clamp(tl.fdiv(x, scale), -fp8_max, fp8_max, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN
        tl.store(out + r * inner + cols, q.to(out.dtype.element_ty), mask=inside)
        if b == 0:
            tl.store(scales + r, scale)

    return silu_mul_partial, quantize_blocks
