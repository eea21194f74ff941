"""BFCL's executable multi-turn backends: per-episode instances, ground-truth calls, state comparison.

The backends (a toy file system, a trading bot, a travel API, ...) are the Python classes shipped in
``bfcl_eval/eval_checker/multi_turn_eval/func_source_code``. Every episode gets fresh instances loaded
with the entry's ``initial_config`` (deep-copied); the ground truth runs on a second, separate set.
Ground-truth calls are BFCL's strings (``"mv(source='a.txt', destination='tmp')"``); they are parsed
with :mod:`ast` and their arguments read with ``ast.literal_eval`` — nothing is ``eval``-ed.

The turn check follows BFCL's multi-turn checker (Patil et al., ICML 2025, section "multi-turn"):
after each user turn the public attributes of every backend equal those of the ground-truth backend
(state check), every result of the turn's ground-truth calls is among the results of the model's calls
so far (response check, order-free, with repeats), a turn with ground-truth calls saw at least one
model call, and a turn without ground-truth calls (a missing parameter or function) saw none.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from collections import Counter
from typing import Any

from chatgym.envs.tool_use.bfcl.data import multi_turn_docs

_PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
# class -> (module, function-doc file); the classes the multi_turn_* categories use.
BACKENDS: dict[str, tuple[str, str]] = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
_STATELESS = {"MathAPI"}


def make_backends(classes: list[str], initial_config: dict[str, Any], long_context: bool) -> dict[str, Any]:
    """Fresh backend instances ``{class name: instance}`` loaded with (a copy of) ``initial_config``.

    Raises:
        KeyError: a class BFCL's multi-turn categories do not use.
    """
    out = {}
    for name in classes:
        module, _ = BACKENDS[name]
        instance = getattr(importlib.import_module(f"{_PREFIX}.{module}"), name)()
        if name not in _STATELESS:
            instance._load_scenario(copy.deepcopy(initial_config.get(name, {})), long_context=long_context)
        out[name] = instance
    return out


def methods(backends: dict[str, Any]) -> dict[str, Any]:
    """Public bound methods of the backends by name (a later class wins a clash, as in BFCL)."""
    out = {}
    for instance in backends.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                out[name] = method
    return out


def function_docs(classes: list[str]) -> list[dict[str, Any]]:
    """The BFCL function docs of the backends' tools, in doc-file order."""
    return [doc for name in classes for doc in multi_turn_docs(BACKENDS[name][1])]


def parse_call(text: str) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """``"f(1, x='a')"`` -> ``("f", (1,), {"x": "a"})``; arguments must be Python literals.

    Raises:
        ValueError: not a single call of a plain name with literal arguments.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a call: {text!r} ({exc.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a call of a function name: {text!r}")
    args = tuple(ast.literal_eval(a) for a in node.args)
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    return node.func.id, args, kwargs


def format_result(value: Any) -> str:
    """A backend's return value as text, as BFCL records it (dicts as JSON when they serialise)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def call_method(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Run one backend method; its exceptions become a result string (as in BFCL), never raise."""
    try:
        return format_result(method(*args, **kwargs))
    except Exception as exc:
        return f"Error during execution: {exc}"


def keyword_arguments(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Positional arguments of a ground-truth call bound to their parameter names (for a tool call).

    Raises:
        TypeError: the arguments do not fit the method's signature.
    """
    return dict(inspect.signature(method).bind(*args, **kwargs).arguments)


def state(backends: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The public attributes of each backend (what BFCL's state check compares)."""
    return {name: {k: v for k, v in vars(b).items() if not k.startswith("_")} for name, b in backends.items()}


def state_differences(model: dict[str, Any], truth: dict[str, Any]) -> list[str]:
    """Attributes ``class.attr`` whose values differ between two backend sets (empty when equal)."""
    diffs = []
    for name, gt in truth.items():
        for attr, value in vars(gt).items():
            if not attr.startswith("_") and getattr(model[name], attr, None) != value:
                diffs.append(f"{name}.{attr}")
    return diffs


def missing_results(truth_results: list[str], model_results: list[str]) -> list[str]:
    """Ground-truth results not found among the model's (a multiset difference)."""
    return list((Counter(truth_results) - Counter(model_results)).elements())
