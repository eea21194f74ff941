"""What every parser returns and the checks they share: a call object -> (name, arguments) or an error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from chatgym.envs.messages import ToolCall, make_tool_call
from chatgym.envs.parsers.lenient_json import json_error, loads

_SNIPPET_CHARS = 120


@dataclass
class ParsedAction:
    """An assistant turn, parsed.

    Attributes:
        content: text outside the tool calls (reasoning included), stripped.
        calls: valid tool calls in the order written (OpenAI shape, arguments as JSON text).
        errors: one message per malformed call, written for the model to read.
        error_ids: the server's call id of each malformed call, where the turn came structured from an
            OpenAI-compatible server (so the error's ``tool`` message answers that id); empty for
            text-parsed turns.
        error_positions: where each malformed call stood among all the call attempts of the turn
            (0-based, same length as ``errors``), so the tool messages answer the calls in the order
            written (:meth:`in_order`). Not part of ``==``: two parses compare by what they found.
    """

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    error_ids: list[str | None] = field(default_factory=list)
    error_positions: list[int] = field(default_factory=list, compare=False)

    def in_order(self) -> list[tuple[str, int]]:
        """The turn's call attempts in the order written: ``("call", i)`` stands for ``calls[i]`` and
        ``("error", j)`` for ``errors[j]``.

        Templates pair tool results with calls by position (Qwen's ``<tool_response>`` blocks, Llama's
        ``ipython`` turns), so a malformed first call must be answered first. Without recorded
        positions (a ``ParsedAction`` built by hand, or positions that do not fit) the errors follow
        the calls.
        """
        n = len(self.calls) + len(self.errors)
        positions = self.error_positions
        if (
            len(positions) != len(self.errors)
            or len(set(positions)) != len(positions)
            or any(not 0 <= p < n for p in positions)
        ):
            positions = list(range(len(self.calls), n))
        error_at = {p: j for j, p in enumerate(positions)}
        out: list[tuple[str, int]] = []
        next_call = 0
        for p in range(n):
            if p in error_at:
                out.append(("error", error_at[p]))
            else:
                out.append(("call", next_call))
                next_call += 1
        return out


class ToolCallParser(Protocol):
    """A tool-call format: ``name`` (its key in ``PARSERS``) and ``parse(text) -> ParsedAction``,
    which never raises on a ``str`` (``TypeError`` for anything else)."""

    name: str

    def parse(self, text: str) -> ParsedAction: ...


def check_text(text: Any) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def snippet(text: str) -> str:
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
            value = loads(raw)
        except ValueError as exc:
            return None, f"arguments is a string that is not valid JSON ({json_error(exc)}): {snippet(raw)}"
        if isinstance(value, dict):
            return value, None
        return None, f"arguments must be a JSON object; got a string holding {json_type(value)}"
    return None, f"arguments must be a JSON object, got {json_type(raw)}"


# Keys a written-out call may hold besides its name and arguments; anything else (a "description", a
# "version", an "age") makes the object data or a tool definition, not a call.
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "type", "id"})
_WRAPPED_CALL_KEYS = frozenset({"function", "type", "id"})


def is_call_object(value: Any) -> bool:
    """Whether a JSON value has the shape of a written-out call: ``{"name": ..., "arguments": ...}``
    (or ``"parameters"``, Llama's key), optionally with ``"type"`` / ``"id"``, or that object wrapped
    OpenAI-style as ``{"type": "function", "function": {...}}``.

    ``{"name": "my-app", "version": "1.0.0"}`` and ``{"name": "alice", "age": 30}`` are data, and
    ``{"name": ..., "description": ..., "parameters": {...}}`` is a tool's definition: none is a call.
    """
    if not isinstance(value, dict):
        return False
    if "name" not in value and isinstance(value.get("function"), dict):
        return value.keys() <= _WRAPPED_CALL_KEYS and is_call_object(value["function"])
    return "name" in value and ("arguments" in value or "parameters" in value) and value.keys() <= _CALL_KEYS


def call_from_object(obj: Any, n: int) -> tuple[str, dict[str, Any]] | str:
    """``(name, arguments)`` from ``{"name", "arguments"|"parameters"}``, or an error message."""
    if isinstance(obj, dict) and "name" not in obj and isinstance(obj.get("function"), dict):
        obj = obj["function"]  # an OpenAI-shaped call written out as text
    if not isinstance(obj, dict):
        return f'tool call {n}: expected a JSON object {{"name": ..., "arguments": {{...}}}}, got {json_type(obj)}'
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'tool call {n}: "name" must be a non-empty string, got {json_type(name)}'
    name = name.strip()
    raw = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    args, err = normalise_arguments(raw)
    if err:
        return f"tool call {n} ({name}): {err}"
    return name, args


@dataclass
class CallList:
    """Accumulates the calls and errors of one turn, numbering attempts and call ids."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    error_ids: list[str | None] = field(default_factory=list)
    error_positions: list[int] = field(default_factory=list)
    attempts: int = 0

    def action(self, content: str, *, server_ids: bool = False) -> ParsedAction:
        """The ``ParsedAction`` of this turn; ``server_ids`` keeps the errors' server call ids."""
        ids = self.error_ids if server_ids else []
        return ParsedAction(content, self.calls, self.errors, ids, self.error_positions)

    def _error(self, message: str, call_id: str | None) -> None:
        self.error_positions.append(len(self.calls) + len(self.errors))
        self.errors.append(message)
        self.error_ids.append(call_id)

    def next_attempt(self) -> int:
        self.attempts += 1
        return self.attempts

    def add(self, result: tuple[str, dict[str, Any]] | str, call_id: str | None = None) -> None:
        if isinstance(result, str):
            self._error(result, call_id)
        else:
            name, args = result
            try:
                call = make_tool_call(name, args, call_id or f"call_{len(self.calls)}")
            except (ValueError, RecursionError) as exc:  # nesting the decoder took but the encoder refuses
                self._error(
                    f"tool call {self.attempts} ({name}): arguments cannot be encoded ({exc})", call_id
                )
                return
            self.calls.append(call)
