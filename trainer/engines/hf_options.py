"""The transformers engine's options that depend on its decode path, checked together: by the engine as it
starts and, before any model loads, by :func:`chatgym.trainer.engines.check_options` at config load (with
``decode: auto`` then, only what no path allows is refused)."""

from __future__ import annotations

from typing import Any

SAMPLERS = ("generators", "philox")
KV_CACHE_DTYPES = ("auto", "fp8")  # vLLM's names: the model's dtype, or float8_e4m3fn (hf_attention)
DECODES = ("auto", "static", "dynamic")


def check_options(decode: str, *, fp8: bool = False, async_scheduling: bool = False,
                  fused_step: Any = True, sampler: str = "generators", cuda: bool = True,
                  multi_step: Any = 1, precapture: Any = False, kv_cache_dtype: Any = "auto",
                  dtype: Any = None) -> bool | str:
    """The transformers engine's options that need this path, checked together; returns
    ``fused_step`` as the engine keeps it (``True``, ``False`` or ``"compiled"``).

    Args:
        decode: the engine's decode path (``"static"`` / ``"dynamic"``), or ``"auto"`` when checked at
            config load, before the path is known (then only what no path allows is refused).
        dtype: the model's dtype (``torch.dtype`` or its name; None: not known), read with ``fp8`` only.

    Raises:
        ValueError: ``decode`` not in :data:`DECODES`, ``async_scheduling`` or ``precapture`` not a bool,
            ``fused_step`` not a bool nor ``"compiled"`` (an int too), ``async_scheduling`` or
            ``fused_step: compiled`` or ``multi_step`` > 1 or ``precapture`` on the dynamic path,
            ``multi_step`` not an int >= 1, FP8 weights off the fused static step, ``kv_cache_dtype`` not
            in :data:`KV_CACHE_DTYPES` or ``"fp8"`` off the compiled fused step on CUDA (its reader is
            :mod:`.hf_attention`'s kernel), a
            ``sampler`` not in :data:`SAMPLERS`, ``"philox"`` (a Triton kernel) without ``cuda``, with
            a fused step a bad ``CHATGYM_FP8_GEMM`` (an unscaled one with ``fp8`` and a float16 ``dtype``),
            ``CHATGYM_DECODE_ATTENTION`` or ``CHATGYM_DECODE_ATTENTION_CONFIG`` (:func:`check_overrides`).
    """
    if decode not in DECODES:  # the engine's own check comes after the model loads
        raise ValueError(f"decode must be 'auto', 'static' or 'dynamic', got {decode!r}")
    for name, value in (("async_scheduling", async_scheduling), ("precapture", precapture)):
        if not isinstance(value, bool):  # bool("no") is True: a typo must not turn an option on
            raise ValueError(f"{name} must be true or false, got {value!r}")
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    if sampler == "philox" and not cuda:
        raise ValueError("sampler 'philox' is a Triton kernel: it needs a CUDA GPU (this engine has none)")
    if not (isinstance(fused_step, bool) or fused_step == "compiled"):
        raise ValueError(f"fused_step must be true, false or 'compiled', got {fused_step!r}")
    if fp8 and (decode == "dynamic" or not fused_step):
        raise ValueError("quantization 'fp8' runs in the fused static decode step: decode 'static', fused_step")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    if kv_cache_dtype == "fp8" and not cuda:
        raise ValueError("kv_cache_dtype 'fp8' is read by a Triton kernel on a CUDA GPU, and this engine has none: "
                         "leave it out (or 'auto')")
    if kv_cache_dtype == "fp8" and (decode == "dynamic" or fused_step != "compiled"):
        raise ValueError("kv_cache_dtype 'fp8' is read by the fused step's Triton attention kernel: it needs "
                         "decode 'static' and fused_step 'compiled'")
    if isinstance(multi_step, bool) or not isinstance(multi_step, int) or multi_step < 1:
        raise ValueError(f"multi_step must be an int >= 1, got {multi_step!r}")
    check_overrides(fused_step, cuda, dtype if fp8 else None)
    for name, on in (("async_scheduling", async_scheduling), ("fused_step 'compiled'", fused_step == "compiled"),
                     (f"multi_step {multi_step}", multi_step > 1), ("precapture", precapture)):
        if on and decode == "dynamic":
            raise ValueError(f"{name} needs decode 'static' (this engine decodes {decode!r})")
    return fused_step


def check_kv_cache(kv_cache_dtype: Any, device: Any) -> Any:
    """``kv_cache_dtype`` ``"fp8"`` against the engine's device, before the model loads (Triton's e4m3
    conversions need compute capability >= 8.9, as FP8 weights do); returns ``kv_cache_dtype``.

    Raises:
        ValueError: ``"fp8"`` where :func:`chatgym.trainer.models.cuda.fp8_unsupported` gives a reason.
    """
    if kv_cache_dtype == "fp8":
        from chatgym.trainer.models.cuda import fp8_unsupported

        why = fp8_unsupported(device)
        if why is not None:
            raise ValueError(f"kv_cache_dtype 'fp8' is refused: {why}")
    return kv_cache_dtype


def check_overrides(fused_step: Any, cuda: bool, fp8_dtype: Any = None) -> None:
    """The environment's overrides a fused step reads as the worker builds it (``CHATGYM_FP8_GEMM``,
    ``CHATGYM_DECODE_ATTENTION``, ``CHATGYM_DECODE_ATTENTION_CONFIG``), checked here, before any model
    loads; nothing without a fused step. ``fp8_dtype``: with FP8 weights, the model's dtype
    (``torch.dtype`` or its name), against which ``CHATGYM_FP8_GEMM`` is checked (:func:`.hf_fp8.check_gemm_dtype`).

    Raises:
        ValueError: naming the variable (:func:`.hf_fp8.default_gemm`, :func:`.hf_attention.default_attention`,
            :func:`.hf_attention.launch_config`).
    """
    if fused_step:
        from chatgym.trainer.engines import hf_attention, hf_fp8

        hf_fp8.default_gemm(fused_step == "compiled", fp8_dtype)
        hf_attention.default_attention(fused_step == "compiled", cuda)
        hf_attention.launch_config(False)


def check_device(device: Any, cuda: bool) -> None:
    """The engine's ``device`` option against the machine: a CUDA device where there is none is refused
    here, before any model loads (loading one there fails in torch with an assertion).

    Raises:
        ValueError: ``device`` names CUDA and ``cuda`` is False.
    """
    if isinstance(device, str) and device.startswith("cuda") and not cuda:
        raise ValueError(f"device {device!r}, but this machine has no CUDA GPU; leave device out "
                         "(the engine takes CUDA where there is one, else the CPU)")
