"""What every parser returns and the checks they share: a call object -> (name, arguments) or an error."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from chatgym.envs.messages import ToolCall, make_tool_call
from chatgym.envs.parsers.lenient_json import json_error, loads

_SNIPPET_CHARS = 120

# The function name a malformed call is recorded under when the model wrote no readable name.
INVALID_CALL_NAME = "invalid"


@dataclass
class ParsedAction:
    """An assistant turn, parsed.

    Attributes:
        content: text outside the tool calls (reasoning included), stripped.
        calls: valid tool calls in the order written (OpenAI shape, arguments as JSON text).
        errors: one message per malformed call, written for the model to read.
        error_ids: the server's call id of each malformed call, where the turn came structured from an
            OpenAI-compatible server (so the error's ``tool`` message answers that id); None where
            it sent none or the id repeated one already used (:meth:`numbered_from` made another);
            empty for text-parsed turns.
        error_positions: where each malformed call stood among all the call attempts of the turn
            (0-based, same length as ``errors``), so the tool messages answer the calls in the order
            written (:meth:`in_order`). Not part of ``==``: two parses compare by what they found.
        error_calls: each malformed call as the model wrote it, OpenAI-shaped (same length as
            ``errors``): its own id, the name written (``"invalid"`` when there is no readable one)
            and the arguments as written, as text (see :func:`written_call`). The history records it
            beside the valid calls (:meth:`all_calls`) and its error ``tool`` message answers its id.
            Not part of ``==``.
        generated_positions: the attempts (0-based positions, as ``error_positions``) whose id the
            parser made, ``call_<position>``, rather than a server's, a server's id that repeated
            one already used included; :meth:`numbered_from` renumbers these. Empty for a
            ``ParsedAction`` built by hand: its ids are kept where they do not repeat. Not part of
            ``==``.
    """

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    error_ids: list[str | None] = field(default_factory=list)
    error_positions: list[int] = field(default_factory=list, compare=False)
    error_calls: list[ToolCall] = field(default_factory=list, compare=False)
    generated_positions: list[int] = field(default_factory=list, compare=False)

    def error_call(self, j: int) -> ToolCall:
        """The recorded form of malformed call ``j`` (``errors[j]``): ``error_calls[j]``, or, for a
        ``ParsedAction`` built without them, a stand-in named ``"invalid"`` with empty arguments and
        the id ``error_ids[j]`` or ``call_error_<j>``."""
        if len(self.error_calls) == len(self.errors):
            return self.error_calls[j]
        call_id = (self.error_ids[j] if j < len(self.error_ids) else None) or f"call_error_{j}"
        return {"id": call_id, "type": "function", "function": {"name": INVALID_CALL_NAME, "arguments": ""}}

    def all_calls(self) -> list[ToolCall]:
        """Every call attempt of the turn, in the order written: the valid calls in canonical form
        and the malformed ones as written (:meth:`error_call`). This is the assistant message's
        ``tool_calls`` in the history: the ``tool`` messages that answer the turn pair with it one to
        one, by position and by id, so a template or chat API that pairs results with calls by
        position shows each error after the call that caused it."""
        return [self.calls[i] if kind == "call" else self.error_call(i) for kind, i in self.in_order()]

    def numbered_from(self, first: int, taken: Iterable[str] = ()) -> ParsedAction:
        """This turn with its call ids made unique over the conversation (:func:`unique_call_ids`):
        a server's id is kept the first time it appears, unless ``taken`` already holds it; the
        attempt at position ``p`` whose id the parser made, or whose server id ``taken`` or an
        earlier attempt of the turn already holds, gets ``call_<n>``, ``n`` the first number from
        ``first + p`` up whose id is free: not in ``taken``, not a kept id of the turn, not made for
        an earlier attempt of the turn (:func:`fresh_call_id`). A replaced server id joins
        :attr:`generated_positions` (and leaves :attr:`error_ids`), so numbering the result again
        counts it as made.

        ``first`` is the number of call attempts the episode (or gateway session) made before this
        turn (:func:`calls_before`) and ``taken`` every id it used (:func:`call_ids`), so no id
        repeats one of the episode's, a client's or a server's included: a client that pairs
        ``tool_call_id`` with calls across the whole conversation can tell every call apart. The
        ids depend on ``first``, ``taken`` and the turn alone, so an episode replayed gets the same
        ids. ``numbered_from(0)`` is the parse itself.

        Args:
            first: call attempts before this turn (an int >= 0).
            taken: ids the turn's ids must not repeat (any iterable of str).

        Raises:
            ValueError: ``first`` is negative.
        """
        if first < 0:
            raise ValueError(f"first must be >= 0, got {first}")
        generated = set(self.generated_positions)
        attempts = self.all_calls()
        ids = unique_call_ids([None if p in generated else c["id"] for p, c in enumerate(attempts)], first, taken)
        if ids == [c["id"] for c in attempts]:
            return self
        calls, error_calls = list(self.calls), [self.error_call(j) for j in range(len(self.errors))]
        error_ids = list(self.error_ids)
        for p, (kind, i) in enumerate(self.in_order()):
            if ids[p] == attempts[p]["id"]:
                continue
            if kind == "call":
                calls[i] = {**calls[i], "id": ids[p]}
            else:
                error_calls[i] = {**error_calls[i], "id": ids[p]}
                if i < len(error_ids) and p not in generated:
                    error_ids[i] = None  # the error no longer answers the server's id
            generated.add(p)
        return dataclasses.replace(
            self, calls=calls, error_calls=error_calls, error_ids=error_ids, generated_positions=sorted(generated)
        )

    def numbered_after(self, history: Iterable[Any]) -> ParsedAction:
        """:meth:`numbered_from` for the turn that follows the conversation ``history`` (an env's
        messages): counted from :func:`calls_before`, stepping around :func:`call_ids`."""
        history = list(history)
        return self.numbered_from(calls_before(history), call_ids(history))

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


class PlainText:
    """The parser of an env that reads the raw text itself (a ``<move>``, a ``<search>`` tag): no
    tool-call parsing, every turn is its content."""

    name = "plain"

    def parse(self, text: str) -> ParsedAction:
        return ParsedAction(text, [], [])


def calls_before(history: Iterable[Any]) -> int:
    """The call attempts a conversation recorded: the ``tool_calls`` of its assistant messages (an
    env's history keeps every attempt, malformed ones included: :meth:`ParsedAction.all_calls`).
    The ``first`` of :meth:`ParsedAction.numbered_from` for the turn after ``history``."""
    return sum(
        len(m.get("tool_calls") or []) for m in history if isinstance(m, dict) and m.get("role") == "assistant"
    )


def call_ids(history: Iterable[Any]) -> set[str]:
    """Every call id a conversation holds: the ids of its assistant messages' ``tool_calls`` and the
    ``tool_call_id`` of its tool messages. The ``taken`` of :meth:`ParsedAction.numbered_from` for
    the turn after ``history``."""
    ids: set[str] = set()
    for m in history:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "assistant":
            calls = m.get("tool_calls") or []
            ids.update(c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str))
        elif m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str):
            ids.add(m["tool_call_id"])
    return ids


def fresh_call_id(n: int, taken: Container[str]) -> str:
    """``call_<m>`` for the first ``m >= n`` whose id is not in ``taken``."""
    while f"call_{n}" in taken:
        n += 1
    return f"call_{n}"


def unique_call_ids(ids: Iterable[str | None], first: int, taken: Iterable[str] = ()) -> list[str]:
    """The ids of one turn's call attempts, none repeating another of the conversation.

    An id (a non-empty str) is kept the first time it appears: when ``taken`` does not hold it and
    no earlier attempt of the turn kept it. Every other attempt (no id, or an id already used) gets
    ``call_<n>``, ``n`` the first number from ``first + i`` up (``i`` its 0-based place in the turn)
    whose id is neither in ``taken`` nor kept nor made for an earlier attempt (:func:`fresh_call_id`).
    For ``["dup", "dup", "fresh"]`` after no calls: ``["dup", "call_1", "fresh"]``.

    Args:
        ids: each attempt's own id, in the order written (None where it has none).
        first: call attempts the conversation made before the turn (:func:`calls_before`).
        taken: ids the conversation already used (:func:`call_ids`).
    """
    ids = list(ids)
    used = set(taken)
    kept: list[str | None] = []
    for call_id in ids:
        ok = isinstance(call_id, str) and call_id and call_id not in used
        kept.append(call_id if ok else None)
        if ok:
            used.add(call_id)
    # Made ids step around every kept id of the turn, later ones included.
    out: list[str] = []
    for i, call_id in enumerate(kept):
        if call_id is None:
            call_id = fresh_call_id(first + i, used)
            used.add(call_id)
        out.append(call_id)
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


def _json_text(value: Any) -> str | None:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None


def written_call(written: Any, raw: str) -> tuple[str, str]:
    """``(name, arguments)`` recording a malformed call as the model wrote it, both strings (what a
    chat API requires of a ``tool_call``).

    Args:
        written: the call as decoded, where it decoded: a JSON value (an OpenAI-shaped
            ``{"function": {...}}`` is unwrapped), or a ``{"name", "arguments"}`` the parser built;
            None when nothing decoded.
        raw: the call's own text as written (a hermes block's body, the rest of a broken JSON list).

    Returns:
        The name written when it is a non-empty string (stripped), else ``"invalid"``; the
        ``"arguments"`` (or ``"parameters"``) as written when the object has them — a string as is,
        any other value as its JSON text —, else ``raw`` stripped (or the JSON text of ``written``
        when ``raw`` is empty).
    """
    obj = written
    if isinstance(obj, dict) and "name" not in obj and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name") if isinstance(obj, dict) else None
    name = name.strip() if isinstance(name, str) and name.strip() else INVALID_CALL_NAME
    if isinstance(obj, dict) and ("arguments" in obj or "parameters" in obj):
        args = obj["arguments"] if "arguments" in obj else obj["parameters"]
        text = args if isinstance(args, str) else _json_text(args)
        if text is not None:
            return name, text
    text = raw.strip()
    if not text and written is not None:
        text = _json_text(written) or ""
    return name, text


@dataclass
class CallList:
    """Accumulates the calls and errors of one turn, numbering attempts and call ids.

    Every attempt, valid or malformed, gets the id ``call_<position>`` (its 0-based place among the
    turn's attempts) unless the server gave it one, so the ``tool`` message answering attempt ``i``
    carries the id of the history's call ``i``; ``generated`` records which ids were made here, and
    :meth:`action` steps them around the server's ids of the turn and replaces a server's id that an
    earlier attempt of the turn already has (:meth:`ParsedAction.numbered_from`).
    """

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    error_ids: list[str | None] = field(default_factory=list)
    error_positions: list[int] = field(default_factory=list)
    error_calls: list[ToolCall] = field(default_factory=list)
    attempts: int = 0
    generated: set[int] = field(default_factory=set)

    def new_id(self, call_id: str | None) -> str:
        """The server's id, or ``call_<position>`` (made unique among the turn's ids by :meth:`action`)."""
        if call_id:
            return call_id
        position = len(self.calls) + len(self.errors)
        self.generated.add(position)
        return f"call_{position}"

    def action(self, content: str, *, server_ids: bool = False) -> ParsedAction:
        """The ``ParsedAction`` of this turn; ``server_ids`` keeps the errors' server call ids."""
        ids = self.error_ids if server_ids else []
        parsed = ParsedAction(content, self.calls, self.errors, ids, self.error_positions, self.error_calls,
                              sorted(self.generated))
        # The one rule of call ids (made ids, repeated server ids), here against the turn's own ids only.
        return parsed.numbered_from(0)

    def _error(self, message: str, call_id: str | None, written: Any, raw: str) -> None:
        position = len(self.calls) + len(self.errors)
        error_id = self.new_id(call_id)
        name, arguments = written_call(written, raw)
        self.error_positions.append(position)
        self.errors.append(message)
        self.error_ids.append(call_id)
        self.error_calls.append(
            {
                "id": error_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )

    def next_attempt(self) -> int:
        self.attempts += 1
        return self.attempts

    def add(
        self,
        result: tuple[str, dict[str, Any]] | str,
        call_id: str | None = None,
        *,
        written: Any = None,
        raw: str = "",
    ) -> None:
        """Record one attempt: a ``(name, arguments)`` call, or an error message.

        Args:
            result: what :func:`call_from_object` (or a format's own check) made of the attempt.
            call_id: the server's id of the call, if it has one.
            written, raw: the attempt as written (:func:`written_call`), kept for an error.
        """
        if isinstance(result, str):
            self._error(result, call_id, written, raw)
            return
        name, args = result
        try:
            call = make_tool_call(name, args, self.new_id(call_id))
        except (ValueError, RecursionError) as exc:  # nesting the decoder took but the encoder refuses
            message = f"tool call {self.attempts} ({name}): arguments cannot be encoded ({exc})"
            self._error(message, call_id, {"name": name} if written is None else written, raw)
            return
        self.calls.append(call)
