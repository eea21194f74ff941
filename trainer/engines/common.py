"""Rules every engine applies the same way: stop ids, finish reason, completion text, prompt checks.

Keeping them in one place is what makes engines interchangeable: the same ids give the same
``finish_reason`` and ``text`` whichever backend produced them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .base import FinishReason, SamplingParams


def eos_token_ids(generation_config: Any = None, config: Any = None, tokenizer: Any = None) -> frozenset[int]:
    """Every EOS id a model declares.

    Takes ``eos_token_id`` (an int or a list of ints) from the generation config, else from the model
    config, else the tokenizer's ``eos_token_id``. A chat model may list several (e.g. end-of-turn and
    end-of-text); a completion ending in any of them is ``stop``.
    """
    for source in (generation_config, config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        ids = [value] if isinstance(value, int) else list(value)
        if ids:
            return frozenset(int(i) for i in ids)
    return frozenset()


def stop_ids(eos_ids: Iterable[int], params: SamplingParams) -> frozenset[int]:
    """The ids that end this request: the model's EOS ids plus ``params.stop_token_ids``."""
    return frozenset(eos_ids) | frozenset(params.stop_token_ids)


def judge_finish(token_ids: Sequence[int], stop: frozenset[int]) -> FinishReason:
    """``stop`` when the completion's LAST id is a stop id, else ``length``.

    Judged on the completion's ids only: an EOS id inside the prompt never makes a truncated
    completion look finished.
    """
    return "stop" if token_ids and token_ids[-1] in stop else "length"


def completion_text(tokenizer: Any, token_ids: Sequence[int], finish_reason: str) -> str:
    """Decode a completion for display and tool-call parsing.

    The final stop/EOS id of a ``stop`` completion is left out of the text (it ends the turn; it is
    not content); every other id, special or not, is decoded (``skip_special_tokens=False``) so the
    text shows exactly what was generated. Empty when there is no tokenizer.
    """
    if tokenizer is None:
        return ""
    ids = list(token_ids[:-1] if finish_reason == "stop" else token_ids)
    return tokenizer.decode(ids, skip_special_tokens=False)


def check_prompt(
    prompt_ids: Any, vocab_size: int | None = None, max_model_len: int | None = None
) -> list[int]:
    """Validate a prompt and return it as ``list[int]``.

    Raises:
        TypeError: ``prompt_ids`` is not a sequence of ints (a string was passed, say).
        ValueError: empty, an id outside ``[0, vocab_size)``, or not shorter than ``max_model_len``
            (no room for even one new token).
    """
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence):
        raise TypeError(f"prompt_ids must be a list of token ids, got {type(prompt_ids).__name__}")
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise ValueError("prompt_ids is empty")
    if vocab_size is not None:
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise ValueError(f"prompt_ids has ids outside [0, {vocab_size}): {bad[:5]}")
    if max_model_len is not None and len(ids) >= max_model_len:
        raise ValueError(
            f"prompt_ids has {len(ids)} tokens; max_model_len is {max_model_len} (no room to generate)"
        )
    return ids


def iter_weights(weights: Any) -> Iterable[tuple[str, Any]]:
    """``(name, tensor)`` pairs from a state dict (``Mapping``) or an iterable of pairs.

    Raises:
        TypeError: anything else (the message names ``weights``).
    """
    from collections.abc import Mapping

    if isinstance(weights, Mapping):
        return weights.items()
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Iterable):
        raise TypeError(
            f"weights must be a state dict or an iterable of (name, tensor), got {type(weights).__name__}"
        )
    return weights


def save_weights(weights: Any, directory: Any, config_from: Any = None) -> Any:
    """Write weights as ``<directory>/model.safetensors`` for a server to load from disk.

    Args:
        weights: a state dict or an iterable of ``(name, tensor)`` (Hugging Face checkpoint names).
        directory: where to write (created; an existing ``model.safetensors`` is replaced atomically).
        config_from: a model directory whose ``config.json`` / ``generation_config.json`` are copied
            alongside, for servers that load a whole model directory (SGLang).

    Returns:
        The directory as a ``Path``. Tensors are copied to CPU (tied weights become separate copies,
        which safetensors requires).
    """
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if config_from is not None:
        for name in ("config.json", "generation_config.json"):
            if (Path(config_from) / name).is_file():
                shutil.copyfile(Path(config_from) / name, directory / name)
    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in iter_weights(weights)}
    fd, tmp = tempfile.mkstemp(suffix=".safetensors.tmp", dir=directory)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"format": "pt"})
        os.replace(tmp, directory / "model.safetensors")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return directory


def local_model_info(model: Any, tokenizer: Any = None) -> tuple[Any, Any, frozenset[int]]:
    """``(path, tokenizer, eos_ids)`` of a model a server serves, when it is also on this machine.

    Server engines use the local copy for ``Completion.text`` and to judge ``finish_reason`` on the
    ids with the model's own EOS list. A model that is not local (a remote server's name) gives
    ``(None, tokenizer, frozenset())`` and the server's finish reason is used instead.
    """
    from ..models import load_model_path

    try:
        path = load_model_path(model)
    except (FileNotFoundError, ModuleNotFoundError):
        return None, tokenizer, frozenset()
    from transformers import AutoConfig, GenerationConfig

    if tokenizer is None:
        from ..rollout.tokenizer import get_tokenizer

        tokenizer = get_tokenizer(path)
    try:
        gen_config = GenerationConfig.from_pretrained(path)
    except OSError:
        gen_config = None
    return path, tokenizer, eos_token_ids(gen_config, AutoConfig.from_pretrained(path), tokenizer)


def server_finish(
    token_ids: Sequence[int], stop: frozenset[int], eos_known: bool, server_reason: Any
) -> FinishReason:
    """Finish reason of a server completion: judged on the ids when the EOS ids are known, else the
    server's own ``stop``/``length`` (anything else, e.g. ``abort``, becomes ``abort``)."""
    if eos_known:
        return judge_finish(token_ids, stop)
    reason = server_reason.get("type") if isinstance(server_reason, dict) else server_reason
    return reason if reason in ("stop", "length") else "abort"
