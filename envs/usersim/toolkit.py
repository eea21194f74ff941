"""Shared pieces of the tau2 domain toolkits: schema helpers and Tool wrapping.

A toolkit is an object with a ``db`` attribute (the episode's private copy of the domain database,
plain JSON dicts) and one method per tool. Each tool is exposed as a chatgym :class:`Tool` whose
result text is what tau2 shows its agent: a string as is, anything else as JSON; an exception in
the tool becomes ``"Error: <message>"`` (tau2's ``Environment.get_response``).

tau2 checks no argument against a schema before it calls a tool: the Python method runs with the
arguments as given, and what it accepts, coerces or refuses is what the method and the pydantic
models it builds do. :class:`Tau2Tool` does the same (the typed schema is still what the model is
shown), and :func:`db_hash` is tau2's hash of a database, which its evaluator compares.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from chatgym.envs.tools import Tool, ToolResult

STR = {"type": "string"}
INT = {"type": "integer"}
STR_LIST = {"type": "array", "items": {"type": "string"}}


def prop(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {**schema, "description": description}


def params(properties: dict[str, Any], required: Sequence[str] | None = None) -> dict[str, Any]:
    """An arguments schema; every listed property is required unless ``required`` says otherwise.
    Unknown argument names are refused (tau2's Python methods refuse them too)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties if required is None else required),
        "additionalProperties": False,
    }


def as_text(resp: Any) -> str:
    """tau2's ``Environment.to_json_str``: strings as is, numbers as ``str``, the rest as JSON."""
    if isinstance(resp, str):
        return resp
    if isinstance(resp, (int, float, bool)):
        return json.dumps(str(resp))
    return json.dumps(resp, default=str)


def db_hash(db: dict[str, Any]) -> str:
    """tau2's hash of a database (``tau2.utils.get_dict_hash`` of ``DB.model_dump()``): SHA-256 hex
    of ``json.dumps(db, sort_keys=True, default=str)``. Types count: ``50``, ``50.0`` and ``"50"``
    hash differently, as they do in tau2's evaluator."""
    return hashlib.sha256(json.dumps(db, sort_keys=True, default=str).encode()).hexdigest()


def from_dicts(items: Any, model: type[BaseModel]) -> Any:
    """tau2's idiom for list arguments: if every item is a dict, ``[model(**item) ...]`` (pydantic
    validates and coerces each; extra keys are dropped), otherwise ``items`` unchanged (and the
    tool fails later as tau2's does). Raises ``TypeError`` when ``items`` is not iterable,
    ``pydantic.ValidationError`` when an item does not validate."""
    if all(isinstance(item, dict) for item in items):
        return [model(**item) for item in items]
    return items


def plain(value: Any) -> Any:
    """``value`` as tau2's ``model_dump()`` shows it once stored in a model field: models (also
    inside lists) become dicts, anything else stays as it is."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


class Tau2Tool(Tool):
    """A :class:`Tool` that, like tau2, calls its function without checking the arguments against
    the schema first: the function's own validation (pydantic models, Python's argument binding)
    decides, with tau2's messages."""

    def validate(self, arguments: Any) -> list[str]:
        if not isinstance(arguments, dict):  # tau2's ToolCall.arguments is a dict too
            return super().validate(arguments)
        return []


def bind_tools(toolkit: Any, specs: Sequence[tuple[str, str, dict[str, Any]]]) -> list[Tool]:
    """Tools for ``toolkit``'s methods: ``specs`` rows are ``(name, description, parameters)``."""

    def make(name: str) -> Any:
        method = getattr(toolkit, name)

        def call(**arguments: Any) -> ToolResult:
            try:
                return ToolResult(as_text(method(**arguments)))
            except Exception as exc:  # tau2 shows every tool failure to the agent as "Error: ..."
                return ToolResult(f"Error: {exc}", is_error=True)

        return call

    return [Tau2Tool(name=n, description=d, parameters=p, fn=make(n)) for n, d, p in specs]


def calculate(expression: str) -> str:
    """tau2's ``calculate``: digits, ``+-*/().`` and spaces only, result rounded to 2 decimals."""
    if not all(char in "0123456789+-*/(). " for char in expression):
        raise ValueError("Invalid characters in expression")
    # The character check above leaves no names to call, so eval sees arithmetic only.
    return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))


CALCULATE_SPEC = (
    "calculate",
    "Calculate the result of a mathematical expression.",
    params(
        {
            "expression": prop(
                STR,
                "The mathematical expression to calculate, such as '2 + 2'. The expression can contain "
                "numbers, operators (+, -, *, /), parentheses, and spaces.",
            )
        }
    ),
)

TRANSFER_SPEC = (
    "transfer_to_human_agents",
    "Transfer the user to a human agent, with a summary of the user's issue. Only transfer if "
    "the user explicitly asks for a human agent, or given the policy and the available tools, you "
    "cannot solve the user's issue.",
    params({"summary": prop(STR, "A summary of the user's issue.")}),
)
