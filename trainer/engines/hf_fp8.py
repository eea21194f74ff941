"""FP8 weights for the fused decode step (:mod:`.hf_fused`): e4m3 with per-output-channel scales,
activations quantized per row, ``torch._scaled_mm`` with row-wise scaling (or unit scales, the scales
applied after it: :data:`GEMMS`).

A decode step at the 7B shape is memory-bound: it reads every weight once per step, so weights of one
byte instead of two halve its floor. The scheme is vLLM's dynamic per-channel FP8 (its ``fp8_per_channel``
online quantization: channel-wise weight scales and per-token activation scales; vLLM's plain ``fp8``
scales weights per tensor):

* weight ``W`` (N outputs × K inputs), per output row ``n``: ``s_n = max_k |W[n, k]| / 448`` (448 is
  e4m3fn's largest finite value), ``Q[n, k] = e4m3(W[n, k] / s_n)``;
* activation ``x`` (M rows × K), per row ``m``: ``a_m = max_k |x[m, k]| / 448``, ``X = e4m3(x / a)``;
* ``y = torch._scaled_mm(X, Q.t(), scale_a=a (M, 1), scale_b=s (1, N), out_dtype=bf16)``, which is
  ``(X · diag) (Q · diag)^T`` accumulated in fp32 and rounded once to the output dtype; or, the
  ``"unit"`` GEMM of :data:`GEMMS` (the default with compiled element-wise pieces), ``X · Q^T`` with
  unit scales, rounded to the output dtype, then times ``a · s`` in the kernel that follows.

Error of one quantized weight (round to nearest, 3 mantissa bits): a scaled value in e4m3's normal
range (|v| >= 2^-6) is off by at most half its spacing, ``2^-4 · |v|``; below it (subnormals, spacing
2^-9) by at most ``2^-10``. So ``|W − dequant(Q)| <= 2^-4 · |W| + 2^-10 · s_n`` per element, and a
row's relative error ``‖W_n − dequant(Q_n)‖ / ‖W_n‖`` is at most ``2^-4 + 2^-10 · s_n · sqrt(K) / ‖W_n‖``
(``tests/test_engines_hf_fp8.py`` asserts both per layer).

The buffers are written in place (:meth:`Fp8Linear.requantize`), so a captured CUDA graph that reads
them needs no recapture after a weight update. ``torch._scaled_mm`` runs on CUDA devices of compute
capability 8.9 and up (Ada, Hopper) and, more slowly, on the CPU; runs refuse FP8 elsewhere
(:func:`chatgym.trainer.models.cuda.fp8_unsupported`), the tests call these functions on the CPU
directly.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Sequence
from typing import Any

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# Scales never reach 0 (an all-zero row or activation): x / tiny stays 0, and no 0/0.
_MIN_SCALE = 1e-12

# How the fused step's projections multiply (scaled_mm): "rowwise" (row-wise scales in the GEMM: cuBLASLt's
# outer-vector-scaled kernels), "unit" (a tensor-wise GEMM with unit scales, the row and channel scales
# applied by the compiled piece after it) or "cutlass" (vLLM's CUTLASS kernels, vllm._custom_ops.cutlass_scaled_mm:
# the row and channel scales and the q/k/v bias in the GEMM's epilogue, the kernels vLLM's own FP8 layers run;
# CUDA with vLLM installed). On an H100 at the 7B shape the unit GEMMs took 2.700 / 3.467 ms a step against
# rowwise's 3.696 / 4.274 at 64 / 256 rows, but applying the scales in a kernel of their own cost more than
# that (docs/gpu.md): so "unit" with compiled pieces, "rowwise" without (default_gemm). CHATGYM_FP8_GEMM
# overrides it for a process (benchmarks). "unit_fast": "unit" with the FP8 tensor cores' own accumulation
# (torch._scaled_mm's use_fast_accum): Hopper's FP8 MMA keeps a running sum of limited precision (DeepSeek-V3,
# arXiv 2412.19437 section 3.3.2: about 14 bits, a maximum relative error near 2% at K = 4096), and the
# exact path adds each few k-steps' partial sum into float32 registers in extra instructions; the fast
# one is what vLLM's CUTLASS FP8 kernels on Hopper run (their "FP8FastAccum" schedules). Its error is one
# more part of rollout/mismatch/*. On an H100 at the 7B shape it took the 256-row step from 5.580 to 5.479 ms,
# with a largest error at K = 18,944 of 1.18% of the largest product against the exact path's 0.21%: not the
# default (benchmarks/results/fp8_sampler_rope_h100_2026-12-07/lease3).
# A split-K Triton GEMM of chatgym's own (all the rows a tile, K sliced over the multiprocessors) was
# slower than cuBLASLt's at every projection on an H100 (docs/gpu.md): removed.
GEMMS = ("rowwise", "unit", "cutlass", "unit_fast")
UNSCALED = ("unit", "unit_fast")  # the GEMMs whose output the caller still scales (dequantize_out)


def default_gemm(compiled: bool, dtype: Any = None) -> str:
    """The FP8 GEMM of a fused step with (``compiled``) or without compiled element-wise pieces, for a model
    whose weights are ``dtype`` (a ``torch.dtype`` or its name; ``None`` or another name, such as
    ``"auto"``: not known yet; float16: never an unscaled GEMM, see :func:`check_gemm_dtype`).

    Raises:
        ValueError: ``CHATGYM_FP8_GEMM`` set to a value not in :data:`GEMMS`, to ``"cutlass"`` where vLLM
            is not installed (the engine's option check calls this before any model loads), or to a GEMM
            of :data:`UNSCALED` with a float16 ``dtype``.
    """
    # in any case and spacing, as engine.options.quantization is read ("Unit" is "unit")
    gemm = os.environ.get("CHATGYM_FP8_GEMM", "").strip().lower()
    if not gemm:
        return "unit" if compiled and not _float16(dtype) else "rowwise"
    if gemm not in GEMMS:
        raise ValueError(f"CHATGYM_FP8_GEMM must be one of {GEMMS}, got {gemm!r}")
    if gemm == "cutlass" and importlib.util.find_spec("vllm") is None:
        raise ValueError("CHATGYM_FP8_GEMM=cutlass runs vLLM's CUTLASS kernel, and vllm is not installed here")
    check_gemm_dtype(gemm, dtype, "CHATGYM_FP8_GEMM")
    return gemm


def check_gemm_dtype(gemm: str, dtype: Any, who: str = "fp8 gemm") -> None:
    """Refuse an unscaled GEMM (:data:`UNSCALED`) whose output would be float16.

    Its output is the product of the e4m3 codes (each up to 448 in magnitude) before the scales: at K =
    3,584 with Gaussian weights and activations most such sums pass float16's largest value, 65,504, and
    round to inf (bf16 reaches 3.4e38). The scaled GEMMs apply ``a · s`` before their one rounding.

    Raises:
        ValueError: ``gemm`` in :data:`UNSCALED` and ``dtype`` float16 (``torch.float16`` or
            ``"float16"``), naming ``who``.
    """
    if gemm in UNSCALED and _float16(dtype):
        raise ValueError(f"{who}={gemm!r} with a float16 model: its unscaled product of e4m3 codes overflows "
                         "float16 (65,504); take 'rowwise' or 'cutlass', or a bfloat16 model")


def _float16(dtype: Any) -> bool:
    import torch

    return dtype == torch.float16 or dtype == "float16"  # a config's name (engine.dtype, options' dtype) too


def quantize_rowwise(weight: Any) -> tuple[Any, Any]:
    """``(Q, s)``: ``weight`` ``(N, K)`` as float8_e4m3fn with one float32 scale per row, ``s`` of shape
    ``(1, N)`` (the layout ``torch._scaled_mm`` takes as ``scale_b``)."""
    import torch

    q = torch.empty(weight.shape, dtype=torch.float8_e4m3fn, device=weight.device)
    s = torch.empty((1, weight.shape[0]), dtype=torch.float32, device=weight.device)
    quantize_into(weight, q, s)
    return q, s


def quantize_into(weight: Any, q: Any, s: Any) -> None:
    """Quantize ``weight`` ``(N, K)`` into the existing buffers ``q`` ``(N, K)`` float8_e4m3fn and ``s``
    ``(1, N)`` float32 (their storage is kept: captured graphs keep reading them)."""
    import torch

    with torch.no_grad():
        w = weight.detach().float()
        scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(_MIN_SCALE)  # (N, 1)
        q.copy_((w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn))
        s.copy_(scale.view(1, -1))


def dequantize(q: Any, s: Any) -> Any:
    """``(N, K)`` float32: ``q · s`` row by row (the weight the FP8 matmul computes with)."""
    return q.float() * s.view(-1, 1)


def quantize_rows(x: Any) -> tuple[Any, Any]:
    """Dynamic per-row quantization of activations ``x`` ``(M, K)``: ``(X, a)`` with ``X`` float8_e4m3fn
    and ``a`` ``(M, 1)`` float32."""
    import torch

    xf = x.float()
    a = (xf.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(_MIN_SCALE)
    return (xf / a).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), a


def fp8_matmul(x: Any, q: Any, s: Any, out_dtype: Any) -> Any:
    """``x @ dequant(q, s).T`` on FP8 tensor cores: ``x`` ``(M, K)`` (any float dtype) quantized per row,
    ``q`` ``(N, K)`` float8_e4m3fn, ``s`` ``(1, N)``; returns ``(M, N)`` in ``out_dtype``."""
    return scaled_mm(*quantize_rows(x), q, s, out_dtype)


def scaled_mm(xq: Any, a: Any, q: Any, s: Any, out_dtype: Any, gemm: str = "rowwise", bias: Any = None) -> Any:
    """:func:`fp8_matmul` of activations already quantized by :func:`quantize_rows` (``xq`` ``(M, K)``
    float8_e4m3fn, ``a`` ``(M, 1)`` float32), as the GEMM ``gemm`` of :data:`GEMMS` computes it.

    ``"unit"`` (and ``"unit_fast"``) returns the product *unscaled* (``X · Q^T``, rounded to ``out_dtype``): the caller
    multiplies by ``a · s`` (:func:`dequantize_out`), which :mod:`.hf_elementwise`'s compiled pieces
    fold into the kernel after the GEMM. ``bias`` (``(N,)`` in ``out_dtype``, bf16 or fp16) is added in
    ``"cutlass"``'s epilogue; the other GEMMs take none (:attr:`Fp8Linear.takes_bias`).

    Raises:
        ValueError: an unknown ``gemm``, or ``bias`` with a GEMM that takes none.
    """
    import torch

    if bias is not None and gemm != "cutlass":
        raise ValueError(f"fp8 gemm {gemm!r} takes no bias (only 'cutlass' adds it in the GEMM)")
    if gemm == "rowwise":
        return torch._scaled_mm(xq, q.t(), scale_a=a, scale_b=s, out_dtype=out_dtype)
    if gemm in UNSCALED:
        one = _unit_scale(xq.device)
        return torch._scaled_mm(xq, q.t(), scale_a=one, scale_b=one, out_dtype=out_dtype,
                                use_fast_accum=gemm == "unit_fast")
    if gemm == "cutlass":
        return _cutlass_scaled_mm()(xq, q.t(), a, s, out_dtype, bias)
    raise ValueError(f"fp8 gemm must be one of {GEMMS}, got {gemm!r}")


@functools.cache
def _cutlass_scaled_mm() -> Any:
    """vLLM's ``cutlass_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias)``, imported at first use (vLLM
    registers its CUDA ops then)."""
    from vllm import _custom_ops

    return _custom_ops.cutlass_scaled_mm


def dequantize_out(raw: Any, a: Any, s: Any) -> Any:
    """A ``"unit"`` GEMM's ``(M, N)`` output scaled by the activations' ``a`` ``(M, 1)`` and the weights'
    ``s`` ``(1, N)`` in float32, rounded back to ``raw``'s dtype (what ``"rowwise"`` returns, but for
    the rounding of ``raw``: 2^-9 relative in bf16, against FP8's 2^-4)."""
    return (raw.float() * a * s).to(raw.dtype)


def check_unit_scales(a: Any, s: Any, rows: int, cols: int, who: str) -> None:
    """Check a ``"unit"`` GEMM's scales as a kernel reads them: ``a`` ``(rows, 1)`` and ``s`` ``(1, cols)``,
    float32, each dense (a kernel indexes ``a + r`` and ``s + c``; the eager pieces would broadcast any
    strides).

    Raises:
        ValueError: a scale missing (None), or other shapes, strides or dtypes, naming ``who``.
    """
    import torch

    if a is None or s is None:
        raise ValueError(f"{who}: needs the row scales a and the channel scales s, got a {type(a).__name__} "
                         f"and s {type(s).__name__}")
    if a.dtype != torch.float32 or s.dtype != torch.float32:
        raise ValueError(f"{who}: the scales must be float32, got a {a.dtype} and s {s.dtype}")
    if tuple(a.shape) != (rows, 1) or (rows > 1 and a.stride(0) != 1):
        raise ValueError(f"{who}: a must be dense ({rows}, 1), got {tuple(a.shape)} with strides {a.stride()}")
    if tuple(s.shape) != (1, cols) or (cols > 1 and s.stride(1) != 1):
        raise ValueError(f"{who}: s must be dense (1, {cols}), got {tuple(s.shape)} with strides {s.stride()}")


@functools.cache
def _unit_scale(device: Any) -> Any:
    import torch

    return torch.ones((), dtype=torch.float32, device=device)


def fp8_shape_ok(weight: Any) -> bool:
    """Whether ``weight`` ``(N, K)`` fits ``torch._scaled_mm`` on CUDA (both sizes multiples of 16); the
    fused step refuses FP8 for a model with a weight that does not."""
    return weight.device.type != "cuda" or (weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0)


class Fp8Linear:
    """One (concatenated) linear layer's weights in FP8, refreshed in place from its sources.

    Args:
        sources: the source weights, each ``(N_i, K)``, concatenated along the outputs (q/k/v,
            gate/up) — the quantization is per output row, so it is the same as quantizing each alone.
        gemm: one of :data:`GEMMS`.
    """

    def __init__(self, sources: Sequence[Any], gemm: str = "rowwise") -> None:
        import torch

        self.gemm = gemm
        if self.gemm not in GEMMS:
            raise ValueError(f"fp8 gemm must be one of {GEMMS}, got {self.gemm!r}")
        self.weight, self.scale = quantize_rowwise(torch.cat([w.detach() for w in sources]))

    def requantize(self, sources: Sequence[Any]) -> None:
        """Quantize the sources' current values into the same buffers (scales recomputed)."""
        import torch

        quantize_into(torch.cat([w.detach() for w in sources]), self.weight, self.scale)

    def mm(self, xq: Any, a: Any, out_dtype: Any) -> Any:
        """``(M, N)`` in ``out_dtype`` from activations already quantized (:func:`scaled_mm`)."""
        out, a, s = self.project(xq, a, out_dtype)
        return out if a is None else dequantize_out(out, a, s)

    @property
    def takes_bias(self) -> bool:
        """Whether :meth:`project` adds a bias inside the GEMM (``"cutlass"``)."""
        return self.gemm == "cutlass"

    def project(self, xq: Any, a: Any, out_dtype: Any, bias: Any = None) -> tuple[Any, Any, Any]:
        """``(out, None, None)`` with ``out`` = :meth:`mm` (plus ``bias`` ``(N,)`` where
        :attr:`takes_bias`), or for the ``"unit"`` GEMM ``(raw, a, s)``: the unscaled product and the
        scales still to apply (:func:`dequantize_out`), so that a compiled piece after it applies them in
        its own kernel."""
        out = scaled_mm(xq, a, self.weight, self.scale, out_dtype, self.gemm, bias)
        return (out, a, self.scale) if self.gemm in UNSCALED else (out, None, None)


QUANTIZATIONS = (None, "fp8")


def check_quantization(quantization: str | None, device: Any) -> bool:
    """Whether an engine on ``device`` runs FP8 weights (``quantization`` ``"fp8"``, in any case, as the
    config-load check reads it: :func:`~chatgym.trainer.models.cuda.is_fp8`).

    Raises:
        ValueError: an unknown ``quantization``, or ``"fp8"`` where the device has no FP8 (a CPU, a GPU of
            compute capability < 8.9), the reason in one line.
    """
    from chatgym.trainer.models.cuda import fp8_unsupported

    if isinstance(quantization, str):
        quantization = quantization.lower()
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be None or 'fp8', got {quantization!r}")
    if quantization is None:
        return False
    why = fp8_unsupported(device)
    if why is not None:
        raise ValueError(f"quantization 'fp8' is refused: {why}")
    return True
