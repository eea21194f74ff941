"""The ``pythonic`` format: Llama 3.2 / Llama 4 calls written as a Python list, ``[f(a=1), g()]``.

The list is parsed with :mod:`ast` and each keyword value read with ``ast.literal_eval``: nothing the
model writes is ever evaluated.
"""

from __future__ import annotations

import ast
import io
import math
import re
import tokenize
from dataclasses import dataclass
from typing import Any, ClassVar

from chatgym.envs.parsers.base import CallList, ParsedAction, check_text, snippet
from chatgym.envs.parsers.lenient_json import skip_ws
from chatgym.envs.parsers.reasoning import DEFAULT_REASONING_TAGS, answer_start

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
    return snippet(ast.get_source_segment(src, node) or "")


def _written(src: str, node: ast.expr) -> dict[str, str | None]:
    """A call of the list as written, for the history should it be malformed: the function's dotted
    name (None when it is not a plain name) and the call's source text as its arguments."""
    func = node.func if isinstance(node, ast.Call) else None
    name = _dotted_name(func) if func is not None else None
    return {"name": name, "arguments": ast.get_source_segment(src, node) or ""}


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
        check_text(text)
        start = answer_start(text, self.reasoning_tags)
        pos = start
        for tag in self.start_tags:
            if text.startswith(tag, pos):
                pos = skip_ws(text, pos + len(tag))
                break
        if not text.startswith("[", pos):
            return ParsedAction(text.strip())
        end = _closing_bracket(text, pos)
        end = len(text) if end is None else end
        src = text[pos:end]
        out = CallList()
        try:
            tree = ast.parse(src, mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            if not _CALL_LIST_START.match(src):
                return ParsedAction(text.strip())  # prose that starts with "[", e.g. "[1] Smith et al."
            reason = exc.msg if isinstance(exc, SyntaxError) else str(exc)
            message = f"tool call {out.next_attempt()}: invalid Python call list ({reason}): {snippet(src)}"
            out.add(message, raw=src)
            return out.action(text[:start].strip())
        elts = tree.body.elts if isinstance(tree.body, ast.List) else []
        if not any(isinstance(e, ast.Call) for e in elts):
            return ParsedAction(text.strip())  # a list that holds no call is an answer, not a call
        for node in elts:
            out.add(_pythonic_call(src, node, out.next_attempt()), written=_written(src, node))
        end = skip_ws(text, end)
        if text.startswith(self.end_tag, end):
            end += len(self.end_tag)
        return out.action((text[:start] + text[end:]).strip())
