"""Inference engines behind one contract (see ``base``), and :func:`make_engine` to pick one by name.

| name          | class               | module             | use                                             |
|---------------|---------------------|--------------------|-------------------------------------------------|
| ``vllm``      | VLLMEngine          | ``vllm_inproc``    | default: vLLM in this process (needs ``vllm``)  |
| ``vllm-server`` | VLLMServerEngine  | ``vllm_server``    | a running vLLM OpenAI server, token ids in/out  |
| ``sglang``    | SGLangServerEngine  | ``sglang_server``  | a running SGLang server (``/generate``)         |
| ``hf``        | TransformersEngine  | ``hf``             | transformers decode loop, continuous batching   |
| ``openai``    | OpenAIChatEngine    | ``openai_chat``    | API chat models, evaluation only (no token ids) |

Backends are imported only when asked for, so ``import chatgym.trainer.engines`` needs neither vLLM
nor torch.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chatgym.trainer.config.loader import ConfigError
from chatgym.trainer.engines.base import Completion, Engine, SamplingParams

ENGINES: dict[str, tuple[str, str]] = {
    "vllm": ("vllm_inproc", "VLLMEngine"),
    "vllm-server": ("vllm_server", "VLLMServerEngine"),
    "sglang": ("sglang_server", "SGLangServerEngine"),
    "hf": ("hf", "TransformersEngine"),
    "openai": ("openai_chat", "OpenAIChatEngine"),
}
# The engines that return token ids and logprobs (training, the gateway, agent evaluation); ``openai``
# answers text only.
TOKEN_ENGINES = ("vllm", "vllm-server", "sglang", "hf")
# The token engines that place no images, whatever the model: a server's completions API takes token
# prompts only (``common.refuse_images``).
IMAGELESS_ENGINES = ("vllm-server", "sglang")


def engine_class(name: str) -> type:
    """The engine class registered under ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    try:
        module, cls = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)}") from None
    return getattr(importlib.import_module(f".{module}", __name__), cls)


def make_engine(name: str = "vllm", model: Any = "smollm2", **kwargs: Any) -> Any:
    """Build an engine by name: ``make_engine("hf", "smollm2", dtype="bfloat16")``.

    Args:
        name: one of :data:`ENGINES` (``vllm``, ``vllm-server``, ``sglang``, ``hf``, ``openai``).
        model: what the engine serves: a packaged model name or local directory for ``vllm``/``hf``;
            the served model's name for the server/API engines.
        **kwargs: passed to the engine class (see each class for its arguments).

    Raises:
        ValueError: unknown ``name``; ModuleNotFoundError: the backend's extra is not installed.
    """
    return engine_class(name)(model, **kwargs)


def engine_dtype(cfg: Any) -> str:
    """``engine.dtype`` with ``auto`` resolved on this machine (:func:`chatgym.trainer.models.dtype.fast_dtype`:
    bf16 on GPUs and native-bf16 CPUs, else fp32). Resolved when the engine is built, never written
    back into the config, so ``config.yaml`` is the same on every machine."""
    from chatgym.trainer.models.dtype import fast_dtype

    return fast_dtype() if cfg.dtype == "auto" else cfg.dtype


def check_options(cfg: Any) -> None:
    """Check ``engine.options`` (``cfg``: an ``EngineConfig``) against what ``engine.backend``'s class
    takes: :func:`check_engine_options` naming ``engine.options``. ``chatgym train`` calls it before any
    model loads; :func:`build_engine` calls it too.

    Raises:
        ModuleNotFoundError: the backend's package is missing.
        ConfigError: (a ValueError) an ``engine.options`` key the backend does not take.
    """
    check_engine_options(cfg.backend, cfg.options, "engine.options", cfg.options.get("dtype", cfg.dtype))


def check_engine_options(backend: str, options: Mapping[str, Any], setting: str, dtype: str | None = None) -> None:
    """Check an engine's keyword arguments ``options`` against what ``backend``'s class takes — its
    keyword arguments, and for an engine that passes ``**kwargs`` on, its ``option_names()`` (vLLM: the
    fields of ``EngineArgs``; imports vLLM); with ``auto``, against every engine
    :func:`chatgym.trainer.engines.auto.candidates` may pick here. ``chatgym rollout`` and ``chatgym
    eval`` check their ``--engine-arg`` keywords with it (``setting``), before any model loads. ``dtype``:
    the engine's dtype (``"float16"``, ...; None: not known), against which an FP8 run's
    ``CHATGYM_FP8_GEMM`` is checked (:func:`.hf_fp8.check_gemm_dtype`).

    Raises:
        ModuleNotFoundError: the backend's package is missing.
        ConfigError: (a ValueError) a key the backend does not take (the message starts with
            ``setting`` and names the key, with the closest known name or the allowed ones); for
            ``hf``, values :func:`.hf_options.check_options` refuses whatever the decode path.
    """
    if backend == "auto":  # every engine auto may pick here must take the options
        from chatgym.trainer.engines.auto import candidates

        picks = candidates()
        for name in picks:
            try:
                check_engine_options(name, options, setting, dtype)
            except ConfigError as exc:
                may = f"picks {picks[0]!r}" if len(picks) == 1 else f"may pick any of {picks}, and every option must suit them all"
                raise ConfigError(f"{exc} — engine.backend auto {may} on this machine; or set engine.backend") from None
        return
    cls = engine_class(backend)
    accepted = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    # An engine that passes **kwargs on (vLLM's EngineArgs) names what it passes on: a typo then fails
    # here, named, not as the library's TypeError once the engine starts.
    passed_on = getattr(cls, "option_names", None)
    known = set(accepted) | (set(passed_on()) if takes_any and passed_on else set())
    unknown = sorted(set(options) - known) if (not takes_any or passed_on) else []
    if unknown:
        allowed = sorted(n for n, p in accepted.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)
        # The hf engine's own options under another backend: difflib's closest vLLM argument misleads
        # ('decode' -> 'spec_model'); the backend that takes them is the way out.
        hf_takes = set(inspect.signature(engine_class("hf")).parameters) if backend != "hf" else set()
        hf_only = [u for u in unknown if u in hf_takes]
        # And the vLLM engine's own arguments under hf: 'kv_cache_gib' is not a typo of 'kv_cache_dtype'.
        vllm_takes = set(inspect.signature(engine_class("vllm")).parameters) if backend == "hf" else set()
        close = {u: difflib.get_close_matches(u, sorted(known), n=1) for u in unknown
                 if u not in hf_only and u not in vllm_takes}
        hints = [f"did you mean {c[0]!r} for {u!r}?" for u, c in close.items() if c]
        if hf_only:
            use_hf = "--engine hf" if setting == "--engine-arg" else "engine.backend=hf"
            hints.append(f"{'they are' if len(hf_only) > 1 else 'it is'} the 'hf' engine's: set {use_hf}")
        takes = f"it takes {allowed}" + (" and the fields of vllm.EngineArgs (gpu_memory_utilization, ...)"
                                         if takes_any else "")
        # A config written for one backend run with another (engine.backend=hf over a vLLM config).
        # (Not for the hf engine's options: emptying them would drop what the user asked for.)
        swap = (" (another backend's options? replace them: 'engine.options={}')"
                if setting == "engine.options" and not hf_only else "")
        raise ConfigError(
            f"{setting}: {', '.join(map(repr, unknown))} not taken by the {backend!r} engine "
            f"({cls.__name__}); {' '.join(hints) or takes}{swap}"
        )
    if backend == "vllm":
        _check_vllm_values(options, setting)
    if backend == "hf":  # values this machine's decode path cannot take, refused before any model loads
        _check_hf_values(options, setting, dtype)


def _check_vllm_values(options: Mapping[str, Any], setting: str) -> None:
    """vLLM's values refused at config load (its pydantic refusal came after the learner loaded)."""
    if options.get("quantization") is not None:  # e.g. 'int4', refused by vLLM once the model had loaded
        try:
            from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS as methods
        except ImportError:  # another vLLM layout: vLLM's own check, later
            methods = ()
        if methods and str(options["quantization"]).lower() not in methods:  # case: vLLM's own check rules
            raise ConfigError(f"{setting}: quantization must be one of vLLM's methods {list(methods)}, "
                              f"got {options['quantization']!r}")
    if "kv_cache_dtype" in options:  # vLLM is imported already: its option names were read
        import typing

        try:
            from vllm.config.cache import CacheDType

            values = typing.get_args(CacheDType)
        except ImportError:  # another vLLM layout: vLLM's own check, later
            values = ()
        if values and options["kv_cache_dtype"] not in values:
            raise ConfigError(f"{setting}: kv_cache_dtype must be one of vLLM's {list(values)}, "
                              f"got {options['kv_cache_dtype']!r}")
    if "gpu_memory_utilization" not in options:
        return
    share = options["gpu_memory_utilization"]
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise ConfigError(f"{setting}: gpu_memory_utilization is the share of the GPU's memory (on a CPU, of "
                          f"the NUMA node's) vLLM may take, in (0, 1], got {share!r}")


def _check_hf_values(options: Mapping[str, Any], setting: str, dtype: str | None = None) -> None:
    """The hf engine's values this machine's decode path cannot take, before any model loads."""
    from chatgym.trainer.engines import hf_options
    from chatgym.trainer.engines.auto import has_cuda
    from chatgym.trainer.engines.hf_fp8 import QUANTIZATIONS
    from chatgym.trainer.engines.hf_rows import check_batching
    from chatgym.trainer.models.cuda import is_fp8

    quantization = options.get("quantization")  # the engine's own refusal came after the learner loaded
    if quantization is not None and str(quantization).lower() not in QUANTIZATIONS:
        raise ConfigError(f"{setting}: quantization must be None or 'fp8' on the hf engine, got {quantization!r}")
    decode, cuda = str(options.get("decode", "auto")), has_cuda()
    # The engine's auto is static only on CUDA (hf.TransformersEngine._choose_decode).
    auto_dynamic = decode == "auto" and not cuda
    values = dict(fp8=is_fp8(options.get("quantization")), fused_step=options.get("fused_step", True),
                  async_scheduling=options.get("async_scheduling", False),
                  sampler=options.get("sampler", "generators"), cuda=cuda,
                  multi_step=options.get("multi_step", 1), precapture=options.get("precapture", False),
                  kv_cache_dtype=options.get("kv_cache_dtype", "auto"))
    try:  # the environment's overrides first: their message names the variable, not an option
        hf_options.check_overrides(values["fused_step"], cuda, dtype if values["fp8"] else None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        check_batching(**{k: options[k] for k in ("max_batch_size", "batch_window_s", "batch_quiet_s") if k in options})
        hf_options.check_device(options.get("device"), cuda)
    except ValueError as exc:
        raise ConfigError(f"{setting}: {exc}") from None
    set_static = f"{setting}.decode=static" if setting.endswith("options") else f"{setting} decode=static"
    paths = [(decode, "")] + ([("dynamic", f": decode 'auto' is dynamic without CUDA; set {set_static}")]
                              if auto_dynamic else [])
    for path, hint in paths:
        try:
            hf_options.check_options(path, **values)
        except ValueError as exc:
            raise ConfigError(f"{setting}: {exc}{hint}") from None


def build_engine(cfg: Any, model_path: Path, tokenizer: Any, seed: int, max_model_len: int) -> Any:
    """Build the engine of a run's ``engine`` section (``EngineConfig``): ``engine.backend``'s class
    (``auto``: the one :func:`chatgym.trainer.engines.auto.choose_backend` picks, logged to stderr).

    ``dtype`` (``auto`` resolved by :func:`engine_dtype`), ``tokenizer``, ``seed`` and
    ``max_model_len`` (tokens) are passed when the engine's constructor takes them, then
    ``engine.options`` (which win).

    Raises:
        ModuleNotFoundError: the backend's package is missing (e.g. vLLM: ``pip install 'chatgym[vllm]'``).
        ConfigError: (a ValueError) an ``engine.options`` key the backend does not take (named, with the
            closest known name or the allowed ones), or a ValueError of the engine's constructor (a value
            it refuses), prefixed ``engine:``.
    """
    check_options(cfg)
    if cfg.backend == "auto":
        import sys
        from dataclasses import replace

        from chatgym.trainer.engines.auto import auto_options, choose_backend
        from chatgym.trainer.models.cuda import is_fp8

        name, why = choose_backend(model_path, fp8=is_fp8(cfg.options.get("quantization")))
        print(f"chatgym: engine.backend auto -> {name} ({why})", file=sys.stderr)
        cfg = replace(cfg, backend=name, options={**auto_options(name), **cfg.options})
    cls = engine_class(cfg.backend)
    accepted = inspect.signature(cls).parameters
    candidates = {"dtype": engine_dtype(cfg), "tokenizer": tokenizer, "seed": seed, "max_model_len": max_model_len}
    kwargs = {k: v for k, v in candidates.items() if k in accepted}
    kwargs.update(cfg.options)
    try:
        return cls(str(model_path), **kwargs)
    except ConfigError:
        raise
    except ValueError as exc:  # a setting the engine refuses (e.g. async_scheduling without decode static)
        raise ConfigError(f"engine: {exc}") from exc


__all__ = [
    "ENGINES",
    "Completion",
    "Engine",
    "SamplingParams",
    "build_engine",
    "check_engine_options",
    "check_options",
    "engine_class",
    "engine_dtype",
    "make_engine",
]
