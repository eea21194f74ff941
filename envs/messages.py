"""Chat messages as plain, JSON-serialisable dicts (the OpenAI chat format).

Nothing on the wire is a custom class: an observation is a ``list[Message]`` and an action is an
assistant ``Message`` (or its text). ``TypedDict`` gives editors and type checkers the shape.

**Images.** A message's ``content`` is a ``str``, or a list of OpenAI-style content parts when it
carries images (text-only messages stay ``str``):

* ``{"type": "text", "text": "..."}``;
* ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` — a data URL only:
  chatgym never downloads, so an ``http(s)`` URL is refused (:func:`message_errors` says so);
* ``{"type": "image", "image": <PIL.Image.Image>}`` — a local image object;
* ``{"type": "image", "ref": "<sha256 hex>"}`` — an image by reference, the form the rollout side
  stores in trajectories and traces (the pixels sit once in the trajectory's image store).

The rules of how such parts become token ids are in docs/multimodal.md.
"""

from __future__ import annotations

import json
import re
import sys
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


class TextPart(TypedDict):
    type: Literal["text"]
    text: str


class ImageURL(TypedDict):
    url: str  # a data URL: "data:image/png;base64,..."


class ImageURLPart(TypedDict):
    type: Literal["image_url"]
    image_url: ImageURL


class ImagePart(TypedDict):
    type: Literal["image"]
    image: NotRequired[Any]  # a PIL.Image.Image
    ref: NotRequired[str]  # the sha256 (64 hex digits) of an image in a trajectory's image store


ContentPart = TextPart | ImageURLPart | ImagePart
Content = str | list[ContentPart]


class Message(TypedDict):
    role: Role
    content: Content
    tool_calls: NotRequired[list[ToolCall]]
    tool_call_id: NotRequired[str]
    name: NotRequired[str]


def system(content: str) -> Message:
    return {"role": "system", "content": content}


def user(content: Content) -> Message:
    return {"role": "user", "content": content}


def text_part(text: str) -> TextPart:
    return {"type": "text", "text": text}


def image_part(image: Any) -> ImagePart:
    """A content part holding a local image (a ``PIL.Image.Image``)."""
    return {"type": "image", "image": image}


def image_url_part(url: str) -> ImageURLPart:
    """A content part holding an image as a data URL (``data:image/png;base64,...``)."""
    return {"type": "image_url", "image_url": {"url": url}}


def is_image_part(part: Any) -> bool:
    """True for an ``image`` or ``image_url`` content part."""
    return isinstance(part, dict) and part.get("type") in ("image", "image_url")


def content_text(content: Content) -> str:
    """The text of a message's content: a ``str`` as is, the text parts of a list joined (images
    left out)."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def assistant(content: str, tool_calls: list[ToolCall] | None = None) -> Message:
    msg: Message = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def tool(content: Content, tool_call_id: str, name: str | None = None) -> Message:
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
        errors += content_errors(content)
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


SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_pil_image(value: Any) -> bool:
    """True for a ``PIL.Image.Image`` (without importing PIL: no image exists unless it is loaded)."""
    pil = sys.modules.get("PIL.Image")
    return pil is not None and isinstance(value, pil.Image)


def image_url_error(url: Any) -> str | None:
    """Why ``url`` is not an image URL chatgym reads (None when it is a ``data:image/...`` URL)."""
    if not isinstance(url, str):
        return f"image_url.url must be a str, got {type(url).__name__}"
    head = url[:64].lower()
    if head.startswith(("http://", "https://")):
        return (
            f"image_url {url[:80]!r} is a network URL: chatgym never downloads images; pass a data "
            "URL (data:image/png;base64,...) or a PIL image part"
        )
    if not head.startswith("data:image/"):
        return f"image_url must be a data URL (data:image/<format>;base64,...), got {url[:80]!r}"
    return None


def _part_errors(i: int, part: Any) -> list[str]:
    if not isinstance(part, dict):
        return [f"content part {i} must be a dict, got {type(part).__name__}"]
    kind = part.get("type")
    if kind == "text":
        return [] if isinstance(part.get("text"), str) else [f"content part {i} (text) has no str 'text'"]
    if kind == "image_url":
        box = part.get("image_url")
        error = image_url_error(box.get("url") if isinstance(box, dict) else None)
        return [] if error is None else [f"content part {i}: {error}"]
    if kind == "image":
        if "ref" in part:
            ref = part["ref"]
            ok = isinstance(ref, str) and SHA256_HEX.fullmatch(ref) is not None
            return [] if ok else [f"content part {i} (image) has a ref that is not a sha256 hex digest"]
        if is_pil_image(part.get("image")):
            return []
        return [f"content part {i} (image) needs 'image' (a PIL.Image.Image) or 'ref', got "
                f"{type(part.get('image')).__name__}"]
    return [f"content part {i} has type {kind!r}, not one of 'text', 'image_url', 'image'"]


def content_errors(parts: list[Any]) -> list[str]:
    """Why a list of content parts is not valid message content (empty list when it is)."""
    if not parts:
        return ["content is an empty list of parts"]
    errors: list[str] = []
    for i, part in enumerate(parts):
        errors += _part_errors(i, part)
    return errors
