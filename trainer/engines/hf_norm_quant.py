"""The FP8 step's per-row activation quantization, with its residual add and RMSNorm, in one Triton kernel.

Before each FP8 projection the fused step quantizes its input per row (:func:`.hf_fp8.quantize_rows`):
the attention's output before ``o``, and before ``qkv`` and ``gate_up`` the RMSNorm of the residual
stream, to which the projection before (``o``, or the layer before's ``down``, its ``"unit"`` scales
still to apply) is added in the same piece (:func:`.hf_elementwise.add_norm_quant`). Compiled by
Inductor these were a reduction kernel each that walks its row in chunks, once for the sum of squares
and again for the max and the quantized values: at the Qwen2.5-7B shape on an H100 5.4 us a call
(add, norm, quantize; 55 a step) and 4.4 (quantize alone; 28) at 256 rows, 4.3 and 2.9 at 64
(``benchmarks/results/fp8_sampler_rope_h100_2026-12-07/lease4/step_7b.txt``). Here a program takes a
whole row in registers (up to :data:`MAX_WIDTH` columns) and reads and writes it once:

1. with a projection's output: ``h = hidden + out`` (``out`` first scaled by the unit GEMM's ``a · s``
   and rounded to the dtype, as :func:`.hf_fp8.dequantize_out`), rounded, written as the new residual;
2. with a norm weight: ``y = h · rsqrt(mean(h²) + eps) · weight`` in float32, rounded once (as
   ``F.rms_norm``'s CUDA kernel and Inductor's compiled piece round it);
3. ``a = max(max |y| / 448, 1e-12)``, ``X = e4m3(clamp(y / a, ±448))`` (:func:`.hf_fp8.quantize_rows`;
   the division as ``tl.fdiv``, to ~2 ulp of float32, as :mod:`.hf_silu_quant` divides).

On that shape and card the 85 calls a step (the final norm's for the FP8 LM head among them, which was
an eager ``quantize_rows`` of several kernels) took 3.7-3.8 us each at 256 rows, 2.7-2.8 at 64
(``benchmarks/results/fp8_row_quant_h100_2026-12-07``): 0.312-0.322 ms a step against Inductor's
0.421 (and the final norm's and the head's kernels), at 64 rows 0.231-0.235 against 0.319.

The result is the eager pieces' up to float rounding (the sums' order, ``rsqrt``'s last bits):
``tests/test_engines_hf_norm_quant.py`` in Triton's interpreter on the CPU (float32), ``-m gpu`` on bf16
against the eager pieces (passed on an H100, 2026-12-07).
"""

from __future__ import annotations

import functools
from typing import Any

from chatgym.trainer.engines import hf_fp8
from chatgym.trainer.engines.hf_fp8 import _MIN_SCALE, FP8_MAX

MAX_WIDTH = 16384  # columns a row may have (32 a thread at 16 warps); wider rows keep the compiled pieces


def fits(width: int) -> bool:
    """Whether rows of ``width`` columns fit the kernel (:data:`MAX_WIDTH`)."""
    return 0 < width <= MAX_WIDTH


def launch(width: int) -> tuple[int, int]:
    """The kernel's ``(BLOCK, warps)`` for rows of ``width`` columns: the power of two that covers the row,
    one warp a 512 columns (4 to 16)."""
    import triton

    block = triton.next_power_of_2(width)
    return block, max(4, min(16, block // 512))


def quant(x: Any, out_dtype: Any = None) -> tuple[Any, Any]:
    """:func:`.hf_fp8.quantize_rows` of ``x`` ``(M, K)`` (bf16 / fp16 / fp32, last stride 1): ``(X, a)``,
    ``X`` ``(M, K)`` in ``out_dtype`` (default float8_e4m3fn; float32 keeps the unrounded ``y / a``, the
    tests' view), ``a`` ``(M, 1)`` float32. A NaN gives NaN where the eager piece has it; the row's
    scale and other values come from its other entries, where the eager piece's are NaN (an infinite
    entry in a normed row: the eager row all NaN, here the entry NaN and the rest 0).

    Raises:
        ValueError: ``x`` not 2-D with a dense last dimension, or rows of no column or wider than
            :data:`MAX_WIDTH`.
    """
    _, q, a = _run(x, None, None, None, 0.0, out_dtype)
    return q, a


def norm_quant(x: Any, weight: Any, eps: float, out_dtype: Any = None) -> tuple[Any, Any]:
    """:func:`.hf_elementwise.norm_quant`: the RMSNorm of ``x`` ``(M, K)`` with ``weight`` ``(K,)``
    quantized per row, ``(X, a)`` as :func:`quant`. Raises as :func:`quant`, and for a weight of another
    shape or not dense."""
    _, q, a = _run(x, None, weight, None, eps, out_dtype)
    return q, a


def add_norm_quant(hidden: Any, out: Any, weight: Any, eps: float, a: Any = None, s: Any = None,
                   out_dtype: Any = None) -> tuple[Any, Any, Any]:
    """:func:`.hf_elementwise.add_norm_quant`: ``(hidden + out, X, a_out)``.

    Args:
        hidden: ``(M, K)`` the residual stream (bf16 / fp16 / fp32, last stride 1).
        out: ``(M, K)`` a projection's output in ``hidden``'s dtype; with ``a``, a ``"unit"`` GEMM's
            unscaled product.
        weight: ``(K,)`` the RMSNorm's weight; ``eps`` its epsilon.
        a, s: ``(M, 1)`` and ``(1, K)`` float32 scales of that GEMM, or None (``out`` scaled already).

    Returns:
        The new residual ``(M, K)`` in ``hidden``'s dtype, ``X`` ``(M, K)`` float8_e4m3fn and its ``(M, 1)``
        float32 row scales (``X`` in ``out_dtype`` when given, as :func:`quant`).

    Raises:
        ValueError: ``a`` without ``s``, shapes that differ, ``out`` not dense in its last dimension, a
            weight or scales of other shapes or not dense (:func:`.hf_fp8.check_unit_scales`), or what
            :func:`quant` refuses.
    """
    if (a is None) != (s is None):
        raise ValueError("add_norm_quant: the unit GEMM's scales come together (a and s)")
    if out.shape != hidden.shape or out.dtype != hidden.dtype:
        raise ValueError(f"add_norm_quant: out {tuple(out.shape)} {out.dtype} and hidden {tuple(hidden.shape)} "
                         f"{hidden.dtype} differ")
    return _run(hidden, out, weight, None if a is None else (a, s), eps, out_dtype)


def _run(x: Any, out: Any, weight: Any, scales: Any, eps: float, out_dtype: Any) -> tuple[Any, Any, Any]:
    import torch

    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"row quantization: rows must be 2-D with a dense last dimension, got {tuple(x.shape)}")
    if out is not None and out.stride(-1) != 1:
        raise ValueError(f"add_norm_quant: out's last dimension must be dense, got strides {out.stride()}")
    m, width = x.shape
    if not fits(width):
        raise ValueError(f"row quantization: rows of {width} columns; the kernel takes 1 to {MAX_WIDTH}")
    if weight is not None and (tuple(weight.shape) != (width,) or weight.stride(0) != 1):
        raise ValueError(f"row quantization: the norm's weight must be dense ({width},), got {tuple(weight.shape)}")
    if scales is not None:
        hf_fp8.check_unit_scales(*scales, m, width, "add_norm_quant")
    block, warps = launch(width)
    device = x.device
    q = torch.empty((m, width), dtype=out_dtype or torch.float8_e4m3fn, device=device)
    row_scales = torch.empty((m, 1), dtype=torch.float32, device=device)
    hidden = torch.empty_like(x) if out is not None else x
    a, s = scales if scales is not None else (x, x)  # pointers a disabled part never reads
    _kernel()[(m,)](x, x.stride(0), x if out is None else out, 0 if out is None else out.stride(0), a, s,
                    x if weight is None else weight, hidden, hidden.stride(0), q, row_scales, width, float(eps),
                    FP8_MAX, _MIN_SCALE, ADD=out is not None, SCALED=scales is not None, NORM=weight is not None,
                    BLOCK=block, num_warps=warps)
    return hidden, q, row_scales


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, defined at first use (Triton reads its interpreter switch then)."""
    import triton
    import triton.language as tl

    @triton.jit
    def row_quant(x, x_row, out, out_row, a, s, weight, hidden, hidden_row, q, scales, width, eps, fp8_max,
                  min_scale, ADD: tl.constexpr, SCALED: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < width
        h = tl.load(x + r * x_row + cols, mask=inside, other=0.0)
        dtype = h.dtype
        if ADD:
            o = tl.load(out + r * out_row + cols, mask=inside, other=0.0)
            if SCALED:  # dequantize_out: (raw.float() * a * s) rounded to the dtype
                o = (o.to(tl.float32) * tl.load(a + r) * tl.load(s + cols, mask=inside, other=0.0)).to(dtype)
            h = (h.to(tl.float32) + o.to(tl.float32)).to(dtype)
            tl.store(hidden + r * hidden_row + cols, h, mask=inside)
        y = h.to(tl.float32)
        if NORM:  # F.rms_norm on CUDA: in float32, rounded once
            inv_rms = tl.rsqrt(tl.sum(y * y, 0) / width + eps)
            w = tl.load(weight + cols, mask=inside, other=0.0).to(tl.float32)
            y = (y * inv_rms * w).to(dtype).to(tl.float32)
        scale = tl.maximum(tl.div_rn(tl.max(tl.abs(y), 0), fp8_max), min_scale)  # quantize_rows' clamp_min
        v = tl.clamp(tl.fdiv(y, scale), -fp8_max, fp8_max, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN
        tl.store(q + r * width + cols, v.to(q.dtype.element_ty), mask=inside)
        tl.store(scales + r, scale)

    return row_quant
