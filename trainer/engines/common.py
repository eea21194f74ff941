"""Rules every engine applies the same way: stop ids, stop strings, finish reason, completion text,
prompt checks.

Keeping them in one place is what makes engines interchangeable: the same ids give the same
``finish_reason`` and ``text`` whichever backend produced them.
"""

from __future__ import annotations

import operator
from collections.abc import ItemsView, Iterable, Mapping, Sequence
from typing import Any

from chatgym.trainer.engines.base import FinishReason, SamplingParams


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


def eos_token_ids_of(model: Any, tokenizer: Any = None) -> frozenset[int]:
    """EOS ids of a loaded model (generation config, else config, else tokenizer)."""
    return eos_token_ids(getattr(model, "generation_config", None), model.config, tokenizer)


def check_token_ids(ids: Any, vocab_size: int, name: str, empty: str = "none") -> frozenset[int]:
    """``ids`` (one int or an iterable of ints) as a frozenset, each a token of the model.

    Args:
        ids: the ids a caller passed (``eos_token_ids=[2, 5]``).
        vocab_size: the model's vocabulary: ids in ``[0, vocab_size)`` are valid.
        name: the argument's name, for the message.
        empty: what ``[]`` means for that argument, for the message.

    Raises:
        TypeError: something other than ints (a string, floats, bools).
        ValueError: an id outside ``[0, vocab_size)``: one the model can never sample, and one that
            crashes a CUDA gather if it is used as padding (the message names ``name`` and the size).
    """
    values = [ids] if isinstance(ids, int) else ids
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be token ids (ints), got {type(ids).__name__}")
    values = list(values)
    wrong = [i for i in values if isinstance(i, bool) or not isinstance(i, int)]
    if wrong:
        raise TypeError(f"{name} must be token ids (ints), got {wrong[:5]!r}")
    bad = sorted({i for i in values if not 0 <= i < vocab_size})
    if bad:
        raise ValueError(
            f"{name} has ids outside the model's vocabulary [0, {vocab_size}): {bad[:5]} "
            f"(ids the model can never sample; [] means {empty})"
        )
    return frozenset(values)


def choose_pad_id(declared: Any, eos_ids: Iterable[int], tokenizer: Any, vocab_size: int) -> int:
    """The id prompts are padded with: the first id in ``[0, vocab_size)`` of ``declared`` (the
    generation config's ``pad_token_id``), the smallest EOS id, the tokenizer's ``pad_token_id``, 0.

    A declared pad id outside the vocabulary (LLaMA-1 configs say ``-1``) is passed over, as is a
    missing one: padded positions are masked, so any real token will do, but an id outside the
    embedding fails the lookup (on CUDA a device-side assert that leaves the process's CUDA context
    unusable).
    """
    candidates = [declared, *sorted(eos_ids), getattr(tokenizer, "pad_token_id", None)]
    for i in candidates:
        if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size:
            return i
    return 0


def embedding_rows(model: Any) -> int:
    """The ids a model can take: ``config.vocab_size``, or fewer when its input embedding has fewer
    rows (an id at or past the embedding's rows fails the lookup whatever the config says)."""
    size = int(model.config.vocab_size)
    get = getattr(model, "get_input_embeddings", None)
    embedding = get() if callable(get) else None
    rows = getattr(embedding, "num_embeddings", None)
    return min(size, int(rows)) if isinstance(rows, int) else size


def stop_ids(eos_ids: Iterable[int], params: SamplingParams) -> frozenset[int]:
    """The ids that end this request: the model's EOS ids plus ``params.stop_token_ids``."""
    return frozenset(eos_ids) | frozenset(params.stop_token_ids)


def judge_finish(token_ids: Sequence[int], stop: frozenset[int]) -> FinishReason:
    """``stop`` when the completion's LAST id is a stop id, else ``length``.

    Judged on the completion's ids only: an EOS id inside the prompt never makes a truncated
    completion look finished.
    """
    return "stop" if token_ids and token_ids[-1] in stop else "length"


def judge_stop(
    token_ids: Sequence[int], stop: frozenset[int], stop_string: str | None = None
) -> tuple[FinishReason, int | str | None]:
    """``(finish_reason, stop_reason)`` of a completion.

    ``("stop", stop_string)`` when a stop string ended it (the engine's match, see
    :class:`StopStringChecker`); else ``("stop", id)`` when its LAST id is a stop id (judged on the
    completion's ids only, as in :func:`judge_finish`); else ``("length", None)``.
    """
    if stop_string is not None:
        return "stop", stop_string
    if token_ids and token_ids[-1] in stop:
        return "stop", int(token_ids[-1])
    return "length", None


def completion_text(
    tokenizer: Any, token_ids: Sequence[int], finish_reason: str, stop_reason: int | str | None = None
) -> str:
    """Decode a completion for display and tool-call parsing.

    The final stop/EOS id of a ``stop`` completion is left out of the text (it ends the turn; it is
    not content) — unless a stop string ended it (``stop_reason`` is a ``str``): then the last id is
    part of the stop string and is kept. Every other id, special or not, is decoded
    (``skip_special_tokens=False``) so the text shows exactly what was generated. Empty when there is
    no tokenizer.
    """
    if tokenizer is None:
        return ""
    drop_last = finish_reason == "stop" and not isinstance(stop_reason, str)
    ids = list(token_ids[:-1] if drop_last else token_ids)
    return tokenizer.decode(ids, skip_special_tokens=False)


# ---- stop strings -------------------------------------------------------------------------------
#
# What is kept: generation ends after the FIRST token whose addition makes the decoded completion
# contain a stop string, and that token is kept whole: the ids are exactly what was sampled (a stop
# string is never re-tokenized or trimmed from the ids), even when the completing token carries text
# past the match (the text then holds a few characters after the stop string). This is vLLM's rule
# with ``include_stop_str_in_output=True`` (its detokenizer checks the text after every token and
# ends the request on the token that completes the match); SGLang with ``no_stop_trim`` keeps the
# same ids. When one token completes several stop strings, the one whose first occurrence ends
# earliest in the text is named (ties: the order given). The text is decoded with
# ``skip_special_tokens=False``; only the completion is searched, never the prompt.


def earliest_stop(text: str, stops: Sequence[str]) -> str | None:
    """The stop string whose first occurrence in ``text`` ends earliest (ties: first in ``stops``)."""
    best: tuple[int, int] | None = None
    for order, s in enumerate(stops):
        at = text.find(s)
        if at != -1 and (best is None or (at + len(s), order) < best):
            best = (at + len(s), order)
    return None if best is None else stops[best[1]]


class StopStringChecker:
    """Tells, after each generated token, whether that token completed a stop string.

    Call it with the completion's ids so far, once per new id (ids must only grow): it decodes the
    last ``window`` ids (enough for the longest stop string even at one byte per token, plus slack
    for a partial character at the window's start) and returns the stop string matched there, else
    None. A match ending before the newest id would have been found at an earlier call, so a match in
    the window is one the newest id completed. One decode of a few dozen ids per step, whatever the
    completion's length.

    Args:
        tokenizer: the model's tokenizer (``decode``).
        stops: the stop strings (non-empty).

    Raises:
        ValueError: no tokenizer, or no stop strings.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        if tokenizer is None:
            raise ValueError("stop strings need the model's tokenizer to decode the completion")
        if not stops:
            raise ValueError("StopStringChecker needs at least one stop string")
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        # A character is at most 4 UTF-8 bytes and a byte-level token at least one byte.
        self.window = 4 * max(len(s) for s in self.stops) + 8

    def __call__(self, token_ids: Sequence[int]) -> str | None:
        text = self.tokenizer.decode(list(token_ids[-self.window :]), skip_special_tokens=False)
        return earliest_stop(text, self.stops)


def first_stop_cut(tokenizer: Any, token_ids: Sequence[int], stops: Sequence[str]) -> tuple[int, str] | None:
    """Where the stop-string rule cuts a finished completion: ``(n, stop)`` with ``n`` the smallest
    count such that ``decode(token_ids[:n])`` contains a stop string (keep ``token_ids[:n]``), or None
    when the whole completion contains none.

    Used on completions that were generated without the rule (a scripted policy, an engine or server
    that ignored ``stop``) and to check an engine's cut. One full decode, then a binary search over
    prefixes (containment only grows with the prefix).
    """
    if not stops or not token_ids:
        return None
    if tokenizer is None:
        raise ValueError("stop strings need the model's tokenizer to decode the completion")

    def hit(n: int) -> str | None:
        return earliest_stop(tokenizer.decode(list(token_ids[:n]), skip_special_tokens=False), stops)

    if hit(len(token_ids)) is None:
        return None
    lo, hi = 1, len(token_ids)  # hit(hi) holds; find the smallest such n
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    found = hit(lo)
    assert found is not None
    return lo, found


def check_prompt(
    prompt_ids: Any, vocab_size: int | None = None, max_model_len: int | None = None
) -> list[int]:
    """Validate a prompt and return it as ``list[int]``.

    Raises:
        TypeError: ``prompt_ids`` is not a sequence of ints (a string was passed, say), or holds an
            id that is not an int (a float, a string or a bool: ``int()`` would have read ``1.7`` as 1);
            NumPy's integers are ints.
        ValueError: empty, an id outside ``[0, vocab_size)``, or not shorter than ``max_model_len``
            (no room for even one new token).
    """
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence):
        raise TypeError(f"prompt_ids must be a list of token ids, got {type(prompt_ids).__name__}")
    bad = next((i for i in prompt_ids if isinstance(i, bool) or not hasattr(type(i), "__index__")), None)
    if bad is not None:
        raise TypeError(f"prompt_ids must hold ints (token ids), got {type(bad).__name__} {bad!r}")
    ids = [operator.index(i) for i in prompt_ids]
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
    if isinstance(weights, Mapping):
        return weights.items()
    # A tensor (anything with a shape) iterates over its rows, not (name, tensor) pairs.
    if isinstance(weights, (str, bytes)) or hasattr(weights, "shape") or not isinstance(weights, Iterable):
        raise TypeError(
            f"weights must be a state dict or an iterable of (name, tensor), got {type(weights).__name__}"
        )
    return weights


def _pair(item: Any) -> tuple[str, Any]:
    """``item`` as ``(name, tensor)``; a clear TypeError for anything else (a bare tensor, a 3-tuple)."""
    if not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(item[0], str):
        raise TypeError(f"update_weights: each weight must be a (name, tensor) pair, got {type(item).__name__}")
    return item[0], item[1]


def checked_weights(weights: Any) -> Iterable[tuple[str, Any]]:
    """The ``(name, tensor)`` pairs of ``weights`` (a state dict or ``(name, tensor)`` pairs), each
    checked: a pair whose name is a ``str`` and whose value is a ``torch.Tensor`` (a numpy array or a
    list is named, not left to fail inside the engine's copy). A state dict (or its ``items()``),
    list or tuple is checked whole, before anything is copied (a list comes back); any other iterable
    is checked pair by pair as it is read (a producer may make each tensor fresh).

    Raises:
        TypeError: ``weights`` is neither form, an item is not a ``(name, tensor)`` pair, or a value is
            not a tensor (the message names the weight).
    """
    import torch

    def check(item: Any) -> tuple[str, Any]:
        name, tensor = _pair(item)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"update_weights: {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        return name, tensor

    pairs = iter_weights(weights)
    if isinstance(weights, Mapping | list | tuple | ItemsView):
        return [check(pair) for pair in pairs]
    return map(check, pairs)


def copy_weights_in_place(model: Any, weights: Any) -> None:
    """Copy ``weights`` (a state dict or ``(name, tensor)`` pairs; names as in ``model.state_dict()``,
    tied weights under either name, a subset is fine) into ``model``'s parameters and buffers in place,
    cast to their dtype/device, without gradient, in the order given (a tied weight given twice keeps
    the later value).

    A state dict (or its ``items()``), list or tuple is checked whole first, so a bad name or shape copies nothing; its
    same-dtype/device tensors go as multi-tensor launches (``torch._foreach_copy_``: on CUDA a few
    kernels instead of one per weight). Any other iterable is read one pair at a time, each copied
    before the next is read (a producer may make each tensor fresh, or reuse one buffer); a bad name,
    shape or value then raises with the pairs before it copied.

    Raises:
        KeyError: a name the model does not have; ValueError: a shape that does not match;
        TypeError: an item that is not a ``(name, tensor)`` pair, or a value that is not a tensor.
    """
    import torch

    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers(remove_duplicate=False)))

    def target_of(name: str, tensor: Any) -> Any:
        target = targets.get(name)
        if target is None:
            raise KeyError(f"update_weights: the model has no weight named {name!r}")
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the model's is {tuple(target.shape)}"
            )
        return target

    pairs = checked_weights(weights)
    with torch.no_grad():
        if not isinstance(pairs, list):  # read as it comes (see the docstring)
            for name, tensor in pairs:
                target_of(name, tensor).copy_(tensor)
            return
        checked = [(target_of(name, tensor), tensor) for name, tensor in pairs]
        run: tuple[list[Any], list[Any]] = ([], [])  # consecutive same-dtype/device copies
        for target, tensor in checked:
            if tensor.dtype == target.dtype and tensor.device == target.device:
                run[0].append(target)
                run[1].append(tensor)
                continue
            if run[0]:  # the run before this cast goes first: the order given is kept
                torch._foreach_copy_(*run)
                run = ([], [])
            target.copy_(tensor)
        if run[0]:
            torch._foreach_copy_(*run)


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

    Raises:
        TypeError: as :func:`checked_weights` (a value that is not a tensor, named), before anything
            is written.
    """
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from safetensors.torch import save_file

    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in checked_weights(weights)}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if config_from is not None:
        for name in ("config.json", "generation_config.json"):
            if (Path(config_from) / name).is_file():
                shutil.copyfile(Path(config_from) / name, directory / name)
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
    from chatgym.trainer.models.packaged import load_model_path

    try:
        path = load_model_path(model)
    except (FileNotFoundError, ModuleNotFoundError):
        return None, tokenizer, frozenset()
    from transformers import AutoConfig, GenerationConfig

    if tokenizer is None:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

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


def server_stop(
    token_ids: Sequence[int], stop: frozenset[int], eos_known: bool, server_reason: Any, server_matched: Any
) -> tuple[FinishReason, int | str | None]:
    """``(finish_reason, stop_reason)`` of a server completion.

    A stop string the server names (``server_matched``: vLLM's ``stop_reason``, SGLang's
    ``finish_reason.matched``) ends it with that string. Otherwise as :func:`server_finish`, with the
    last id as the stop reason when the ids are judged locally, else the server's matched id (or None).
    """
    if isinstance(server_matched, str):
        return "stop", server_matched
    if eos_known:
        return judge_stop(token_ids, stop)
    finish = server_finish(token_ids, stop, False, server_reason)
    matched = (
        server_matched if isinstance(server_matched, int) and not isinstance(server_matched, bool) else None
    )
    return finish, matched if finish == "stop" else None


def refuse_images(engine: str, images: Any, why: str = "its model takes token ids only") -> None:
    """Raise when ``images`` is non-empty: the refusal of an engine that cannot place images.

    Raises:
        ValueError: ``images`` holds anything; the message names ``engine`` and ``why``.
    """
    n = len(tuple(images)) if images is not None else 0
    if n:
        raise ValueError(f"{engine}: {n} image(s) given, but {why}")
