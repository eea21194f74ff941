"""CUDA switches the engine and the learner share (a no-op off CUDA).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class _CudnnOffHolders:
    """Who holds "SDPA's cuDNN backend off" now (see :func:`without_cudnn_attention`)."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.count = 0
        self.saved = True  # the flag as the first holder found it


_CUDNN_OFF = _CudnnOffHolders()


@contextlib.contextmanager
def without_cudnn_attention(device: Any = "cuda") -> Iterator[None]:
    """SDPA's cuDNN backend off inside the block when ``device`` is a CUDA device (a no-op for any
    other): a process-wide torch flag, turned off by the first block to open and restored by the last
    to close (blocks may overlap across threads).

    cuDNN attention builds an execution plan for every new input shape, and both sides of a run keep
    making new shapes: the engine's growing KV cache at every decode step (SmolLM2 on an H200, 64
    staggered requests: 48.8 ms a step with cuDNN allowed, 35.3 without; the rollout of a Math-v0 8 x 8
    GRPO step 7.7 s against 4.5 s), and the learner's padded
    batch, whose length is the longest row's (a GRPO step whose length had not been seen before spent
    0.7-1.0 s in the forward and 0.8-1.3 s in the backward, against 0.13 and 0.32 s;
    ``benchmarks/results/vs_trl_h200_fused_step/``). The other SDPA backends need no plan and were as fast at
    shapes already seen. The engine's worker thread and the learner each hold it for their own work,
    and those blocks overlap: the engine's last step closes its block after it has answered the
    requests, so after the learner opened its own. With a save/restore per block the engine's
    restore turned cuDNN back on inside the learner's update (seen on the H200); counting the holders
    keeps it off until both are done.
    """
    import torch

    if torch.device(device).type != "cuda":
        yield
        return
    state = _CUDNN_OFF
    with state.lock:
        if state.count == 0:
            state.saved = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)
        state.count += 1
    try:
        yield
    finally:
        with state.lock:
            state.count -= 1
            if state.count == 0:
                torch.backends.cuda.enable_cudnn_sdp(state.saved)


# FP8 tensor cores (e4m3/e5m2 matmuls, ``torch._scaled_mm``) start with compute capability 8.9 (Ada);
# Hopper (H100/H200) is 9.0.
FP8_MIN_CAPABILITY = (8, 9)


def is_fp8(quantization: Any) -> bool:
    """Whether an engine's ``quantization`` option asks for FP8 weights (the hf engine's ``fp8``; vLLM's
    methods naming fp8 anywhere: ``fp8``, ``fp8_per_tensor``, ``fp8_per_channel``, ``fp8_per_block``,
    ``mxfp8``, ``fbgemm_fp8``, ``modelopt_mxfp8``, ...), in any case (vLLM takes ``FP8``)."""
    return isinstance(quantization, str) and "fp8" in quantization.lower()


def fp8_unsupported(device: Any = None) -> str | None:
    """Why FP8 weights cannot run on ``device`` (None: the default CUDA device), or None when they can.

    FP8 needs a CUDA device of compute capability >= 8.9 and a torch with ``float8_e4m3fn`` and
    ``_scaled_mm``. ``torch._scaled_mm`` also runs on the CPU, but far slower than bf16 there, so a CPU
    is refused too (the tests call the FP8 functions on the CPU directly).
    """
    import torch

    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8_e4m3fn / _scaled_mm"
    dev = None
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            return f"engine.options.device {device!r} is not a torch device ({exc})"
        if dev.type != "cuda":
            return f"the device is {dev.type!r}; FP8 needs a CUDA GPU of compute capability >= 8.9"
    if not torch.cuda.is_available():
        return "no CUDA GPU here; FP8 needs one of compute capability >= 8.9 (Ada, Hopper)"
    index = dev.index if dev is not None else None
    capability = torch.cuda.get_device_capability(index)
    if tuple(capability) < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(index)
        return f"{name} has compute capability {capability[0]}.{capability[1]}; FP8 needs >= 8.9 (Ada, Hopper)"
    return None


def fp8_config_refusal(options: Any, backend: str, worker_num_gpus: float) -> str | None:
    """Why a run's FP8 engine weights (``engine.options.quantization``) are refused at config load, or
    None: checked here where the engine runs in this process (``backend`` ``local``: this machine's
    GPU, ``options["device"]``) or on Ray workers given no GPU (``worker_num_gpus`` 0); a Ray worker
    with a GPU checks its own when its engine is built."""
    if not is_fp8(options.get("quantization")):
        return None
    return fp8_hardware_refusal(options.get("device"), backend, worker_num_gpus)


def vllm_cpu_fp8_cache_refusal(cpuinfo: str | None = None) -> str | None:
    """Why vLLM's CPU backend cannot keep an FP8 KV cache on this machine (it asks for x86 with AVX-512 or
    AMX, and fails after the model loads, in an 87-line traceback: a fresh-user walk's finding), or None
    when it can or a CUDA GPU runs vLLM here. ``cpuinfo``: ``/proc/cpuinfo``'s text (tests)."""
    import torch

    from chatgym.trainer.models.dtype import cpu_flags

    if torch.cuda.is_available():
        return None
    flags = cpu_flags(cpuinfo)
    if "avx512f" in flags or "amx_tile" in flags:
        return None
    return "vLLM's CPU backend keeps an FP8 KV cache only on x86 with AVX-512 or AMX, and this CPU has neither"


def kv_cache_refusal(engine: str, options: dict, backend: str, worker_num_gpus: float) -> str | None:
    """The config-load refusal of ``engine.options.kv_cache_dtype`` (the whole message), or None: the ``hf``
    engine's e4m3 cache needs FP8 hardware (:func:`fp8_hardware_refusal`), vLLM's CPU backend an FP8 cache
    AVX-512 or AMX (:func:`vllm_cpu_fp8_cache_refusal`; with ``trainer.backend: local``, the engine here)."""
    kv = options.get("kv_cache_dtype")
    if engine == "hf" and kv == "fp8":
        why = fp8_hardware_refusal(options.get("device"), backend, worker_num_gpus)
    elif engine == "vllm" and backend == "local" and isinstance(kv, str) and kv.startswith("fp8"):
        why = vllm_cpu_fp8_cache_refusal()
    else:
        return None
    return None if why is None else f"engine.options.kv_cache_dtype: {kv!r} is refused: {why}"


def fp8_hardware_refusal(device: Any, backend: str, worker_num_gpus: float) -> str | None:
    """Why an engine on ``device`` cannot run anything in FP8 (weights, the hf engine's e4m3 KV cache),
    as :func:`fp8_config_refusal` judges it at config load; None when it can or cannot be known here."""
    if backend != "local":
        if worker_num_gpus <= 0:
            return (
                "trainer.ray.worker_num_gpus is 0, so the rollout workers run on CPU; FP8 needs a CUDA GPU "
                "of compute capability >= 8.9"
            )
        return None
    return fp8_unsupported(device)
