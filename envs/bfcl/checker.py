"""Matching a model's function calls against BFCL's ``possible_answer`` (type- and value-aware).

Our own implementation of the rules of BFCL's AST checker (Patil et al., "The Berkeley Function
Calling Leaderboard", ICML 2025; ``bfcl_eval/eval_checker/ast_eval``), for Python-typed functions:

* the number of calls equals the number of expected calls; calls are matched to expected calls
  order-free (a perfect bipartite matching, so one greedy mismatch cannot hide a valid assignment);
* a call matches when its function name is the expected one, every required parameter of the doc is
  given, every given parameter is in the doc and in the answer, every value is allowed, and every
  parameter of the answer that was left out lists ``""`` (BFCL's mark for "optional, may be omitted");
* types: a value must have the doc's Python type (``bool`` is not an ``integer``); an ``int`` is
  accepted for a ``float`` and converted; ``tuple`` accepts a list; array items must have the item
  type. When the answer's values have another type than the doc's (BFCL writes a variable name as a
  string), a value of the answer's type is accepted and compared as is;
* values: strings compare after BFCL's normalisation (:func:`normalise_string`: spaces and
  ``,./-_*^`` removed, lower case, ``'`` -> ``"``), also inside lists and as dict values; dicts match
  one of the allowed dicts key by key; other values compare with ``==``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "float": (float,),
    "number": (float, int),
    "boolean": (bool,),
    "array": (list,),
    "tuple": (list,),
    "dict": (dict,),
}
_STRIP = re.compile(r"[ ,./\-_*^]")


@dataclass(frozen=True)
class CheckResult:
    """``valid``, and when not valid a one-line ``error`` saying which call/parameter failed."""

    valid: bool
    error: str = ""


def normalise_string(s: str) -> str:
    """BFCL's string normalisation: "April 1, 2024" and "april 1 2024" compare equal."""
    return _STRIP.sub("", s).lower().replace("'", '"')


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    # exact types: True is an int to isinstance, but not a valid "integer" argument
    return type(value) in types


def _answer_type(options: list[Any]) -> type | None:
    return next((type(o) for o in options if o != ""), None)


def _norm(value: Any) -> Any:
    if isinstance(value, str):
        return normalise_string(value)
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    return value


def _dict_matches(value: dict[str, Any], option: Any) -> bool:
    if not isinstance(option, dict):
        return False
    for key, v in value.items():
        if key not in option or _norm(v) not in [_norm(o) for o in option[key]]:
            return False
    return all(key in value or "" in allowed for key, allowed in option.items())


def check_value(param: str, spec: dict[str, Any], value: Any, options: list[Any]) -> str | None:
    """Why ``value`` is not an allowed value of ``param`` (None when it is).

    Args:
        spec: the parameter's BFCL doc (``{"type": "float", ...}``).
        options: the allowed values from ``possible_answer`` (``""`` = may be omitted).
    """
    bfcl_type = spec.get("type", "any")
    if bfcl_type == "float" and type(value) is int:
        value = float(value)
    expected = _PY_TYPES.get(bfcl_type)
    answer_type = _answer_type(options)
    if expected is None:  # "any": no type rule, plain comparison
        return None if value in options else f"{param}: {value!r} is not one of {options!r}"
    is_variable = answer_type is not None and answer_type not in expected
    if not _type_ok(value, expected):
        if answer_type is None or type(value) is not answer_type:
            return f"{param}: expected type {bfcl_type}, got {type(value).__name__} ({value!r})"
        is_variable = True
    elif bfcl_type in ("array", "tuple") and "items" in spec and not is_variable:
        item_type = spec["items"].get("type", "any")
        item_types = _PY_TYPES.get(item_type)
        answer_items = {type(i) for o in options if isinstance(o, list) for i in o}
        for item in value:
            if item_types is None or _type_ok(item, item_types):
                continue
            if (item_type == "float" and type(item) is int) or type(item) in answer_items:
                continue
            return f"{param}: items must be {item_type}, got {type(item).__name__} ({item!r})"
    if is_variable:
        ok = value in options
    elif bfcl_type == "dict":
        ok = any(_dict_matches(value, o) for o in options if o != "")
    elif bfcl_type in ("array", "tuple") and spec.get("items", {}).get("type") == "dict":
        ok = any(
            isinstance(o, list) and len(o) == len(value) and all(_dict_matches(v, d) for v, d in zip(value, o, strict=True))
            for o in options
        )
    elif bfcl_type == "string" or bfcl_type in ("array", "tuple"):
        ok = _norm(value) in [_norm(o) for o in options if o != "" or bfcl_type == "string"]
    else:
        ok = value in [o for o in options if o != ""]
    return None if ok else f"{param}: {value!r} is not one of {options!r}"


def check_call(
    doc: dict[str, Any], expected: dict[str, dict[str, list[Any]]], name: str, arguments: dict[str, Any]
) -> str | None:
    """Why the call ``name(**arguments)`` does not match ``expected`` (``{name: {param: options}}``)."""
    (expected_name, allowed), = expected.items()
    if name != expected_name:
        return f"expected a call to {expected_name!r}, got {name!r}"
    props = doc.get("parameters", {}).get("properties", {})
    for param in doc.get("parameters", {}).get("required", []):
        if param not in arguments:
            return f"{name}: missing required parameter {param!r}"
    for param, value in arguments.items():
        if param not in props or param not in allowed:
            return f"{name}: unexpected parameter {param!r}"
        err = check_value(param, props[param], value, allowed[param])
        if err:
            return f"{name}: {err}"
    for param, options in allowed.items():
        if param not in arguments and "" not in options:
            return f"{name}: parameter {param!r} is missing"
    return None


def _perfect_matching(ok: list[list[bool]]) -> bool:
    """Whether every row can be given its own column with ok[row][col] (Kuhn's augmenting paths)."""
    owner: dict[int, int] = {}

    def augment(row: int, seen: set[int]) -> bool:
        for col, good in enumerate(ok[row]):
            if good and col not in seen:
                seen.add(col)
                if col not in owner or augment(owner[col], seen):
                    owner[col] = row
                    return True
        return False

    return all(augment(r, set()) for r in range(len(ok)))


def check_calls(
    calls: list[tuple[str, dict[str, Any]]], answer: list[dict[str, Any]], functions: list[dict[str, Any]]
) -> CheckResult:
    """Whether ``calls`` (``[(name, arguments), ...]``) match the ground truth ``answer`` order-free.

    Args:
        calls: the model's decoded calls.
        answer: BFCL's ``ground_truth``: one ``{name: {param: [allowed values]}}`` per expected call.
        functions: the entry's BFCL function docs (for types and required parameters).
    """
    if len(calls) != len(answer):
        return CheckResult(False, f"expected {len(answer)} call(s), got {len(calls)}")
    docs = {f["name"]: f for f in functions}
    errors: list[list[str | None]] = [
        [check_call(docs.get(next(iter(exp)), {}), exp, name, args) for exp in answer] for name, args in calls
    ]
    if _perfect_matching([[e is None for e in row] for row in errors]):
        return CheckResult(True)
    if len(calls) == 1:
        return CheckResult(False, str(errors[0][0]))
    for j, exp in enumerate(answer):
        if all(row[j] is not None for row in errors):
            return CheckResult(False, f"no call matches expected call {j} ({next(iter(exp))}): {errors[0][j]}")
    return CheckResult(False, "the calls match expected calls only in overlapping ways")
