"""Which dtype a run computes in: names to ``torch.dtype``, the CPU's native-bf16 flags, and the
compute-dtype rule (bf16 autocast on CUDA and on CPUs with native bf16, fp32 elsewhere).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


def resolve_dtype(dtype: Any) -> Any:
    """``torch.dtype`` from a dtype or its name.

    Raises:
        ValueError: a name that is not a floating torch dtype (message names ``dtype``).
    """
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype or its name, got {dtype!r}")
    return resolved


# CPU flags that mean bf16 matrix products run natively (not emulated through fp32).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU feature flags of this machine: the ``flags`` lines of ``/proc/cpuinfo`` (or of the
    given text). Without ``/proc/cpuinfo`` (not Linux), torch's own checks stand in for the bf16 flags
    (``torch.cpu._is_avx512_bf16_supported`` / ``_is_amx_tile_supported``, private but present
    since torch 2.1); an empty set when neither is available."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return _torch_bf16_flags()
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


def _torch_bf16_flags() -> frozenset[str]:
    import torch

    found = set()
    for flag, check in (("avx512_bf16", "_is_avx512_bf16_supported"), ("amx_bf16", "_is_amx_tile_supported")):
        fn = getattr(torch.cpu, check, None)
        if fn is not None and fn():
            found.add(flag)
    return frozenset(found)


def choose_compute_dtype(
    device_type: str, flags: frozenset[str] | set[str], bf16_time_ratio: float | None = None
) -> tuple[str, str]:
    """The faster matmul dtype for a device, and why: a pure function of the device type, the CPU
    flags (see :func:`cpu_flags`) and, where measured, the bf16 / fp32 time of one matmul (see
    :func:`cpu_bf16_time_ratio`), so each case can be tested with given values.

    ``("bfloat16", ...)`` on CUDA or a CPU with a flag of :data:`NATIVE_BF16_FLAGS` (AVX-512 BF16,
    AMX) whose bf16 matmul was not measured slower (``bf16_time_ratio`` None or < 1); ``("float32",
    ...)`` elsewhere: without native support PyTorch and vLLM emulate bf16 (on this project's AVX2-only
    AMD EPYC a bf16 576x1536 matmul took 5.7x longer than the fp32 one), and the flags do not promise
    speed: on an Intel Xeon VM listing avx512_bf16 and amx_tile (AMX not usable by torch there) a bf16
    matmul took 1.73x the fp32 one's time and the main job's update 1.54x (29.86 s against 19.45 s).

    Returns:
        ``(dtype name, reason)``; the reason is a short phrase for the log line.
    """
    if device_type == "cuda":
        return "bfloat16", "CUDA device"
    native = [f for f in NATIVE_BF16_FLAGS if f in flags]
    if native and bf16_time_ratio is not None and not bf16_time_ratio < 1.0:
        return "float32", (
            f"CPU with native bf16 flags ({', '.join(native)}), but a bf16 matmul measured "
            f"{bf16_time_ratio:.2f}x the fp32 one's time here"
        )
    if native:
        return "bfloat16", f"CPU with native bf16 ({', '.join(native)})"
    return (
        "float32",
        "CPU without native bf16 (no avx512_bf16/amx_bf16 flag; emulated bf16 is slower than fp32)",
    )


def fast_dtype() -> str:
    """The faster inference dtype here: ``"bfloat16"`` on CUDA or a CPU with native bf16 matmuls
    (AVX-512 BF16 / AMX), else ``"float32"`` (:func:`choose_compute_dtype` on this machine)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return choose_compute_dtype(device, cpu_flags() if device == "cpu" else frozenset())[0]


@functools.lru_cache(maxsize=1)
def cpu_bf16_time_ratio() -> float:
    """bf16 / fp32 time of a (1024 x 576) @ (576 x 1536) matmul on this CPU with torch's threads (the
    main job's hidden x MLP shape), each the median of 5 after 2 warm-ups: < 1 means bf16 is faster.
    Measured once a process (~0.1 s), so every choice of a process agrees."""
    import statistics
    import time

    import torch

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, 576, generator=gen), torch.randn(576, 1536, generator=gen)

    def seconds(dtype: torch.dtype) -> float:
        x, y = a.to(dtype), b.to(dtype)
        times = []
        for i in range(7):
            t = time.perf_counter()
            x @ y
            if i >= 2:
                times.append(time.perf_counter() - t)
        return statistics.median(times)

    return seconds(torch.bfloat16) / seconds(torch.float32)
