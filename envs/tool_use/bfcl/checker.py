"""Matching a model's function calls against BFCL's ``possible_answer``, rule for rule as BFCL does.

Our own implementation of the rules of BFCL's AST checker for Python-typed functions (Patil et al.,
"The Berkeley Function Calling Leaderboard", ICML 2025; ``bfcl_eval/eval_checker/ast_eval/
ast_checker.py`` of bfcl-eval 2026.3.23). ``tests/test_bfcl_fidelity.py`` scores the same candidate
outputs with BFCL's own functions and with ToolUse-v0 and asserts the same verdict on every one.

Calls

* The number of calls equals the number of expected calls. A call matches an expected call when its
  name is the expected name (exactly) and its parameters pass the rules below.
* Several expected calls (the ``parallel`` categories): by default BFCL's greedy pass -- expected
  calls are taken in order and each claims the first not yet claimed call that matches it. A greedy
  claim can take the one call a later expected call needed although a valid assignment exists
  (``parallel_178``); ``matching="optimal"`` accepts whenever a one-to-one assignment exists (Kuhn's
  augmenting paths). That is a documented option, not BFCL's score.

Parameters of one call

* every ``required`` parameter of the function doc is given; every given parameter is in the doc and
  in the answer; every parameter of the answer that is not given lists ``""`` (BFCL's mark for "may
  be omitted") among its allowed values.

Types (doc type -> Python type: ``string`` and ``any`` -> str, ``integer`` -> int, ``float`` ->
float, ``boolean`` -> bool, ``array``/``tuple`` -> list, ``dict`` -> dict; exact types, so ``True``
is not an integer)

* an ``int`` given for a ``float`` parameter is converted -- at the top level only, not for the items
  of an array;
* a value of another type than the doc's is accepted when it has the type of the answer's first
  allowed value (not ``""``): BFCL writes a variable name as a string where the doc says integer.
  Whenever that first allowed value's type is not the doc's, the parameter is such a "variable" and
  its value is compared with ``==``, without normalisation;
* array items have the item type or the type of the first item of an allowed list; an allowed value
  that is not a list (``""`` included) waives the item check. Deeper levels are not type-checked.

Values (when not a variable)

* strings -- ``any`` included -- compare after :func:`normalise_string` with the allowed strings;
  ``""`` is among them, so an empty string passes where the parameter may be omitted;
* arrays: string items normalised (one level deep), compared with each allowed list normalised the
  same way; ``""`` counts as an empty list, so ``[]`` passes where the parameter may be omitted;
* dicts: match one allowed dict key by key -- every given key allowed, string values normalised, other
  values (lists too) compared with ``==``, every key not given allowing ``""``;
* arrays of dicts: as long as an allowed list, each dict matching the allowed dict at its position
  (``""`` allows ``[]``);
* anything else: ``==`` with one of the allowed values (Python's ``==``: ``1 == 1.0``).

Where BFCL's own code raises (inputs outside what its data exercise: a doc type it does not map, an
array doc without ``items``, a non-dict item where dicts are expected), the call does not match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# BFCL's PYTHON_TYPE_MAPPING: "any" is checked as a string.
_PY_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
_ARRAYS = ("array", "tuple")
_STRIP = re.compile(r"[ ,./\-_*^]")
MATCHING = ("bfcl", "optimal")


@dataclass(frozen=True)
class CheckResult:
    """``valid``, and when not valid a one-line ``error`` saying which call/parameter failed."""

    valid: bool
    error: str = ""


def normalise_string(s: str) -> str:
    """BFCL's string normalisation: spaces and ``,./-_*^`` dropped, lower case, ``'`` -> ``"``
    ("April 1, 2024" and "april 1 2024" compare equal)."""
    return _STRIP.sub("", s).lower().replace("'", '"')


def _std(value: Any) -> Any:
    return normalise_string(value) if type(value) is str else value


def _std_items(seq: list[Any] | str) -> list[Any]:
    # BFCL indexes allowed values positionally, so an allowed string is read as its characters
    # (and "" as the empty list).
    return [_std(v) for v in seq]


def _first_type(options: Any) -> type | None:
    """The type of the first allowed value that is not ``""`` (the answer's type), or None."""
    return next((type(o) for o in options if o != ""), None)


def _items_ok(value: list[Any], option: Any, item_type: type) -> bool:
    if type(option) is not list:  # "" or a variable name: no item check against this option
        return True
    option_item_type = _first_type(option)
    return all(type(v) is item_type or type(v) is option_item_type for v in value)


def _dict_matches(value: Any, option: Any) -> bool:
    if type(value) is not dict or type(option) is not dict:
        return False
    for key, v in value.items():
        if key not in option or type(option[key]) not in (list, str):
            return False
        if _std(v) not in _std_items(option[key]):
            return False
    return all(key in value or "" in allowed for key, allowed in option.items())


def _list_of_dicts_matches(value: list[Any], option: Any) -> bool:
    if type(option) not in (list, str) or len(option) != len(value):
        return False
    return all(o != "" and _dict_matches(v, o) for v, o in zip(value, option, strict=True))


def check_value(param: str, spec: dict[str, Any], value: Any, options: list[Any]) -> str | None:
    """Why ``value`` is not an allowed value of ``param`` (None when it is).

    Args:
        param: the parameter's name (for the message).
        spec: the parameter's BFCL doc (``{"type": "float", ...}``).
        value: the decoded JSON value the model gave.
        options: the allowed values from ``possible_answer`` (``""`` = may be omitted).
    """
    bfcl_type = spec.get("type")
    expected = _PY_TYPES.get(bfcl_type)
    if expected is None:
        return f"{param}: the doc's type {bfcl_type!r} is not one BFCL checks"
    item_type = None
    if bfcl_type in _ARRAYS:
        item_type = _PY_TYPES.get(spec.get("items", {}).get("type"))
        if item_type is None:
            return f"{param}: the doc gives no item type BFCL checks"
    if bfcl_type == "float" and type(value) is int:
        value = float(value)
    answer_type = _first_type(options)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if item_type is not None and not any(_items_ok(value, o, item_type) for o in options):
            return f"{param}: items must be {spec['items']['type']} (or as in the answer), got {value!r}"
    elif answer_type is not None and type(value) is answer_type:
        is_variable = True
    else:
        return f"{param}: expected type {bfcl_type}, got {type(value).__name__} ({value!r})"

    if is_variable:
        ok = value in options
    elif expected is dict:
        ok = any(_dict_matches(value, o) for o in options if o != "")
    elif expected is list and item_type is dict:
        ok = any(_list_of_dicts_matches(value, o) for o in options)
    elif expected is str:
        ok = normalise_string(value) in [normalise_string(o) for o in options if type(o) is str]
    elif expected is list:
        ok = _std_items(value) in [_std_items(o) for o in options if type(o) in (list, str)]
    else:
        ok = value in options
    return None if ok else f"{param}: {value!r} is not one of {options!r}"


def check_call(
    doc: dict[str, Any] | None, expected: dict[str, dict[str, list[Any]]], name: str, arguments: dict[str, Any]
) -> str | None:
    """Why the call ``name(**arguments)`` does not match ``expected`` (``{name: {param: options}}``).

    Args:
        doc: the BFCL function doc of the expected function (None: the entry has none).
    """
    (expected_name, allowed), = expected.items()
    if doc is None:
        return f"the entry has no function doc for {expected_name!r}"
    if name != expected_name:
        return f"expected a call to {expected_name!r}, got {name!r}"
    params = doc.get("parameters", {})
    props = params.get("properties", {})
    for param in params.get("required", []):
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


def _greedy_matching(ok: list[list[bool]]) -> int | None:
    """BFCL's pass: expected call j (a column) claims the first unclaimed call (row) that matches it.
    Returns the first expected call left without one, or None when all are matched."""
    claimed: set[int] = set()
    for col in range(len(ok[0]) if ok else 0):
        row = next((r for r in range(len(ok)) if r not in claimed and ok[r][col]), None)
        if row is None:
            return col
        claimed.add(row)
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
    calls: list[tuple[str, dict[str, Any]]],
    answer: list[dict[str, Any]],
    functions: list[dict[str, Any]],
    matching: str = "bfcl",
) -> CheckResult:
    """Whether ``calls`` (``[(name, arguments), ...]``) match the ground truth ``answer``.

    Args:
        calls: the model's decoded calls.
        answer: BFCL's ``ground_truth``: one ``{name: {param: [allowed values]}}`` per expected call.
        functions: the entry's BFCL function docs (for types and required parameters).
        matching: ``"bfcl"`` (BFCL's greedy in-order pass, the official score) or ``"optimal"``
            (accept when any one-to-one assignment of calls to expected calls exists).

    Raises:
        ValueError: an unknown ``matching``.
    """
    if matching not in MATCHING:
        raise ValueError(f"matching must be one of {MATCHING}, got {matching!r}")
    if len(calls) != len(answer):
        return CheckResult(False, f"expected {len(answer)} call(s), got {len(calls)}")
    docs: dict[str, dict[str, Any]] = {}
    for f in functions:  # BFCL takes the first doc of a name
        docs.setdefault(f["name"], f)
    errors: list[list[str | None]] = [
        [check_call(docs.get(next(iter(exp))), exp, name, args) for exp in answer] for name, args in calls
    ]
    ok = [[e is None for e in row] for row in errors]
    if len(calls) == 1:
        return CheckResult(ok[0][0], errors[0][0] or "")
    if matching == "optimal":
        if _perfect_matching(ok):
            return CheckResult(True)
        unmatched = next((j for j in range(len(answer)) if not any(row[j] for row in ok)), None)
        if unmatched is None:
            return CheckResult(False, "the calls match expected calls only in overlapping ways")
    else:
        unmatched = _greedy_matching(ok)
        if unmatched is None:
            return CheckResult(True)
    exp = answer[unmatched]
    errs = [row[unmatched] for row in errors if row[unmatched]]
    if len(errs) < len(calls):  # some call matches it, but an earlier expected call claimed it
        why = "the calls that match it were claimed by earlier expected calls (BFCL's greedy pass)"
    else:
        why = str(errs[0])
    return CheckResult(False, f"no call matches expected call {unmatched} ({next(iter(exp))}): {why}")
