"""Chat messages as plain, JSON-serialisable dicts (the OpenAI chat format).

Nothing on the wire is a custom class: an observation is a ``list[Message]`` and an action is an
assistant ``Message`` (or its text). ``TypedDict`` gives editors and type checkers the shape.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypedDict

from typing_extensions import NotRequired

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


class FunctionCall(TypedDict):
    name: str
    arguments: str  # JSON text of an object, as in the OpenAI API


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(TypedDict):
    role: Role
    content: str | list[dict[str, Any]]  # a str, or content parts (text / image_url / image)
    tool_calls: NotRequired[list[ToolCall]]
    tool_call_id: NotRequired[str]
    name: NotRequired[str]


def system(content: str) -> Message:
    return {"role": "system", "content": content}


def user(content: str) -> Message:
    return {"role": "user", "content": content}


def assistant(content: str, tool_calls: list[ToolCall] | None = None) -> Message:
    msg: Message = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def tool(content: str, tool_call_id: str, name: str | None = None) -> Message:
    msg: Message = {"role": "tool", "content": content, "tool_call_id": tool_call_id}
    if name is not None:
        msg["name"] = name
    return msg


def make_tool_call(name: str, arguments: dict[str, Any], call_id: str) -> ToolCall:
    """Build an OpenAI-shaped tool call; ``arguments`` is stored as JSON text like the API does."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def message_errors(msg: Any) -> list[str]:
    """Why ``msg`` is not a valid Message (empty list when it is)."""
    if not isinstance(msg, dict):
        return [f"message must be a dict, got {type(msg).__name__}"]
    errors = []
    if msg.get("role") not in ROLES:
        errors.append(f"role must be one of {sorted(ROLES)}, got {msg.get('role')!r}")
    content = msg.get("content")
    if isinstance(content, list):
        errors.extend(e for e in map(_part_errors, content) if e)
    elif not isinstance(content, str):
        errors.append(f"content must be a str or a list of content parts, got {type(content).__name__}")
    calls = msg.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            errors.append("tool_calls must be a list")
        else:
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    errors.append(f"malformed tool call {call!r}")
    if "tool_call_id" in msg and not isinstance(msg["tool_call_id"], str):
        errors.append("tool_call_id must be a str")
    return errors


def _part_errors(part: Any) -> str:
    """Why ``part`` is not a content part (``""`` when it is): ``{"type": "text", "text": str}``,
    ``{"type": "image_url", "image_url": {"url": str}}`` or ``{"type": "image", "image": <image>}``."""
    if not isinstance(part, dict):
        return f"a content part must be a dict, got {type(part).__name__}"
    kind = part.get("type")
    if kind == "text":
        return "" if isinstance(part.get("text"), str) else "a text part needs a str 'text'"
    if kind == "image_url":
        url = part.get("image_url")
        return "" if isinstance(url, dict) and isinstance(url.get("url"), str) else "an image_url part needs {'url': str}"
    if kind == "image":
        return "" if part.get("image") is not None else "an image part needs an 'image'"
    return f"content part type must be text, image_url or image, got {kind!r}"
