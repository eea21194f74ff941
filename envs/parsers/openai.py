"""The ``openai`` format: tool calls already structured by an OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from chatgym.envs.messages import ToolCall
from chatgym.envs.parsers.base import CallList, ParsedAction, call_from_object, check_text, json_type, snippet
from chatgym.envs.parsers.lenient_json import json_error, loads


def parse_openai_tool_calls(tool_calls: Any) -> tuple[list[ToolCall], list[str]]:
    """Validate structured ``tool_calls`` from an OpenAI-compatible server.

    Args:
        tool_calls: a list of ``{"id", "type": "function", "function": {"name", "arguments"}}``;
            ``arguments`` is JSON text (as on the wire) or already an object.

    Returns:
        ``(calls, errors)``: calls rebuilt in canonical form (arguments re-serialised, the server's id
        kept the first time it appears; where it has none, or an earlier call of the turn already
        has it, ``call_<i>``, or the next free number when the turn already holds that id:
        :func:`~chatgym.envs.parsers.base.unique_call_ids`) and error messages for the model. Never
        raises.
    """
    parsed = _parse_calls(tool_calls).action("")
    return parsed.calls, parsed.errors


def _parse_calls(tool_calls: Any) -> CallList:
    out = CallList()
    if not isinstance(tool_calls, list):
        out.add(f"tool_calls must be a list, got {json_type(tool_calls)}")
        return out
    for call in tool_calls:
        n = out.next_attempt()
        call_id = call.get("id") if isinstance(call, Mapping) else None
        call_id = call_id if isinstance(call_id, str) and call_id else None
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            out.add(f'tool call {n}: expected {{"function": {{"name": ..., "arguments": ...}}}}', call_id, written=call)
            continue
        written = {"name": fn.get("name"), "arguments": fn.get("arguments", "")}
        raw = fn.get("arguments", "{}")
        if isinstance(raw, str) and raw.strip():
            try:  # the wire format: JSON text; a string inside it is then decoded once more
                raw = loads(raw)
            except ValueError as exc:
                out.add(
                    f"tool call {n}: arguments are not valid JSON ({json_error(exc)}): {snippet(raw)}",
                    call_id,
                    written=written,
                )
                continue
        out.add(call_from_object({"name": fn.get("name"), "arguments": raw}, n), call_id, written=written)
    return out


def parse_openai_message(message: Mapping[str, Any]) -> ParsedAction:
    """A ``ParsedAction`` from an assistant Message whose ``tool_calls`` a server already parsed.

    Each call keeps the server's id the first time the turn uses it; a call without one, or whose
    id an earlier call of the turn already has, gets ``call_<p>`` (``p`` its 0-based place among the
    turn's attempts, or the next number whose id is free): ids ``["dup", "dup", "fresh"]`` give
    ``["dup", "call_1", "fresh"]`` (:func:`~chatgym.envs.parsers.base.unique_call_ids`). The parser
    sees one turn; ``.numbered_after(history)`` (what the env does) also replaces an id the
    conversation already used and counts made ids on over it, so the ``tool`` messages that answer
    the turn answer ids no other call of the episode has.
    """
    content = message.get("content")
    out = _parse_calls(message.get("tool_calls") or [])
    text = content.strip() if isinstance(content, str) else ""
    return out.action(text, server_ids=True)


@dataclass
class OpenAIParser:
    """Calls structured by an OpenAI-compatible server; plain text carries none."""

    name: ClassVar[str] = "openai"

    def parse(self, text: str) -> ParsedAction:
        check_text(text)
        return ParsedAction(text.strip())

    def parse_message(self, message: Mapping[str, Any]) -> ParsedAction:
        return parse_openai_message(message)
