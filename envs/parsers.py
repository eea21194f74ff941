"""Tool-call parsers: an assistant turn's text -> ``ParsedAction(content, calls, errors)``.

Formats, chosen by name with :func:`get_parser`:

* ``hermes`` — Hermes / Qwen2.5 / Qwen3 (NousResearch Hermes function-calling format, used by the
  Qwen chat templates): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks anywhere
  in the text, one JSON object per block.
* ``json`` — Llama 3.1 / 3.3 JSON tool calls (Meta's Llama 3 prompt format): the content, after an
  optional ``<|python_tag|>``, is a JSON object ``{"name": ..., "parameters": {...}}`` (``"arguments"``
  is accepted too), a list of them, or several separated by ``;`` or whitespace. Alternatively the
  calls sit in fenced code blocks tagged ``json``. Unfenced JSON must open the content: JSON in the
  middle of prose is prose.
* ``pythonic`` — Llama 3.2 / Llama 4 pythonic calls: the content opens with a Python list of calls,
  ``[get_weather(city="Paris"), now()]`` (optionally inside ``<|python_start|>…<|python_end|>``).
  The list is parsed with :mod:`ast` and each keyword value with ``ast.literal_eval``; nothing is
  ever evaluated, and only keyword arguments are accepted (the parser does not know the schemas).
* ``openai`` — calls already structured by an OpenAI-compatible server: :func:`parse_openai_message`
  validates a Message's ``tool_calls``; ``parse(text)`` finds no calls in plain text.

What every parser guarantees:

* ``calls`` are OpenAI-shaped (:func:`chatgym.envs.messages.make_tool_call`): ``arguments`` is the
  JSON text of an object and ids are ``call_0``, ``call_1``, ... in the order written (the ``openai``
  parser keeps a server's own ids). The parser does not know the env's tools: a call to an unknown
  name is returned as written and rejected, with the list of tools, by ``tools.run_tool_call``.
* ``arguments`` given as a string that holds JSON (``"arguments": "{\\"x\\": 1}"``) are decoded once;
  arguments that are (or decode to) an array, a string, a number, a boolean or null are not a call:
  they become an entry of ``errors``. A missing ``arguments`` key (or an empty string) means ``{}``.
* ``content`` is the text outside the call blocks, stripped; reasoning is kept in it.
* ``errors`` are short messages for the model, ``"tool call N ..."`` (N counts call attempts from 1).
  ``parse`` never raises on any ``str``.

Reasoning (``reasoning_tags``, default ``("<think>", "</think>")``; ``None`` turns it off): calls
written inside ``<think>…</think>`` are not calls. A ``</think>`` with no ``<think>`` before it closes
a block opened by the chat template (Qwen3 with thinking off, DeepSeek-R1), so everything before it is
reasoning. An unclosed ``<think>`` makes the rest of the turn reasoning, so a call after it is not run
— the same rule as vLLM's DeepSeek-R1 reasoning parser (no end tag: the whole output is reasoning).

JSON leniency (documented choice): JSON is decoded with ``strict=False``, so raw newlines and tabs
inside strings (code written by the model) are accepted; a backslash that starts no valid JSON escape
(``"\\d+"``, a Windows path) is repaired to a literal backslash and the call goes through, because
an invalid escape has no other meaning. ``NaN`` / ``Infinity`` are rejected (they are not JSON).
"""

from __future__ import annotations

import ast
import io
import json
import math
import re
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from .messages import ToolCall, make_tool_call

DEFAULT_REASONING_TAGS: tuple[str, str] = ("<think>", "</think>")
_SNIPPET_CHARS = 120


@dataclass
class ParsedAction:
    """An assistant turn, parsed.

    Attributes:
        content: text outside the tool calls (reasoning included), stripped.
        calls: valid tool calls in the order written (OpenAI shape, arguments as JSON text).
        errors: one message per malformed call, written for the model to read.
    """

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolCallParser(Protocol):
    name: str

    def parse(self, text: str) -> ParsedAction: ...


# ---- JSON helpers ------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# strict=False: models write code with raw newlines/tabs inside JSON strings.
_DECODER = json.JSONDecoder(strict=False, parse_constant=_reject_constant)
# A backslash followed by a valid JSON escape (kept), or by anything else (group 1 is None: repaired).
_ESCAPE = re.compile(r'\\(u[0-9a-fA-F]{4}|["\\/bfnrt])?')
_WS = re.compile(r"\s*")


def _skip_ws(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()


def _repair_escapes(s: str) -> tuple[str, list[int]]:
    """Double every backslash that starts no valid JSON escape.

    Returns the repaired text and, for each added backslash, its index in the repaired text (so an
    end offset in the repaired text can be mapped back to the original).
    """
    parts: list[str] = []
    added: list[int] = []
    last = 0
    for m in _ESCAPE.finditer(s):
        if m.group(1) is None:
            parts.append(s[last : m.start()])
            added.append(m.start() + len(added) + 1)
            parts.append("\\\\")
            last = m.end()
    parts.append(s[last:])
    return "".join(parts), added


def _decode_json(text: str, pos: int) -> tuple[Any, int]:
    """Decode one JSON value starting at ``text[pos]``; return it and the index just past it.

    Raises:
        ValueError (``json.JSONDecodeError`` for syntax errors): the text at ``pos`` is not JSON,
            even after repairing invalid backslash escapes.
    """
    try:
        return _DECODER.raw_decode(text, pos)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as exc:
        first = exc
    fixed, added = _repair_escapes(text[pos:])
    if not added:
        raise first
    try:
        value, end = _DECODER.raw_decode(fixed, 0)
    except RecursionError:
        raise first from None
    # After the repair, the error that remains is the one worth reporting.
    return value, pos + end - sum(a < end for a in added)


def _loads(text: str) -> Any:
    """Decode a whole string as one JSON value (surrounding whitespace allowed). Raises ValueError."""
    value, end = _decode_json(text, _skip_ws(text, 0))
    if _skip_ws(text, end) != len(text):
        raise ValueError(f"extra data after the JSON value: {_snippet(text[end:])}")
    return value


def _json_error(exc: ValueError) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def _snippet(text: str) -> str:
    text = text.strip()
    if len(text) > _SNIPPET_CHARS:
        text = text[: _SNIPPET_CHARS - 3] + "..."
    return repr(text)


def normalise_arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Turn a call's ``arguments`` into an object: ``(arguments, None)`` or ``(None, error)``.

    A dict is kept; a string holding JSON is decoded once (an empty string means ``{}``); anything
    that is not, or does not decode to, an object is an error message for the model.
    """
    if isinstance(raw, dict):
        return raw, None
    if isinstance(raw, str):
        if not raw.strip():
            return {}, None
        try:
            value = _loads(raw)
        except ValueError as exc:
            return None, f"arguments is a string that is not valid JSON ({_json_error(exc)}): {_snippet(raw)}"
        if isinstance(value, dict):
            return value, None
        return None, f"arguments must be a JSON object; got a string holding {_json_type(value)}"
    return None, f"arguments must be a JSON object, got {_json_type(raw)}"


def _is_call_object(value: Any) -> bool:
    return isinstance(value, dict) and ("name" in value or isinstance(value.get("function"), dict))


def _call_from_object(obj: Any, n: int) -> tuple[str, dict[str, Any]] | str:
    """``(name, arguments)`` from ``{"name", "arguments"|"parameters"}``, or an error message."""
    if isinstance(obj, dict) and "name" not in obj and isinstance(obj.get("function"), dict):
        obj = obj["function"]  # an OpenAI-shaped call written out as text
    if not isinstance(obj, dict):
        return f'tool call {n}: expected a JSON object {{"name": ..., "arguments": {{...}}}}, got {_json_type(obj)}'
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'tool call {n}: "name" must be a non-empty string, got {_json_type(name)}'
    name = name.strip()
    raw = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    args, err = normalise_arguments(raw)
    if err:
        return f"tool call {n} ({name}): {err}"
    return name, args


@dataclass
class _Calls:
    """Accumulates the calls and errors of one turn, numbering attempts and call ids."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    attempts: int = 0

    def next_attempt(self) -> int:
        self.attempts += 1
        return self.attempts

    def add(self, result: tuple[str, dict[str, Any]] | str, call_id: str | None = None) -> None:
        if isinstance(result, str):
            self.errors.append(result)
        else:
            name, args = result
            try:
                call = make_tool_call(name, args, call_id or f"call_{len(self.calls)}")
            except (ValueError, RecursionError) as exc:  # nesting the decoder took but the encoder refuses
                self.errors.append(f"tool call {self.attempts} ({name}): arguments cannot be encoded ({exc})")
                return
            self.calls.append(call)


# ---- reasoning ---------------------------------------------------------------------------------


def _leading_reasoning_end(text: str, tags: tuple[str, str] | None) -> int:
    """End of the reasoning opened by the chat template (a ``</think>`` before any ``<think>``), or 0."""
    if tags is None:
        return 0
    close = text.find(tags[1])
    if close == -1:
        return 0
    opened = text.find(tags[0])
    return close + len(tags[1]) if opened == -1 or close < opened else 0


def _reasoning_end(text: str, start: int, tags: tuple[str, str]) -> int:
    """End of the ``<think>`` block opening at ``start``: past its ``</think>``, or the end of the text."""
    close = text.find(tags[1], start + len(tags[0]))
    return len(text) if close == -1 else close + len(tags[1])


def _reasoning_spans(text: str, tags: tuple[str, str] | None) -> list[tuple[int, int]]:
    if tags is None:
        return []
    spans, pos = [], _leading_reasoning_end(text, tags)
    if pos:
        spans.append((0, pos))
    while (start := text.find(tags[0], pos)) != -1:
        pos = _reasoning_end(text, start, tags)
        spans.append((start, pos))
    return spans


def _answer_start(text: str, tags: tuple[str, str] | None) -> int:
    """Index of the first character after any reasoning (and whitespace) that opens the turn."""
    pos = _skip_ws(text, _leading_reasoning_end(text, tags))
    while tags is not None and text.startswith(tags[0], pos):
        pos = _skip_ws(text, _reasoning_end(text, pos, tags))
    return pos


def _check_text(text: Any) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")


# ---- hermes ------------------------------------------------------------------------------------


@dataclass
class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes / Qwen).

    Each block is read with ``json.JSONDecoder.raw_decode`` from its start, so a ``</tool_call>``
    inside an argument string does not end it. A missing ``</tool_call>`` is tolerated when the JSON
    object is complete (generation often stops on that tag); text between the object and the closing
    tag is an error. Text after the last call is content.
    """

    name: ClassVar[str] = "hermes"
    open_tag: ClassVar[str] = "<tool_call>"
    close_tag: ClassVar[str] = "</tool_call>"
    reasoning_tags: tuple[str, str] | None = DEFAULT_REASONING_TAGS

    def parse(self, text: str) -> ParsedAction:
        _check_text(text)
        tags, out = self.reasoning_tags, _Calls()
        cursor = _leading_reasoning_end(text, tags)
        kept = [text[:cursor]]
        while (start := text.find(self.open_tag, cursor)) != -1:
            think = text.find(tags[0], cursor, start) if tags else -1
            if think != -1:  # a reasoning block opens before the next call: skip it whole
                end = _reasoning_end(text, think, tags)
                kept.append(text[cursor:end])
                cursor = end
                continue
            kept.append(text[cursor:start])
            cursor = self._read_block(text, start, out)
        kept.append(text[cursor:])
        return ParsedAction("".join(kept).strip(), out.calls, out.errors)

    def _read_block(self, text: str, start: int, out: _Calls) -> int:
        """Parse the block opening at ``start`` into ``out``; return the index just past it."""
        n = out.next_attempt()
        body = start + len(self.open_tag)
        try:
            value, end = _decode_json(text, _skip_ws(text, body))
        except ValueError as exc:
            body_end, stop = self._block_stop(text, body)
            out.add(
                f"tool call {n}: invalid JSON in <tool_call> ({_json_error(exc)}): {_snippet(text[body:body_end])}"
            )
            return stop
        after = _skip_ws(text, end)
        if text.startswith(self.close_tag, after):
            end = after + len(self.close_tag)
        else:
            close, reopen = text.find(self.close_tag, end), text.find(self.open_tag, end)
            if close != -1 and (reopen == -1 or close < reopen):
                out.add(
                    f"tool call {n}: unexpected text after the JSON object in <tool_call>: "
                    f"{_snippet(text[end:close])}"
                )
                return close + len(self.close_tag)
        out.add(_call_from_object(value, n))
        return end

    def _block_stop(self, text: str, body: int) -> tuple[int, int]:
        """Where an unparseable block's body ends and where the block ends: at its ``</tool_call>``,
        else at the next ``<tool_call>``, else at the end of the text."""
        close, reopen = text.find(self.close_tag, body), text.find(self.open_tag, body)
        if close != -1 and (reopen == -1 or close < reopen):
            return close, close + len(self.close_tag)
        stop = len(text) if reopen == -1 else reopen
        return stop, stop


# ---- Llama 3 JSON ------------------------------------------------------------------------------

_FENCE_OPEN = re.compile(r"```json[ \t]*\n?", re.IGNORECASE)
_FENCE_CLOSE = "```"
_NAME_KEY = re.compile(r'"name"\s*:')


def _read_json_calls(text: str, pos: int, out: _Calls) -> int | None:
    """Read call JSON (an object, a list, or several separated by ``;``) starting at ``text[pos]``.

    Returns the index just past the calls, or None when the text there is not a tool call (JSON
    that holds no ``{"name": ...}`` object, or non-JSON that does not mention ``"name"``), so the
    caller treats it as prose.
    """
    values: list[Any] = []
    failure: ValueError | None = None
    end = pos
    while True:
        try:
            value, end = _decode_json(text, pos)
        except ValueError as exc:
            failure = exc
            break
        values.append(value)
        nxt = _skip_ws(text, end)
        if text.startswith(";", nxt):
            nxt = _skip_ws(text, nxt + 1)
        if not text.startswith(("{", "["), nxt):
            break
        pos = nxt
    items = [x for v in values for x in (v if isinstance(v, list) else [v])]
    # A value that fails to decode is a broken call when it mentions "name"; else it is prose.
    broken = failure is not None and _NAME_KEY.search(text, pos) is not None
    if not any(_is_call_object(x) for x in items) and not broken:
        return None
    for item in items:
        out.add(_call_from_object(item, out.next_attempt()))
    if broken:
        n = out.next_attempt()
        out.add(f"tool call {n}: invalid JSON ({_json_error(failure)}): {_snippet(text[pos:])}")
        return len(text)
    return end


@dataclass
class JsonParser:
    """Llama 3 JSON tool calls: ``{"name": ..., "parameters": {...}}`` opening the content, or fenced."""

    name: ClassVar[str] = "json"
    python_tag: ClassVar[str] = "<|python_tag|>"
    reasoning_tags: tuple[str, str] | None = DEFAULT_REASONING_TAGS

    def parse(self, text: str) -> ParsedAction:
        _check_text(text)
        out = _Calls()
        start = _answer_start(text, self.reasoning_tags)
        pos = (
            _skip_ws(text, start + len(self.python_tag)) if text.startswith(self.python_tag, start) else start
        )
        if text.startswith(("{", "["), pos):
            end = _read_json_calls(text, pos, out)
            if end is not None:
                return ParsedAction((text[:start] + text[end:]).strip(), out.calls, out.errors)
        return self._parse_fenced(text)

    def _parse_fenced(self, text: str) -> ParsedAction:
        out, kept, cursor = _Calls(), [], 0
        spans = _reasoning_spans(text, self.reasoning_tags)
        for m in _FENCE_OPEN.finditer(text):
            if m.start() < cursor or any(s <= m.start() < e for s, e in spans):
                continue
            body = _skip_ws(text, m.end())
            # _read_json_calls adds nothing to `out` when it returns None.
            end = _read_json_calls(text, body, out) if text.startswith(("{", "["), body) else None
            if end is None:
                continue  # a json block that is not a call (e.g. the final answer as JSON)
            close = _skip_ws(text, end)
            end = close + len(_FENCE_CLOSE) if text.startswith(_FENCE_CLOSE, close) else end
            kept.append(text[cursor : m.start()])
            cursor = end
        kept.append(text[cursor:])
        return ParsedAction("".join(kept).strip(), out.calls, out.errors)


# ---- pythonic ----------------------------------------------------------------------------------

_CALL_LIST_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")


def _closing_bracket(text: str, start: int) -> int | None:
    """Index just past the ``]`` closing the ``[`` at ``text[start]``, using Python's tokenizer so
    brackets inside string literals do not count; None when it never closes or does not tokenize."""
    src = text[start:]
    line_starts = [0]
    for line in src.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    depth = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type != tokenize.OP:
                continue
            if tok.string in ("(", "[", "{"):
                depth += 1
            elif tok.string in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    row, col = tok.end
                    return start + line_starts[row - 1] + col
    except (tokenize.TokenError, SyntaxError):
        return None
    return None


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _to_json_value(value: Any) -> tuple[Any, str | None]:
    """A Python literal as a JSON value (tuples become arrays), or an error naming what is not JSON."""
    if value is None or isinstance(value, (bool, int, str)):
        return value, None
    if isinstance(value, float):
        return (value, None) if math.isfinite(value) else (None, f"{value} is not a JSON number")
    if isinstance(value, (list, tuple)):
        items = []
        for v in value:
            item, err = _to_json_value(v)
            if err:
                return None, err
            items.append(item)
        return items, None
    if isinstance(value, dict):
        obj = {}
        for k, v in value.items():
            if not isinstance(k, str):
                return None, f"object keys must be strings, got {k!r}"
            item, err = _to_json_value(v)
            if err:
                return None, err
            obj[k] = item
        return obj, None
    return None, f"a {type(value).__name__} is not a JSON value"


def _source(src: str, node: ast.AST) -> str:
    return _snippet(ast.get_source_segment(src, node) or "")


def _pythonic_call(src: str, node: ast.expr, n: int) -> tuple[str, dict[str, Any]] | str:
    if not isinstance(node, ast.Call):
        return f"tool call {n}: expected a call like name(arg=value), got {_source(src, node)}"
    name = _dotted_name(node.func)
    if name is None:
        return f"tool call {n}: the function must be a plain name, got {_source(src, node.func)}"
    if node.args:
        return f"tool call {n} ({name}): positional arguments are not supported; write name=value"
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return f"tool call {n} ({name}): ** unpacking is not supported; write name=value"
        if kw.arg in args:  # ast.parse accepts repeated keywords; only the compiler rejects them
            return f"tool call {n} ({name}): argument {kw.arg!r} is given twice"
        try:
            value = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return (
                f"tool call {n} ({name}): argument {kw.arg!r} is not a literal "
                "(use strings, numbers, True/False/None, lists and dicts)"
            )
        value, err = _to_json_value(value)
        if err:
            return f"tool call {n} ({name}): argument {kw.arg!r}: {err}"
        args[kw.arg] = value
    return name, args


@dataclass
class PythonicParser:
    """Llama 3.2 / 4 pythonic calls: ``[f(a=1, b="x"), g()]`` opening the content; never evaluated."""

    name: ClassVar[str] = "pythonic"
    start_tags: ClassVar[tuple[str, ...]] = ("<|python_start|>", "<|python_tag|>")
    end_tag: ClassVar[str] = "<|python_end|>"
    reasoning_tags: tuple[str, str] | None = DEFAULT_REASONING_TAGS

    def parse(self, text: str) -> ParsedAction:
        _check_text(text)
        start = _answer_start(text, self.reasoning_tags)
        pos = start
        for tag in self.start_tags:
            if text.startswith(tag, pos):
                pos = _skip_ws(text, pos + len(tag))
                break
        if not text.startswith("[", pos):
            return ParsedAction(text.strip())
        end = _closing_bracket(text, pos)
        end = len(text) if end is None else end
        src = text[pos:end]
        out = _Calls()
        try:
            tree = ast.parse(src, mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            if not _CALL_LIST_START.match(src):
                return ParsedAction(text.strip())  # prose that starts with "[", e.g. "[1] Smith et al."
            reason = exc.msg if isinstance(exc, SyntaxError) else str(exc)
            out.add(f"tool call {out.next_attempt()}: invalid Python call list ({reason}): {_snippet(src)}")
            return ParsedAction(text[:start].strip(), out.calls, out.errors)
        elts = tree.body.elts if isinstance(tree.body, ast.List) else []
        if not any(isinstance(e, ast.Call) for e in elts):
            return ParsedAction(text.strip())  # a list that holds no call is an answer, not a call
        for node in elts:
            out.add(_pythonic_call(src, node, out.next_attempt()))
        end = _skip_ws(text, end)
        if text.startswith(self.end_tag, end):
            end += len(self.end_tag)
        return ParsedAction((text[:start] + text[end:]).strip(), out.calls, out.errors)


# ---- OpenAI structured calls -------------------------------------------------------------------


def parse_openai_tool_calls(tool_calls: Any) -> tuple[list[ToolCall], list[str]]:
    """Validate structured ``tool_calls`` from an OpenAI-compatible server.

    Args:
        tool_calls: a list of ``{"id", "type": "function", "function": {"name", "arguments"}}``;
            ``arguments`` is JSON text (as on the wire) or already an object.

    Returns:
        ``(calls, errors)``: calls rebuilt in canonical form (arguments re-serialised, the server's id
        kept, ``call_<i>`` where it has none) and error messages for the model. Never raises.
    """
    out = _Calls()
    if not isinstance(tool_calls, list):
        out.add(f"tool_calls must be a list, got {_json_type(tool_calls)}")
        return out.calls, out.errors
    for call in tool_calls:
        n = out.next_attempt()
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            out.add(f'tool call {n}: expected {{"function": {{"name": ..., "arguments": ...}}}}')
            continue
        raw = fn.get("arguments", "{}")
        if isinstance(raw, str) and raw.strip():
            try:  # the wire format: JSON text; a string inside it is then decoded once more
                raw = _loads(raw)
            except ValueError as exc:
                out.add(f"tool call {n}: arguments are not valid JSON ({_json_error(exc)}): {_snippet(raw)}")
                continue
        call_id = call.get("id")
        out.add(
            _call_from_object({"name": fn.get("name"), "arguments": raw}, n),
            call_id if isinstance(call_id, str) and call_id else None,
        )
    return out.calls, out.errors


def parse_openai_message(message: Mapping[str, Any]) -> ParsedAction:
    """A ``ParsedAction`` from an assistant Message whose ``tool_calls`` a server already parsed."""
    content = message.get("content")
    calls, errors = parse_openai_tool_calls(message.get("tool_calls") or [])
    return ParsedAction(content.strip() if isinstance(content, str) else "", calls, errors)


@dataclass
class OpenAIParser:
    """Calls structured by an OpenAI-compatible server; plain text carries none."""

    name: ClassVar[str] = "openai"

    def parse(self, text: str) -> ParsedAction:
        _check_text(text)
        return ParsedAction(text.strip())

    def parse_message(self, message: Mapping[str, Any]) -> ParsedAction:
        return parse_openai_message(message)


PARSERS: dict[str, type] = {
    "hermes": HermesParser,
    "json": JsonParser,
    "pythonic": PythonicParser,
    "openai": OpenAIParser,
}


def get_parser(name: str, **options: Any) -> ToolCallParser:
    """A parser by format name (a key of ``PARSERS``); ``options`` go to its constructor
    (e.g. ``reasoning_tags=None``).

    Raises:
        ValueError: unknown ``name``, naming the known formats.
    """
    try:
        cls = PARSERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {sorted(PARSERS)}") from None
    return cls(**options)
