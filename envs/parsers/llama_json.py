"""The ``json`` format: Llama 3.1 / 3.3 JSON tool calls (Meta's Llama 3 prompt format)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from chatgym.envs.parsers.base import (
    CallList,
    ParsedAction,
    call_from_object,
    check_text,
    is_call_object,
    snippet,
)
from chatgym.envs.parsers.lenient_json import decode_json, json_error, skip_ws
from chatgym.envs.parsers.reasoning import DEFAULT_REASONING_TAGS, answer_start, reasoning_spans

_FENCE_OPEN = re.compile(r"```json[ \t]*\n?", re.IGNORECASE)
_FENCE_CLOSE = "```"
_NAME_KEY = re.compile(r'"name"\s*:')
_ARGS_KEY = re.compile(r'"(?:arguments|parameters)"\s*:')


def _read_json_calls(text: str, pos: int, out: CallList, limit: int | None = None) -> int | None:
    """Read call JSON (an object, a list, or several separated by ``;``) starting at ``text[pos]``.

    Returns the index just past the calls, or None when the text there is not a tool call, so the
    caller treats it as prose: JSON that holds no object of the call shape (:func:`is_call_object`),
    or JSON that does not decode and, before ``limit`` (the end of its fence; default: the end of
    the text), does not name both a ``"name"`` and an ``"arguments"``/``"parameters"`` key (a
    broken value after a call of the same list is a broken call too).
    """
    values: list[Any] = []
    failure: ValueError | None = None
    end = pos
    while True:
        try:
            value, end = decode_json(text, pos)
        except ValueError as exc:
            failure = exc
            break
        values.append(value)
        nxt = skip_ws(text, end)
        if text.startswith(";", nxt):
            nxt = skip_ws(text, nxt + 1)
        if not text.startswith(("{", "["), nxt):
            break
        pos = nxt
    items = [x for v in values for x in (v if isinstance(v, list) else [v])]
    calls_before = any(is_call_object(x) for x in items)
    # A value that fails to decode is a broken call when it reads like one; else it is prose.
    stop = len(text) if limit is None else limit
    broken = failure is not None and (
        calls_before
        or (_NAME_KEY.search(text, pos, stop) is not None and _ARGS_KEY.search(text, pos, stop) is not None)
    )
    if not calls_before and not broken:
        return None
    for item in items:
        out.add(call_from_object(item, out.next_attempt()), written=item)
    if broken:
        n = out.next_attempt()
        out.add(f"tool call {n}: invalid JSON ({json_error(failure)}): {snippet(text[pos:])}", raw=text[pos:stop])
        return len(text)
    return end


@dataclass
class JsonParser:
    """Llama 3 JSON tool calls: ``{"name": ..., "parameters": {...}}`` opening the content, or fenced."""

    name: ClassVar[str] = "json"
    python_tag: ClassVar[str] = "<|python_tag|>"
    reasoning_tags: tuple[str, str] | None = DEFAULT_REASONING_TAGS

    def parse(self, text: str) -> ParsedAction:
        check_text(text)
        out = CallList()
        start = answer_start(text, self.reasoning_tags)
        pos = (
            skip_ws(text, start + len(self.python_tag)) if text.startswith(self.python_tag, start) else start
        )
        if text.startswith(("{", "["), pos):
            end = _read_json_calls(text, pos, out)
            if end is not None:
                return out.action((text[:start] + text[end:]).strip())
        return self._parse_fenced(text)

    def _parse_fenced(self, text: str) -> ParsedAction:
        out, kept, cursor = CallList(), [], 0
        spans = reasoning_spans(text, self.reasoning_tags)
        for m in _FENCE_OPEN.finditer(text):
            if m.start() < cursor or any(s <= m.start() < e for s, e in spans):
                continue
            body = skip_ws(text, m.end())
            # _read_json_calls adds nothing to `out` when it returns None.
            fence_end = text.find(_FENCE_CLOSE, body)
            limit = len(text) if fence_end == -1 else fence_end
            end = _read_json_calls(text, body, out, limit) if text.startswith(("{", "["), body) else None
            if end is None:
                continue  # a json block that is not a call (e.g. the final answer as JSON)
            close = skip_ws(text, end)
            end = close + len(_FENCE_CLOSE) if text.startswith(_FENCE_CLOSE, close) else end
            kept.append(text[cursor : m.start()])
            cursor = end
        kept.append(text[cursor:])
        return out.action("".join(kept).strip())
