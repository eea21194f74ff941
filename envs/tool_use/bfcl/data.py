"""Loading BFCL entries from the installed ``bfcl-eval`` package, and BFCL function docs as OpenAI tools.

BFCL writes its function docs in a JSON-schema dialect with Python type names (``"dict"``,
``"float"``, ``"tuple"``, ``"any"``); :func:`to_json_schema` maps them to JSON Schema so the docs can
be offered as OpenAI ``tools`` and validated with ``jsonschema``.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

# Category name -> (data file stem, kind). "simple" is BFCL's simple_python (the file name since v4).
CATEGORIES: dict[str, tuple[str, str]] = {
    "simple": ("simple_python", "ast"),
    "multiple": ("multiple", "ast"),
    "parallel": ("parallel", "ast"),
    "parallel_multiple": ("parallel_multiple", "ast"),
    "live_simple": ("live_simple", "ast"),
    "live_multiple": ("live_multiple", "ast"),
    "live_parallel": ("live_parallel", "ast"),
    "live_parallel_multiple": ("live_parallel_multiple", "ast"),
    "irrelevance": ("irrelevance", "irrelevance"),
    "live_irrelevance": ("live_irrelevance", "irrelevance"),
    "multi_turn_base": ("multi_turn_base", "multi_turn"),
    "multi_turn_miss_func": ("multi_turn_miss_func", "multi_turn"),
    "multi_turn_miss_param": ("multi_turn_miss_param", "multi_turn"),
    "multi_turn_long_context": ("multi_turn_long_context", "multi_turn"),
}
ALIASES = {"simple_python": "simple", "multi_turn": "multi_turn_base"}

# BFCL type name -> JSON Schema type ("any" -> no constraint).
_JSON_TYPES: dict[str, str | None] = {
    "string": "string",
    "integer": "integer",
    "float": "number",
    "number": "number",
    "boolean": "boolean",
    "array": "array",
    "tuple": "array",
    "dict": "object",
    "object": "object",
    "any": None,
}
# Keys of a BFCL doc that are not JSON Schema keywords (BFCL-only annotations).
_DROPPED_KEYS = {"optional", "response"}

BFCL_PACKAGE_HINT = "ToolUse-v0 needs the bfcl-eval data package: pip install --no-deps bfcl-eval==2026.3.23"


def data_dir() -> Any:
    """The ``bfcl_eval/data`` folder (a ``Traversable``).

    Raises:
        ImportError: bfcl-eval is not installed (the message names the pip command).
    """
    try:
        return resources.files("bfcl_eval").joinpath("data")
    except ModuleNotFoundError as exc:
        raise ImportError(BFCL_PACKAGE_HINT) from exc


def canonical_category(category: str) -> str:
    """``category`` or its alias, checked.

    Raises:
        ValueError: an unknown category, naming the known ones.
    """
    category = ALIASES.get(category, category)
    if category not in CATEGORIES:
        raise ValueError(f"ToolUse-v0: unknown category {category!r}; choose one of {sorted(CATEGORIES)}")
    return category


def _read_jsonl(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.lru_cache(maxsize=16)
def load_category(category: str) -> tuple[dict[str, Any], ...]:
    """The entries of a category, each with its ground truth under ``"ground_truth"`` (absent for
    irrelevance). Cached per process; treat the rows as read-only.

    Raises:
        ValueError: unknown category. ImportError: bfcl-eval missing.
    """
    stem, kind = CATEGORIES[canonical_category(category)]
    root = data_dir()
    rows = _read_jsonl(root.joinpath(f"BFCL_v4_{stem}.json"))
    if kind != "irrelevance":
        answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(root.joinpath("possible_answer", f"BFCL_v4_{stem}.json"))}
        rows = [dict(r, ground_truth=answers[r["id"]]) for r in rows]
    return tuple(dict(r, task_id=r["id"]) for r in rows)


@functools.lru_cache(maxsize=16)
def multi_turn_docs(doc_file: str) -> tuple[dict[str, Any], ...]:
    """The function docs of one multi-turn backend (``data/multi_turn_func_doc/<doc_file>``)."""
    return tuple(_read_jsonl(data_dir().joinpath("multi_turn_func_doc", doc_file)))


def to_json_schema(schema: dict[str, Any], where: str = "parameters") -> dict[str, Any]:
    """A BFCL parameter schema as JSON Schema (types mapped, BFCL-only keys dropped).

    Raises:
        ValueError: a type name BFCL does not use, naming where it was found.
    """
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "type":
            if value not in _JSON_TYPES:
                raise ValueError(f"{where}: unknown BFCL type {value!r}")
            if _JSON_TYPES[value] is not None:
                out["type"] = _JSON_TYPES[value]
        elif key == "properties":
            out[key] = {name: to_json_schema(sub, f"{where}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = to_json_schema(value, f"{where}.items")
        else:
            out[key] = value
    return out


def to_openai_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI ``function`` object ``{"name", "description", "parameters"}``.

    Unknown argument names are rejected by validation (``additionalProperties: false``), as for every
    chatgym tool.
    """
    params = to_json_schema(doc.get("parameters") or {"type": "dict", "properties": {}}, doc["name"])
    params.setdefault("properties", {})
    params.setdefault("additionalProperties", False)
    return {"name": doc["name"], "description": doc.get("description", ""), "parameters": params}
