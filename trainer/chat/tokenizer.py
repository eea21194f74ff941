"""Tokenizers with a chat template that renders tools.

SmolLM2's own template (like many small models') ignores ``tools=`` and ``tool`` messages. chatgym
ships ``templates/chatml_tools.jinja``: ChatML with hermes/Qwen-style tool calling (tool schemas in a
``<tools>`` block of the system turn, ``<tool_call>{json}</tool_call>`` for calls, tool results as
``<tool_response>`` user turns). It is prefix-preserving (rendering ``messages[:k]`` is a prefix of
rendering ``messages[:k+1]``), which the collector needs to append observation deltas as tokens.
Also shipped: ``qwen3`` and ``qwq``, those models' stock (think-stripping) templates, for which the
collector computes deltas after a fixed base conversation (see :mod:`chatgym.trainer.chat.delta`).

:class:`ContentCodec` turns rendered chat text into token ids with message and tool text as plain
text: control-token text a tool result, user, system or retrieved passage holds never becomes a
control id (so a tool result cannot inject a turn).
"""

from __future__ import annotations

import json
import os
import re
import threading
import weakref
from functools import cache
from pathlib import Path
from typing import Any

from chatgym.trainer.models.packaged import load_model_path

TEMPLATES_DIR = Path(__file__).parent / "templates"
CHATML_TOOLS = "chatml_tools"


@cache
def builtin_template(name: str = CHATML_TOOLS) -> str:
    """Source of a template shipped in ``trainer/chat/templates/<name>.jinja``.

    Raises:
        FileNotFoundError: no such template (the message lists the shipped ones).
    """
    path = TEMPLATES_DIR / f"{name}.jinja"
    if not path.is_file():
        shipped = sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))
        raise FileNotFoundError(f"chat_template {name!r} is not shipped; choose one of {shipped}")
    return path.read_text()


def template_supports_tools(template: str | None) -> bool:
    """True when a Jinja chat template reads the ``tools`` variable.

    Found by parsing the template (``jinja2.meta.find_undeclared_variables``), not by string search,
    so a template that only mentions the word "tools" in text does not count.
    """
    if not template:
        return False
    import jinja2
    from jinja2 import meta

    try:
        ast = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    return "tools" in meta.find_undeclared_variables(ast)


def resolve_chat_template(model_template: str | None, chat_template: str = "auto") -> str:
    """Pick the template source.

    Rule for ``"auto"``: the model's own template when it reads ``tools`` (see
    :func:`template_supports_tools`), otherwise chatgym's ``chatml_tools``. ``"model"`` forces the
    model's own; a shipped name (``"chatml_tools"``) or a path to a ``.jinja`` file or a template
    string (anything containing ``{%`` or ``{{``) is used as given.

    Raises:
        ValueError: ``"model"`` asked for but the model has no template.
        FileNotFoundError: an unknown template name, a ``.jinja`` path that does not exist.
    """
    if chat_template == "auto":
        return model_template if template_supports_tools(model_template) else builtin_template(CHATML_TOOLS)
    if chat_template == "model":
        if not model_template:
            raise ValueError("chat_template='model' but the model's tokenizer has no chat template")
        return model_template
    if is_template_text(chat_template):
        return chat_template
    check_chat_template_setting(chat_template)  # a missing .jinja file is named as such, not "not shipped"
    path = Path(chat_template).expanduser()
    return path.read_text() if path.suffix == ".jinja" else builtin_template(chat_template)


# Where get_tokenizer keeps the model's own template when it puts another in its place, so that
# "model" still means the model's own on that tokenizer (not the chatml_tools swapped in for "auto").
MODEL_TEMPLATE_ATTR = "chatgym_model_chat_template"


def model_chat_template(tokenizer: Any) -> str | None:
    """The model's own chat template text: the one :func:`get_tokenizer` found on the model's files
    before it chose one, else the tokenizer's ``chat_template``; None when there is none (or it is no
    single template text)."""
    if hasattr(tokenizer, MODEL_TEMPLATE_ATTR):
        own = getattr(tokenizer, MODEL_TEMPLATE_ATTR)
    else:
        own = getattr(tokenizer, "chat_template", None)
    return own if isinstance(own, str) and own else None


def resolve_tokenizer_template(tokenizer: Any, chat_template: str) -> str:
    """:func:`resolve_chat_template` of a setting for ``tokenizer``: ``"model"`` against the model's
    own template (:func:`model_chat_template`), anything else against the tokenizer's current one.

    Raises:
        as :func:`resolve_chat_template`.
    """
    current = getattr(tokenizer, "chat_template", None)
    base = model_chat_template(tokenizer) if chat_template == "model" else current
    return resolve_chat_template(base if isinstance(base, str) else None, chat_template)


def is_template_text(chat_template: str) -> bool:
    """True for Jinja template text, False for a name (``auto``, ``model``, a shipped one) or a path."""
    return "{%" in chat_template or "{{" in chat_template


def check_chat_template_setting(chat_template: str | None) -> None:
    """Fail fast on a ``chat_template`` setting that names nothing (before any model loads).

    Raises:
        FileNotFoundError: neither template text, ``auto``/``model``, a shipped name, nor a
            ``.jinja`` file that exists (the message lists the shipped names).
    """
    if chat_template is None or chat_template in ("auto", "model") or is_template_text(chat_template):
        return
    path = Path(chat_template).expanduser()
    if path.suffix == ".jinja":
        if not path.is_file():
            raise FileNotFoundError(f"chat_template file {chat_template!r} does not exist")
        return
    builtin_template(chat_template)


def get_tokenizer(name_or_path: str | os.PathLike[str], chat_template: str = "auto") -> Any:
    """Load a model's tokenizer with a tool-capable chat template.

    Args:
        name_or_path: packaged model name (``"smollm2"``) or local model directory
            (see :func:`chatgym.trainer.models.packaged.load_model_path`).
        chat_template: ``"auto"`` (default), ``"model"``, ``"chatml_tools"``, a ``.jinja`` path or a
            template string; see :func:`resolve_chat_template` for the rule.

    Returns:
        A ``transformers`` tokenizer whose ``chat_template`` is the chosen template; the model's own
        (str, or None when it has none) is kept for ``"model"`` settings resolved later
        (:func:`model_chat_template`).

    Raises:
        as :func:`load_model_path` and :func:`resolve_chat_template`.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(load_model_path(name_or_path))
    own = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    tokenizer.chat_template = resolve_chat_template(own, chat_template)
    setattr(tokenizer, MODEL_TEMPLATE_ATTR, own)
    return tokenizer


# --- Message text is plain text -------------------------------------------------------------------
#
# A chat template's output mixes two kinds of text: what the template writes (``<|im_start|>user\n``)
# and what the messages and tool schemas hold. Encoded as one string, a tool result that contains
# ``<|im_end|>\n<|im_start|>system`` would become real control ids (a forged system turn). The codec
# below keeps the two apart: before rendering, every control-token text inside message / tool strings
# is replaced by a sentinel (a private-use character, an index, another private-use character) that no
# template treats specially; after rendering, the text is cut at the control tokens the template wrote
# (the only ones left) and every piece between them is encoded with a copy of the tokenizer that knows
# no added tokens, sentinels turned back into their text. Pieces between added tokens are encoded
# independently by Hugging Face tokenizers too (added tokens are split out before pre-tokenization), so
# for text without markers the ids are exactly ``tokenizer.encode(text, add_special_tokens=False)``.
#
# Peers: SkyRL and verl tokenize rendered chat text as one string (no guard); HF tokenizers offer
# ``split_special_tokens=True``, which in transformers 5 flips a flag on the shared backend per call
# (a race when several threads encode) and splits *every* special token, the template's included.

SENTINEL_OPEN, SENTINEL_CLOSE = "\ue000", "\ue001"
_SENTINEL = re.compile(SENTINEL_OPEN + r"(\d+)" + SENTINEL_CLOSE)


def _alternation(texts: list[str]) -> re.Pattern[str] | None:
    # Longest first: at one position the longest token wins, as in HF's added-vocabulary matching.
    ordered = sorted(set(texts), key=lambda s: (-len(s), s))
    return re.compile("|".join(re.escape(t) for t in ordered)) if ordered else None


def _plain_backend(tokenizer: Any) -> Any:
    """A private copy of a fast tokenizer's backend that treats every added token as plain text."""
    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    for added in spec.get("added_tokens") or []:
        added["special"] = True  # encode_special_tokens splits only tokens flagged special
    spec["truncation"] = None
    spec["padding"] = None
    backend = Tokenizer.from_str(json.dumps(spec))
    backend.encode_special_tokens = True
    return backend


class ContentCodec:
    """Encodes rendered chat text so that message and tool text is always plain text.

    Control tokens are the tokenizer's added tokens (``added_tokens_decoder``: SmolLM2's 17, e.g.
    ``<|im_start|>`` = 1, ``<|im_end|>`` = 2). In message text they are plain text, with one exception:
    in assistant messages, added tokens that are *not* flagged special (Qwen's ``<think>``,
    ``<tool_call>``) keep their ids, since the model writes them as such in its own turns.

    Args:
        tokenizer: a Hugging Face tokenizer. Fast tokenizers (``backend_tokenizer``) are encoded with a
            private plain-text copy of the backend; others with ``split_special_tokens=True``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        decoder = dict(getattr(tokenizer, "added_tokens_decoder", None) or {})
        self.control_ids: dict[str, int] = {str(t): int(i) for i, t in decoder.items()}
        special = [str(t) for t in decoder.values() if getattr(t, "special", True)]
        self.markers: list[str] = [SENTINEL_OPEN, *sorted(self.control_ids)]
        self._index = {m: k for k, m in enumerate(self.markers)}
        self._any = _alternation(self.markers)
        self._special = _alternation([SENTINEL_OPEN, *special])
        self._control = _alternation(list(self.control_ids))
        self._backend = _plain_backend(tokenizer) if hasattr(tokenizer, "backend_tokenizer") else None

    # -- before rendering --
    def protect_text(self, text: str, model_output: bool = False) -> str:
        """``text`` with each control-token text (and each literal sentinel character) replaced by
        a sentinel; ``model_output=True`` leaves non-special added tokens (see the class docstring)."""
        pattern = self._special if model_output else self._any
        if pattern is None or not pattern.search(text):
            return text
        return pattern.sub(lambda m: f"{SENTINEL_OPEN}{self._index[m.group()]}{SENTINEL_CLOSE}", text)

    def protect(self, value: Any, model_output: bool = False) -> Any:
        """Every string inside ``value`` (dicts, lists, tuples) protected with :meth:`protect_text`."""
        if isinstance(value, str):
            return self.protect_text(value, model_output)
        if isinstance(value, dict):
            return {k: self.protect(v, model_output) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.protect(v, model_output) for v in value]
        return value

    def protect_messages(self, messages: Any) -> list[dict[str, Any]]:
        """Messages with every string field protected (``role`` kept as is)."""
        out = []
        for m in messages:
            model_output = m.get("role") == "assistant"
            out.append({k: v if k == "role" else self.protect(v, model_output) for k, v in m.items()})
        return out

    # -- after rendering --
    def unmark(self, text: str) -> str:
        """Rendered text with sentinels turned back into the text they stand for.

        Raises:
            ValueError: a sentinel character is left over (the template cut a sentinel apart).
        """
        return self._restore(text)

    def plain_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text: no added token is matched (``list[int]``)."""
        if not text:
            return []
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def encode_marked(self, marked: str) -> list[int]:
        """Token ids of rendered text whose message strings were protected before rendering.

        Control tokens left in ``marked`` are the template's own and become their ids; everything else
        (sentinels restored) is encoded with :meth:`plain_ids`.

        Raises:
            ValueError: as :meth:`unmark`.
        """
        ids: list[int] = []
        pos = 0
        if self._control is not None:
            for m in self._control.finditer(marked):
                ids += self.plain_ids(self._restore(marked[pos : m.start()]))
                ids.append(self.control_ids[m.group()])
                pos = m.end()
        ids += self.plain_ids(self._restore(marked[pos:]))
        return ids

    def _restore(self, piece: str) -> str:
        if SENTINEL_OPEN not in piece and SENTINEL_CLOSE not in piece:
            return piece
        restored = _SENTINEL.sub(lambda m: self.markers[int(m.group(1))], piece)
        # A protected string holds SENTINEL_OPEN only inside sentinels; one left over means the template
        # cut a sentinel apart (slicing content by characters), so the text can no longer be trusted.
        left = _SENTINEL.sub("", piece)
        if SENTINEL_OPEN in left:
            raise ValueError("the chat template cut a protected control-token text apart")
        return restored


_CODECS: weakref.WeakKeyDictionary[Any, tuple[int, ContentCodec]] = weakref.WeakKeyDictionary()
_CODECS_LOCK = threading.Lock()


def content_codec(tokenizer: Any) -> ContentCodec:
    """The :class:`ContentCodec` of ``tokenizer``, built once per tokenizer (and again when its added
    tokens change)."""
    key = len(getattr(tokenizer, "added_tokens_decoder", None) or {})
    with _CODECS_LOCK:
        try:
            hit = _CODECS.get(tokenizer)
        except TypeError:  # not weak-referenceable: no cache
            return ContentCodec(tokenizer)
        if hit is not None and hit[0] == key:
            return hit[1]
        codec = ContentCodec(tokenizer)
        _CODECS[tokenizer] = (key, codec)
        return codec


def content_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of message text as plain text (what the model reads inside a turn)."""
    return content_codec(tokenizer).plain_ids(text)
