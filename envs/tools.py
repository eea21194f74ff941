"""Tools the model can call: an OpenAI function schema plus an async callable.

A ``Tool`` is built from a typed, documented Python function (the JSON schema comes from
``transformers.utils.get_json_schema``, which reads type hints and the Google-style docstring) or
from an explicit schema (MCP tools, config files). Every call is validated against the schema
before it runs; a bad call never raises out of an env's ``step`` — it becomes a ``tool`` message the
model can read (see :func:`run_tool_calls`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from chatgym.envs import tool_gate
from chatgym.envs.messages import Message, ToolCall, message_errors
from chatgym.envs.messages import tool as tool_message


@dataclass
class ToolResult:
    """What a tool returns when plain text is not enough.

    ``content`` is the tool message's content: text, or a list of content parts (``{"type": "text",
    "text": ...}``, ``{"type": "image_url", "image_url": {"url": "data:..."}}``, ``{"type": "image",
    "image": <PIL image>}``) for a result that holds images. ``done`` ends the episode (e.g. a
    ``submit`` tool); ``reward`` is added to the step reward; ``info`` is merged into the step's ``info``.
    """

    content: str | list[dict[str, Any]]
    is_error: bool = False
    done: bool = False
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Tool:
    """A callable tool with an OpenAI function schema.

    Args:
        name: the function name the model writes.
        description: one line shown to the model.
        parameters: JSON schema of the arguments object (``{"type": "object", "properties": ...}``).
        fn: sync or async callable taking the arguments as keywords and returning ``str``, a list of
            content parts (a result with images; see :class:`ToolResult`) or :class:`ToolResult`;
            anything else becomes its ``str``. Sync functions run in a worker thread so they never
            block the loop.
        parse_args: optional hook that converts/validates the decoded arguments before the call;
            it may raise ``ValueError`` with a message for the model.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    parse_args: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        jsonschema.Draft202012Validator.check_schema(self.parameters)
        self._validator = jsonschema.Draft202012Validator(_nullable_to_null_type(self.parameters))

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None, **kwargs: Any) -> Tool:
        """Build a tool from a function with type hints and a Google-style docstring.

        Raises:
            transformers.utils.chat_template_utils.DocstringParsingException /
            TypeHintParsingException: when the docstring or hints cannot be turned into a schema.
        """
        from transformers.utils import get_json_schema

        schema = get_json_schema(fn)["function"]
        params = dict(schema.get("parameters") or {"type": "object", "properties": {}})
        # Unknown argument names are an error the model should see, never silently dropped.
        params.setdefault("additionalProperties", False)
        return cls(
            name=name or schema["name"],
            description=schema.get("description", ""),
            parameters=params,
            fn=fn,
            **kwargs,
        )

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools=[...]`` entry for this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, arguments: Any) -> list[str]:
        """Schema errors for ``arguments`` (empty list when valid)."""
        if not isinstance(arguments, dict):
            return [f"arguments must be a JSON object, got {_json_type(arguments)}"]
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        return [_format_schema_error(e) for e in errors]

    async def __call__(self, **arguments: Any) -> str | ToolResult:
        if self.parse_args is not None:
            arguments = self.parse_args(arguments)
        if inspect.iscoroutinefunction(self.fn):
            out = await self.fn(**arguments)
        else:
            out = await asyncio.to_thread(self.fn, **arguments)
            if inspect.isawaitable(out):
                out = await out
        return out


def _nullable_to_null_type(schema: Any) -> Any:
    """A copy of ``schema`` where OpenAPI's ``"nullable": true`` (which transformers' ``get_json_schema``
    writes for ``Optional`` parameters, and JSON Schema ignores) also allows ``null`` in ``type``."""
    if isinstance(schema, list):
        return [_nullable_to_null_type(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _nullable_to_null_type(v) for k, v in schema.items()}
    if out.get("nullable") is True:
        if "type" in out:
            types = out["type"] if isinstance(out["type"], list) else [out["type"]]
            out["type"] = types if "null" in types else [*types, "null"]
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
    return out


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _format_schema_error(err: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in err.absolute_path)
    return f"{where}: {err.message}" if where else err.message


# ---- global registry --------------------------------------------------------------------------

TOOL_REGISTRY: dict[str, Tool] = {}


def register_tool(t: Tool | Callable[..., Any], *, name: str | None = None, overwrite: bool = False) -> Tool:
    """Add a tool (or a documented function) to the global registry by name.

    Raises:
        ValueError: if the name is taken and ``overwrite`` is False.
    """
    t = t if isinstance(t, Tool) else Tool.from_function(t, name=name)
    if t.name in TOOL_REGISTRY and not overwrite and TOOL_REGISTRY[t.name] is not t:
        raise ValueError(f"tool {t.name!r} is already registered")
    TOOL_REGISTRY[t.name] = t
    return t


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Decorator: ``@tool`` registers a documented function as a Tool and returns the Tool."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return register_tool(f, name=name, overwrite=True)

    return wrap(fn) if fn is not None else wrap


def get_tool(name: str) -> Tool:
    """Look up a registered tool. Raises ``KeyError`` naming the known tools."""
    try:
        return TOOL_REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown tool {name!r}; registered: {sorted(TOOL_REGISTRY)}") from None


def resolve_tools(tools: Iterable[Tool | str | Callable[..., Any]]) -> dict[str, Tool]:
    """Turn a mix of Tools, registered names and functions into ``{name: Tool}`` (order kept)."""
    out: dict[str, Tool] = {}
    for t in tools:
        if isinstance(t, str):
            t = get_tool(t)
        elif not isinstance(t, Tool):
            t = Tool.from_function(t)
        if t.name in out and out[t.name] is not t:
            raise ValueError(f"two tools are named {t.name!r}; tool names must be unique in an env")
        out[t.name] = t
    return out


# ---- running calls ----------------------------------------------------------------------------


# What went wrong in a failed tool call (``ToolOutcome.kind``; summed per step in the env's
# ``info["tool_error_kinds"]``): the call could not be parsed out of the text, named no offered tool,
# had arguments that are not a JSON object or do not fit the schema, raised, ran past the env's
# ``tool_timeout_s``, or returned an error result itself (``ToolResult.is_error``: a failed search,
# code that raised in the sandbox, an MCP error).
TOOL_ERROR_KINDS = ("parse_error", "unknown_tool", "bad_arguments", "raised", "timeout", "tool_error")


@dataclass
class ToolOutcome:
    """The result of one tool call, already shaped as the ``tool`` message for the model.

    ``kind`` is one of :data:`TOOL_ERROR_KINDS` when ``error`` is True, else None.
    """

    message: Message
    error: bool
    result: ToolResult | None = None
    kind: str | None = None


def tool_error_kinds(outcomes: Iterable[ToolOutcome]) -> dict[str, int]:
    """``{kind: count}`` of the failed outcomes (an error without a kind counts as ``unspecified``);
    an env puts it in a step's ``info["tool_error_kinds"]`` next to ``info["tool_errors"]``."""
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.error:
            kind = o.kind or "unspecified"
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def is_content_parts(value: Any) -> bool:
    """Whether ``value`` is a non-empty list of message content parts (text / image_url / image)."""
    return (
        isinstance(value, list)
        and bool(value)
        and not message_errors({"role": "tool", "content": value, "tool_call_id": "x"})
    )


def decode_arguments(call: ToolCall) -> tuple[dict[str, Any] | None, str | None]:
    """Decode a call's ``arguments`` JSON text into an object; returns (arguments, error)."""
    raw = call["function"].get("arguments", "{}")
    if isinstance(raw, dict):
        return raw, None
    try:
        args = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, AttributeError) as exc:
        return None, f"arguments are not valid JSON ({exc})"
    if not isinstance(args, dict):
        return None, f"arguments must be a JSON object, got {_json_type(args)}"
    return args, None


@dataclass
class _Raised:
    exc: Exception


async def _call_catching(t: Tool, args: dict[str, Any]) -> str | ToolResult | _Raised:
    # The tool's own exceptions come back as a value, so the only TimeoutError reaching wait_for's
    # caller is wait_for's (since Python 3.11 asyncio.TimeoutError is the builtin TimeoutError that
    # a tool's socket read also raises).
    try:
        return await t(**args)
    except Exception as exc:
        return _Raised(exc)


async def run_tool_call(call: ToolCall, tools: Mapping[str, Tool], timeout_s: float | None = None) -> ToolOutcome:
    """Validate and run one call; every failure becomes an error ``tool`` message, never an exception."""
    name = call["function"]["name"]
    call_id = call.get("id") or "call_0"

    def fail(text: str, kind: str) -> ToolOutcome:
        return ToolOutcome(tool_message(f"Error: {text}", call_id, name), error=True, kind=kind)

    if name not in tools:
        return fail(f"unknown tool {name!r}. Available tools: {', '.join(tools) or '(none)'}.", "unknown_tool")
    t = tools[name]
    args, err = decode_arguments(call)
    if err:
        return fail(f"{name}: {err}", "bad_arguments")
    errors = t.validate(args)
    if errors:
        return fail(f"{name}: invalid arguments: " + "; ".join(errors), "bad_arguments")
    try:
        # The wait for a slot of a shared budget (tool_gate) is not the tool's time.
        async with tool_gate.slot("tool"):
            out = await asyncio.wait_for(_call_catching(t, args), timeout_s)
    except asyncio.TimeoutError:
        return fail(f"{name} timed out after {timeout_s} s", "timeout")
    if isinstance(out, _Raised):  # a tool's bug is the model's observation, not the batch's crash
        return fail(f"{name} raised {type(out.exc).__name__}: {out.exc}", "raised")
    if isinstance(out, ToolResult):
        result = out
    elif is_content_parts(out):
        # An image a tool returns reaches the model as an image part, not as its repr.
        result = ToolResult(content=list(out))
    else:
        result = ToolResult(content=str(out))
    return ToolOutcome(
        tool_message(result.content, call_id, name),
        error=result.is_error,
        result=result,
        kind="tool_error" if result.is_error else None,
    )


async def run_tool_calls(
    calls: list[ToolCall], tools: Mapping[str, Tool], timeout_s: float | None = None
) -> list[ToolOutcome]:
    """Run calls one after another, in the order the model wrote them (tools may have side effects)."""
    return [await run_tool_call(c, tools, timeout_s) for c in calls]
