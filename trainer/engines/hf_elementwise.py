"""The element-wise pieces of :mod:`.hf_fused`'s step, eager or compiled into fewer kernels.

Between its matmuls a decode step of the fused path still launches separate kernels for what is one
pass over a few kilobytes a row: RoPE (multiply, roll, multiply-add: 3), the gated MLP's
``silu(gate) * up`` (2) and, on FP8 weights, each projection's per-row activation quantization (float
cast, abs, amax, divide, clamp, divide, clamp, e4m3 cast: 8 kernels a projection, 4 projections a
layer). In a replayed CUDA graph a small model's step costs about the number of its kernels, and at the
Qwen2.5-7B shape the FP8 step's ~900 quantization kernels cost more than its halved weight reads save
(docs/gpu.md). :func:`compiled` gives each piece through ``torch.compile`` (Inductor: one generated
kernel, or two where a row's amax must finish before its scale is applied), with the RMSNorm before an
FP8 projection and the residual add before the second norm folded into the same kernels; the bf16
step's RMSNorms (:func:`norm`) are Inductor's kernels too.

Each function is compiled once per process for any sizes (``dynamic=True``) at its first call; the
engine's first call of a bucket is the eager warm-up before its capture, so no compilation happens
inside a CUDA graph capture, and the generated kernels are captured like any other. The compiled pieces
compute the same function as the eager ones up to float rounding: Inductor keeps a piece's
intermediates in float32 where the eager ops round each to the input's dtype
(``tests/test_engines_hf_elementwise.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from chatgym.trainer.engines import hf_fp8


def rope(qk: Any, cos: Any, sin: Any) -> Any:
    """RoPE on ``qk`` ``(t, heads, d)`` with ``cos`` and the signed ``sin`` ``(t, 1, d)`` (:mod:`.hf_fused`'s
    ``x * cos + roll(x, d/2) * sin'``)."""
    import torch

    return torch.addcmul(qk * cos, torch.roll(qk, qk.shape[-1] // 2, dims=-1), sin)


def norm(x: Any, weight: Any, eps: float) -> Any:
    """RMSNorm of ``x`` ``(t, hidden)`` over its last dimension (``F.rms_norm``: one aten kernel on CUDA,
    which at the Qwen2.5-7B shape took 5.1 us for 64 rows of 3,584 on an H200)."""
    import torch.nn.functional as F

    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def silu_mul(gate_up: Any) -> Any:
    """``silu(gate) * up`` of the concatenated ``(t, 2 * intermediate)`` gate/up projection."""
    import torch.nn.functional as F

    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def norm_quant(x: Any, weight: Any, eps: float) -> tuple[Any, Any]:
    """RMSNorm of ``x`` ``(t, hidden)`` quantized per row for an FP8 projection: ``(X, a)`` as
    :func:`.hf_fp8.quantize_rows` returns them."""
    import torch.nn.functional as F

    return hf_fp8.quantize_rows(F.rms_norm(x, (x.shape[-1],), weight, eps))


# The pieces after an FP8 projection take its output as Fp8Linear.project gives it: ``(out, a, s)``,
# ``a`` and ``s`` None when ``out`` is already scaled, else the scales of a "unit" GEMM still to apply.


def add_norm_quant(hidden: Any, out: Any, weight: Any, eps: float, a: Any = None,
                   s: Any = None) -> tuple[Any, Any, Any]:
    """``hidden + out`` (the residual stream after a projection) and its RMSNorm quantized per row:
    ``(hidden + out, X, a)``."""
    hidden = hidden + dequant(out, a, s)
    return (hidden, *norm_quant(hidden, weight, eps))


def silu_mul_quant(gate_up: Any, a: Any = None, s: Any = None) -> tuple[Any, Any]:
    """:func:`silu_mul` quantized per row for the FP8 down projection."""
    return hf_fp8.quantize_rows(silu_mul(dequant(gate_up, a, s)))


def add(hidden: Any, out: Any, a: Any = None, s: Any = None) -> Any:
    """``hidden + out``: the residual add after the down projection."""
    return hidden + dequant(out, a, s)


def dequant(out: Any, a: Any = None, s: Any = None, bias: Any = None) -> Any:
    """``out`` scaled (:func:`.hf_fp8.dequantize_out`) when ``a`` is given, plus ``bias`` when given."""
    out = out if a is None else hf_fp8.dequantize_out(out, a, s)
    return out if bias is None else out + bias


@dataclass(frozen=True)
class Elementwise:
    """The pieces a fused step calls (module doc): :func:`rope`, :func:`silu_mul`, :func:`norm_quant`,
    :func:`add_norm_quant`, :func:`silu_mul_quant`, :func:`.hf_fp8.quantize_rows` (``quant``),
    :func:`add`, :func:`dequant` and :func:`norm`."""

    rope: Any
    silu_mul: Any
    norm_quant: Any
    add_norm_quant: Any
    silu_mul_quant: Any
    quant: Any
    add: Any
    dequant: Any
    norm: Any


EAGER = Elementwise(rope, silu_mul, norm_quant, add_norm_quant, silu_mul_quant, hf_fp8.quantize_rows, add,
                    dequant, norm)


@functools.cache
def compiled() -> Elementwise:
    """:data:`EAGER`'s functions through ``torch.compile`` (one set per process, shared by its engines)."""
    import torch

    def comp(fn: Any) -> Any:
        return torch.compile(fn, dynamic=True, fullgraph=True)

    return Elementwise(*(comp(fn) for fn in (rope, silu_mul, norm_quant, add_norm_quant, silu_mul_quant,
                                              hf_fp8.quantize_rows, add, dequant, norm)))
