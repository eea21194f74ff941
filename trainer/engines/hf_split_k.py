"""The FP8 step's unit GEMM as a Triton kernel that splits the inner dimension (split-K), its partial sums
added in a fixed order.

At the Qwen2.5-7B shape and 256 rows on an H100 cuBLASLt's unit FP8 GEMM (:data:`.hf_fp8.GEMMS`
``"unit"``) read the down projection's weights at 1.82 TB/s and o's at 1.33
(``benchmarks/results/fp8_attention_values_h100_2026-12-07/lease3/gemm_7b.txt``: 37.4 and 9.7 us a
layer), against the ~3 TB/s a copy reaches: its tiles cover 64 of the 256 rows, so every weight tile is
read from L2 four times (twice with its cluster's multicast), and with 3,584 outputs one tile per
multiprocessor is all the grid holds. Here a program takes up to all the rows (``BM``) and ``BN``
outputs of one slice of the inner dimension: a weight is read once, the activations (a few MB, in L2)
once per output tile, and ``SPLIT`` slices of K fill the multiprocessors (the split-K of CUTLASS and of
Triton's own matmul tutorial; stream-K, arXiv 2301.03598, is the general form). Each program writes its
tile's float32 partial sum to a workspace and counts itself in on the tile's counter (an atomic with
acquire-release order); the last of a tile's programs adds the ``SPLIT`` partials in slice order,
``((0 + p_0) + p_1) + ...``, rounds the sum once to the output dtype and resets the counter. The sum's
order does not depend on which program finishes last, so the result is the same bits run after run (an
atomic float add into the output would not be).

The product is :func:`.hf_fp8.scaled_mm`'s ``"unit"`` one (``X · Q^T``, the scales applied by the kernel
after it: ``CHATGYM_FP8_GEMM=split_k``) or, given the row and channel scales, its ``"rowwise"`` one (the
sum times ``a · s`` before its one rounding: ``split_k_rowwise``), up to float32's summation order:
``tests/test_engines_hf_split_k.py`` against a float64 product in Triton's interpreter on the CPU, ``-m
gpu`` against ``torch._scaled_mm``. Launches: ``CHATGYM_FP8_SPLIT_K_CONFIG`` (:func:`launch`), which
``benchmarks/fp8_gemm_gpu.py --sweep --write`` writes, else :func:`default_launch`. Not yet run on a GPU
(docs/gpu.md).

The workspace and counters (:class:`Workspace`) belong to the caller whose GEMMs run one after another:
each fused step has its own (:class:`.hf_fp8.Fp8Linear`'s ``workspace``). They are made outside any
CUDA-graph capture: a call captured before they exist for its size runs ``torch._scaled_mm`` instead (the
same product, :func:`.hf_fp8.scaled_mm`), as does a size the kernel does not take (:func:`fits`) or a
launch given as ``"cublas"``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Any

MAX_TILES = 4096  # output tiles a call may have (the counters' length)
MAX_ROWS = 256  # rows up to which a product without a launch of its own takes default_launch


@dataclass(frozen=True)
class Launch:
    """A launch of the kernel: ``bm`` x ``bn`` output tiles, ``bk`` inner columns a step, the inner dimension
    cut in ``split`` slices (1: no workspace), ``warps`` and software-pipeline ``stages``."""

    bm: int
    bn: int
    bk: int
    split: int
    warps: int
    stages: int

    def check(self, where: str) -> None:
        """Raises ValueError naming ``where`` unless every block is a power of two from 16 (``tl.dot``;
        ``bk`` from 32, FP8's smallest MMA depth) to 256, ``split`` 1 to 16, ``warps`` 4 or 8, ``stages``
        1 to 6."""
        blocks_ok = all(16 <= b <= 256 and not b & (b - 1) for b in (self.bm, self.bn, self.bk)) and self.bk >= 32
        if not blocks_ok or not 1 <= self.split <= 16 or self.warps not in (4, 8) or not 1 <= self.stages <= 6:
            raise ValueError(f"{where}: {self} must have BM, BN, BK powers of two from 16 to 256 (BK from 32), "
                             "SPLIT 1 to 16, WARPS 4 or 8, STAGES 1 to 6")


def default_launch(m: int, n: int, k: int, processors: int = 132) -> Launch:
    """The launch for an ``(m, k) x (k, n)`` product on a GPU of ``processors`` multiprocessors: tiles of
    all the rows up to 256 and 128 outputs, 128 inner columns a step, and as many slices of K as keep
    the grid within one program a multiprocessor, each slice at least 4 steps."""
    bm = min(256, max(64, 1 << (max(m, 1) - 1).bit_length()))
    bn, bk = 128, 128
    tiles = -(-m // bm) * -(-n // bn)
    steps = -(-k // bk)
    split = max(1, min(16, processors // tiles, steps // 4))
    return Launch(bm, bn, bk, split, 8 if bm >= 128 else 4, 4 if bm >= 256 else 5)


def launch(m: int, n: int, k: int, processors: int = 132) -> Launch | None:
    """The launch for an ``(m, k) x (k, n)`` product: ``CHATGYM_FP8_SPLIT_K_CONFIG``'s entry for
    ``"m,n,k"`` (None where it says ``"cublas"``: ``torch._scaled_mm`` runs it), else
    :func:`default_launch` for a decode step's rows (up to :data:`MAX_ROWS`) and None for more (a
    prefill's GEMMs are compute-bound, cuBLASLt's ground).

    Raises:
        ValueError: the variable is not a JSON object of ``"m,n,k"`` to ``[BM, BN, BK, SPLIT, WARPS,
            STAGES]`` or ``"cublas"``, or a launch is out of range (:meth:`Launch.check`).
    """
    chosen = launch_table().get((m, n, k), "default")
    if chosen == "default":
        return default_launch(m, n, k, processors) if m <= MAX_ROWS else None
    return chosen


class _Pairs(list):
    """A JSON object's (key, value) pairs in order (json's ``object_pairs_hook``)."""


@functools.cache
def launch_table() -> dict[tuple[int, int, int], Launch | None]:
    """``CHATGYM_FP8_SPLIT_K_CONFIG`` read and checked (once a process): ``(m, n, k)`` -> a launch, or None
    for ``"cublas"``; empty where the variable is unset. Raises ValueError as :func:`launch` says."""
    name = "CHATGYM_FP8_SPLIT_K_CONFIG"
    text = os.environ.get(name, "").strip()
    if not text:
        return {}
    try:
        parsed = json.loads(text, object_pairs_hook=_Pairs)  # a key given twice is refused, not the last kept
        if not isinstance(parsed, _Pairs) or len({key for key, _ in parsed}) < len(parsed):
            raise ValueError
        out: dict[tuple[int, int, int], Launch | None] = {}
        for key, value in parsed:
            m, n, k = (int(v) for v in key.split(","))
            if min(m, n, k) < 1:
                raise ValueError
            if isinstance(value, str) and value.lower() == "cublas":
                out[(m, n, k)] = None
                continue
            if not isinstance(value, list) or len(value) != 6 or not all(type(v) is int for v in value):  # no bools
                raise ValueError
            out[(m, n, k)] = Launch(*value)
    except ValueError:
        raise ValueError(f'{name} must be a JSON object of "M,N,K" to [BM, BN, BK, SPLIT, WARPS, STAGES] or '
                         f'"cublas", got {text!r}') from None
    for (m, n, k), chosen in out.items():
        if chosen is not None:
            chosen.check(f"{name} {m},{n},{k}")
    return out


def fits(xq: Any, q: Any) -> bool:
    """Whether the kernel takes ``xq`` ``(M, K)`` and ``q`` ``(N, K)``: both float8_e4m3fn, their last
    stride 1, K a multiple of 16 (16-byte rows for the loads), no size 0 (cuBLASLt's GEMM takes those)."""
    import torch

    return (xq.dtype == q.dtype == torch.float8_e4m3fn and xq.dim() == q.dim() == 2 and xq.shape[1] == q.shape[1]
            and xq.stride(1) == 1 and q.stride(1) == 1 and xq.shape[1] % 16 == 0 and min(*xq.shape, q.shape[0]) > 0)


def mm(xq: Any, q: Any, out_dtype: Any, chosen: Launch | None = None, workspace: Workspace | None = None,
       a: Any = None, s: Any = None) -> Any:
    """``X · Q^T`` of ``xq`` ``(M, K)`` and ``q`` ``(N, K)`` (float8_e4m3fn), summed in float32, with
    ``a`` ``(M, 1)`` and ``s`` ``(1, N)`` (dense float32, both or neither) times ``a · s`` in float32 (the
    ``"rowwise"`` GEMM's product, :func:`.hf_fp8.scaled_mm`), rounded once to ``out_dtype`` (bf16 / fp16 /
    fp32): ``(M, N)``; None where the kernel does not run it (the caller runs ``torch._scaled_mm`` with
    the same scales, :func:`.hf_fp8.scaled_mm`): sizes it does not take
    (:func:`fits`), a launch of ``"cublas"``, a first call of a size inside a CUDA-graph capture, the CPU
    unless Triton runs in its interpreter (``TRITON_INTERPRET=1``, the tests). ``chosen`` overrides
    :func:`launch` (benchmarks); ``workspace`` (default :data:`SHARED`) holds the partial sums.

    Raises:
        ValueError: one scale without the other, scales not dense float32 of ``M`` and ``N`` entries, an
            ``out_dtype`` not bf16 / fp16 / fp32.
    """
    import torch

    m, k = xq.shape
    n = q.shape[0]
    if (a is None) != (s is None):
        raise ValueError("split_k: the row scales a and the channel scales s come together")
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"split_k: out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    if a is not None and (a.dtype != torch.float32 or s.dtype != torch.float32 or a.numel() != m or s.numel() != n
                          or not a.is_contiguous() or not s.is_contiguous()):
        raise ValueError(f"split_k: the scales must be dense float32, a of {m} rows and s of {n} columns, got a "
                         f"{a.dtype} {tuple(a.shape)} and s {s.dtype} {tuple(s.shape)}")
    if not fits(xq, q) or (xq.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1"):
        return None
    if chosen is None:
        chosen = launch(m, n, k, _processors(xq.device))
        if chosen is None:
            return None
    tiles_m, tiles_n = -(-m // chosen.bm), -(-n // chosen.bn)
    steps = -(-k // chosen.bk)
    split = min(chosen.split, steps)
    per_split = -(-steps // split) * chosen.bk
    split = -(-k // per_split)  # no empty slice
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if split == 1:
        partials = counters = out  # not read
    else:
        buffers = (workspace or SHARED).buffers(xq.device, split * m * n, tiles_m * tiles_n)
        if buffers is None:
            return None
        partials, counters = buffers
    _kernel()[(tiles_n, tiles_m, split)](
        xq, q, out, partials, counters, out if a is None else a, out if s is None else s, m, n, k, xq.stride(0),
        q.stride(0), out.stride(0), per_split, split, BM=chosen.bm, BN=chosen.bn, BK=chosen.bk, SLICED=split > 1,
        EVEN_K=k % chosen.bk == 0, SUM_ROWS=min(chosen.bm, 32), SCALED=a is not None,
        num_warps=chosen.warps, num_stages=chosen.stages)
    return out


@functools.cache
def _processors(device: Any) -> int:
    import torch

    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


class Workspace:
    """A float32 workspace for the partial sums and int32 tile counters (zeros between calls), shared by
    the GEMMs that run one after another: one fused step's projections (each engine its own, so two
    engines' steps may run at once on two streams). It grows outside a CUDA-graph capture only, and keeps
    what it outgrew (a graph captured before replays into it)."""

    def __init__(self) -> None:
        self.partials: Any = None
        self.counters: Any = None
        self.outgrown: list[Any] = []

    def buffers(self, device: Any, numel: int, tiles: int) -> tuple[Any, Any] | None:
        """``(partials, counters)`` on ``device`` with at least ``numel`` floats; None where they would have
        to be made inside a capture, or ``tiles`` exceeds :data:`MAX_TILES`."""
        import torch

        if tiles > MAX_TILES:
            return None
        if self.partials is not None and self.partials.numel() >= numel and self.partials.device == device:
            return self.partials, self.counters
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        if self.counters is None or self.counters.device != device:
            self.counters = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
        if self.partials is not None:
            self.outgrown.append(self.partials)
        self.partials = torch.empty(numel, dtype=torch.float32, device=device)
        return self.partials, self.counters


SHARED = Workspace()  # callers that bring none (benchmarks, tests): one process-wide, one stream at a time


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def split_k_gemm(x, w, out, partials, counters, row_scales, col_scales, M, N, K, stride_x, stride_w,
                     stride_out, per_split, split, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     SLICED: tl.constexpr, EVEN_K: tl.constexpr, SUM_ROWS: tl.constexpr, SCALED: tl.constexpr):
        pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        inner = tl.arange(0, BK)
        row_ok, col_ok = rows < M, cols < N
        k_lo = pid_k * per_split
        k_hi = tl.minimum(k_lo + per_split, K)
        xp = x + rows[:, None].to(tl.int64) * stride_x + (k_lo + inner)[None, :]
        wp = w + cols[None, :].to(tl.int64) * stride_w + (k_lo + inner)[:, None]  # (BK, BN): Q^T, K-major
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(k_lo, k_hi, BK):
            if EVEN_K:
                a = tl.load(xp, mask=row_ok[:, None], other=0.0)
                b = tl.load(wp, mask=col_ok[None, :], other=0.0)
            else:
                k_ok = (k + inner) < k_hi
                a = tl.load(xp, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(wp, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc)
            xp += BK
            wp += BK
        both = row_ok[:, None] & col_ok[None, :]
        where = rows[:, None].to(tl.int64) * stride_out + cols[None, :]
        if SCALED:
            channel = tl.load(col_scales + cols, mask=col_ok, other=0.0)
        if not SLICED:
            if SCALED:
                acc = acc * tl.load(row_scales + rows, mask=row_ok, other=0.0)[:, None] * channel[None, :]
            tl.store(out + where, acc.to(out.dtype.element_ty), mask=both)
        else:
            dense = rows[:, None].to(tl.int64) * N + cols[None, :]
            tl.store(partials + pid_k.to(tl.int64) * M * N + dense, acc, mask=both)
            tl.debug_barrier()  # every thread's partial is written before the count (release covers them)
            tile = pid_m * tl.num_programs(0) + pid_n
            if tl.atomic_add(counters + tile, 1, sem="acq_rel", scope="gpu") == split - 1:
                for r in range(0, BM, SUM_ROWS):  # a few rows at a time: the partials' registers, not acc's twice
                    part = pid_m * BM + r + tl.arange(0, SUM_ROWS)
                    ok = (part < M)[:, None] & col_ok[None, :]
                    total = tl.zeros((SUM_ROWS, BN), dtype=tl.float32)
                    for s in range(split):  # slice order, whichever program came last
                        total += tl.load(partials + s * M * N + part[:, None].to(tl.int64) * N + cols[None, :],
                                         mask=ok, other=0.0, cache_modifier=".cg")
                    if SCALED:
                        total = total * tl.load(row_scales + part, mask=part < M, other=0.0)[:, None] * channel[None, :]
                    tl.store(out + part[:, None].to(tl.int64) * stride_out + cols[None, :],
                             total.to(out.dtype.element_ty), mask=ok)
                tl.atomic_xchg(counters + tile, 0, sem="relaxed", scope="gpu")

    return split_k_gemm
