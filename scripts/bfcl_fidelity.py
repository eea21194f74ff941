"""Score the same candidate outputs with ToolUse-v0 and with BFCL's own evaluation functions.

Candidates are the ground truth of every single-turn BFCL entry and systematic mutations of it (each
allowed alternative value, a parameter dropped / added / given a value of another type, case and
punctuation changes, int <-> float inside arrays, empty values, dict keys dropped or added, calls
reversed / duplicated / dropped / renamed, malformed arguments), plus no-call, call and malformed-call
replies for the irrelevance categories. Each candidate is an assistant message with OpenAI-style
``tool_calls`` (arguments as JSON text, as a server sends them), or a text reply without calls.

BFCL's side (bfcl-eval 2026.3.23, installed ``--no-deps``):

* ``bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker`` scores the decoded calls, and
  ``bfcl_eval.utils.is_function_calling_format_output`` / ``is_empty_output`` decide the format and
  "no call" questions -- BFCL's functions, imported and called as they are.
* ``ast_checker`` imports ``bfcl_eval.constants.model_config`` only for its model registry, which
  imports every model handler and their SDKs (not installed here). The checker reads one field of it,
  ``underscore_to_dot`` (whether an API model saw "." in function names replaced by "_"). Where the
  real registry does not import, a stand-in registry with one model, :data:`MODEL` (underscore_to_dot
  False: ToolUse-v0 offers the names unchanged), takes its place.
* The decode step is BFCL's function-calling handlers' (``OpenAICompletionsHandler.decode_ast``):
  ``[{name: json.loads(arguments)}, ...]``; an exception there is "undecodable". The orchestration
  is ``eval_runner._evaluate_single_relevance_entry`` / ``_evaluate_single_ast_entry`` (eval_runner
  needs pandas and the handlers, so its few lines of control flow are restated in
  :func:`bfcl_score`): irrelevance passes when decoding fails or gives an empty output; an AST entry
  fails when decoding fails or the output is not in call format, else ``ast_checker`` decides.
  Where BFCL's checker raises (inputs its code does not handle), the candidate counts as 0 and is
  reported.

Run (prints agreement per category; ``--every N`` takes the candidates of every N-th entry)::

    .venv/bin/python scripts/bfcl_fidelity.py [--every 1] [--show 5] [--matching bfcl]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

AST_CATEGORIES = [
    "simple", "multiple", "parallel", "parallel_multiple",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
]
IRRELEVANCE_CATEGORIES = ["irrelevance", "live_irrelevance"]
CATEGORIES = AST_CATEGORIES + IRRELEVANCE_CATEGORIES
MODEL = "chatgym"
MALFORMED = '{"x": 1,}'  # a trailing comma: not JSON


@dataclass(frozen=True)
class Candidate:
    """One reply to score: ``calls`` is a tuple of ``(name, arguments JSON text)``, or None for a
    text reply without calls."""

    category: str
    index: int
    task_id: str
    mutation: str
    calls: tuple[tuple[str, str], ...] | None

    def message(self) -> dict[str, Any]:
        if self.calls is None:
            return {"role": "assistant", "content": "None of the functions fit this request."}
        tool_calls = [
            {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(self.calls)
        ]
        return {"role": "assistant", "content": "", "tool_calls": tool_calls}


@cache
def load_bfcl() -> types.SimpleNamespace:
    """BFCL's ``ast_checker``, ``Language`` and the output-format checks (see the module docstring).

    Raises:
        ImportError: bfcl-eval is not installed.
    """
    if importlib.util.find_spec("bfcl_eval") is None:
        raise ImportError("needs bfcl-eval: pip install --no-deps bfcl-eval==2026.3.23")
    registry = "bfcl_eval.constants.model_config"
    # The real registry imports every handler; they need tree_sitter (and the model SDKs).
    if registry not in sys.modules and importlib.util.find_spec("tree_sitter") is None:
        stand_in = types.ModuleType(registry)
        stand_in.MODEL_CONFIG_MAPPING = {}  # stand-in registry (see the module docstring)
        sys.modules[registry] = stand_in
    from bfcl_eval.eval_checker.ast_eval import ast_checker as module

    module.MODEL_CONFIG_MAPPING.setdefault(MODEL, types.SimpleNamespace(underscore_to_dot=False))
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

    return types.SimpleNamespace(
        ast_checker=module.ast_checker,
        language=Language.PYTHON,
        is_empty_output=is_empty_output,
        is_function_calling_format_output=is_function_calling_format_output,
    )


def bfcl_decode(calls: tuple[tuple[str, str], ...] | None) -> list[dict[str, Any]]:
    """BFCL's function-calling decode: ``[{name: json.loads(arguments)}]`` (raises when undecodable)."""
    return [{name: json.loads(args)} for name, args in calls or ()]


def bfcl_score(entry: dict[str, Any], category: str, cand: Candidate) -> tuple[float, str]:
    """BFCL's verdict on ``cand`` and, when its checker raised, the exception (else "")."""
    bfcl = load_bfcl()
    try:
        decoded = bfcl_decode(cand.calls)
    except Exception:
        decoded = None
    if category in IRRELEVANCE_CATEGORIES:
        contains_call = decoded is not None and not bfcl.is_empty_output(decoded)
        return float(not contains_call), ""
    if decoded is None or not bfcl.is_function_calling_format_output(decoded):
        return 0.0, ""
    from chatgym.envs.tool_use.bfcl.data import CATEGORIES as STEMS

    stem = STEMS[category][0]  # BFCL's category name ("simple_python"): ast_checker dispatches on it
    try:
        out = bfcl.ast_checker(
            copy.deepcopy(entry["function"]), decoded, copy.deepcopy(entry["ground_truth"]), bfcl.language, stem, MODEL
        )
    except Exception as exc:
        return 0.0, f"{type(exc).__name__}: {exc}"
    return float(bool(out["valid"])), ""


# ---- candidates ---------------------------------------------------------------------------------


def _value_mutations(value: Any) -> Iterator[tuple[str, Any]]:
    """Values near ``value``: another type, another case or punctuation, empty, changed items."""
    if isinstance(value, bool):
        yield "bool_flipped", not value
        yield "bool_as_int", int(value)
        yield "bool_as_str", str(value).lower()
    elif isinstance(value, int):
        yield "int_as_float", float(value)
        yield "int_as_str", str(value)
        yield "int_plus_one", value + 1
        yield "int_as_bool", bool(value)
    elif isinstance(value, float):
        yield "float_as_int", int(value)
        yield "float_as_str", str(value)
        yield "float_changed", value + 0.5
    elif isinstance(value, str):
        yield "str_upper", value.upper()
        yield "str_punctuated", f" {value.replace(' ', '-')}."
        yield "str_changed", value + "x"
        yield "str_empty", ""
        yield "str_as_list", [value]
        yield "str_as_int", 7
    elif isinstance(value, list):
        yield "list_empty", []
        yield "list_reversed", value[::-1]
        yield "list_as_str", json.dumps(value)
        if value:
            yield "list_extra_item", [*value, value[-1]]
            yield "list_items_retyped", [_retype(v) for v in value]
            yield "list_items_upper", [v.upper() if isinstance(v, str) else v for v in value]
            yield "list_nested", [value]
    elif isinstance(value, dict):
        yield "dict_empty", {}
        yield "dict_extra_key", {**value, "zz_extra": 1}
        yield "dict_as_str", json.dumps(value)
        if value:
            first = next(iter(value))
            yield "dict_key_dropped", {k: v for k, v in value.items() if k != first}
            yield "dict_values_mutated", {k: _retype(v) for k, v in value.items()}
    elif value is None:
        yield "none_as_str", "None"


def _retype(v: Any) -> Any:
    """One step off: int <-> float, strings upper-cased, lists' items retyped, dict values retyped."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return float(v)
    if isinstance(v, float):
        return int(v) if v.is_integer() else v
    if isinstance(v, str):
        return v.upper()
    if isinstance(v, list):
        return [_retype(x) for x in v]
    if isinstance(v, dict):
        return {k: _retype(x) for k, x in v.items()}
    return v


def _empty_like(spec: dict[str, Any]) -> Any:
    return {"string": "", "array": [], "tuple": [], "dict": {}, "integer": 0, "float": 0.0, "boolean": False}.get(
        spec.get("type", "any"), ""
    )


def _dump(args: dict[str, Any]) -> str:
    return json.dumps(args, ensure_ascii=False)


def ast_candidates(category: str, index: int, entry: dict[str, Any]) -> Iterator[Candidate]:
    """The ground truth of an AST entry and its mutations (see the module docstring)."""
    from chatgym.envs.tool_use.env import _concrete_dict, reference_calls

    truth = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reference_calls(entry["ground_truth"], entry["function"])]
    docs = {f["name"]: f for f in reversed(entry["function"])}

    def make(mutation: str, calls: list[tuple[str, Any]]) -> Candidate:
        encoded = tuple((n, a if isinstance(a, str) else _dump(a)) for n, a in calls)
        return Candidate(category, index, entry["id"], mutation, encoded)

    yield make("ground_truth", truth)
    yield Candidate(category, index, entry["id"], "no_call", None)
    yield make("malformed_arguments", [(truth[0][0], MALFORMED), *truth[1:]])
    yield make("arguments_array", [(truth[0][0], "[1]"), *truth[1:]])
    yield make("arguments_double_encoded", [(truth[0][0], json.dumps(_dump(truth[0][1]))), *truth[1:]])
    yield make("name_changed", [(truth[0][0] + "_x", truth[0][1]), *truth[1:]])
    yield make("call_duplicated", [*truth, truth[-1]])
    if len(truth) > 1:
        yield make("calls_reversed", truth[::-1])
        yield make("call_dropped", truth[:-1])
    for k, (name, args) in enumerate(truth):
        expected = next(iter(entry["ground_truth"][k].values()))
        props = docs.get(name, {}).get("parameters", {}).get("properties", {})

        def with_args(new: dict[str, Any], k: int = k, name: str = name) -> list[tuple[str, Any]]:
            return [*truth[:k], (name, new), *truth[k + 1 :]]

        yield make(f"call{k}:extra_param", with_args({**args, "zz_extra": 1}))
        for param, options in expected.items():
            spec = props.get(param, {})
            if param in args:
                yield make(f"call{k}:{param}:dropped", with_args({p: v for p, v in args.items() if p != param}))
                for label, new in _value_mutations(args[param]):
                    yield make(f"call{k}:{param}:{label}", with_args({**args, param: new}))
            else:  # an omittable parameter: give its empty value and its allowed values
                yield make(f"call{k}:{param}:empty", with_args({**args, param: _empty_like(spec)}))
            for j, option in enumerate(options):
                if option == "" or (param in args and j == 0):
                    continue
                if isinstance(option, dict):
                    option = _concrete_dict(option)
                elif isinstance(option, list) and option and all(isinstance(d, dict) for d in option):
                    option = [_concrete_dict(d) for d in option]
                yield make(f"call{k}:{param}:option{j}", with_args({**args, param: option}))
        for param, spec in props.items():
            if param not in expected:  # in the doc, not in the answer
                yield make(f"call{k}:{param}:unexpected", with_args({**args, param: _empty_like(spec) or 1}))


def irrelevance_candidates(category: str, index: int, entry: dict[str, Any]) -> Iterator[Candidate]:
    """No call, malformed calls, and real calls for an irrelevance entry."""

    def make(mutation: str, calls: tuple[tuple[str, str], ...] | None) -> Candidate:
        return Candidate(category, index, entry["id"], mutation, calls)

    name = entry["function"][0]["name"] if entry["function"] else "search"
    required = entry["function"][0]["parameters"].get("required", []) if entry["function"] else []
    props = entry["function"][0]["parameters"].get("properties", {}) if entry["function"] else {}
    filled = _dump({p: _empty_like(props.get(p, {})) or "x" for p in required})
    yield make("no_call", None)
    yield make("no_calls_list", ())
    yield make("call_empty_arguments", ((name, "{}"),))
    yield make("call_filled", ((name, filled),))
    yield make("malformed_arguments", ((name, MALFORMED),))
    yield make("arguments_array", ((name, "[1]"),))
    yield make("arguments_double_encoded", ((name, json.dumps(filled)),))
    yield make("malformed_then_call", ((name, MALFORMED), (name, filled)))
    yield make("two_calls", ((name, filled), (name, "{}")))


def candidates(category: str, entries: Any) -> Iterator[Candidate]:
    make = irrelevance_candidates if category in IRRELEVANCE_CATEGORIES else ast_candidates
    for index, entry in enumerate(entries):
        yield from make(category, index, entry)


# ---- comparison -------------------------------------------------------------------------------


@dataclass
class Tally:
    agree: int = 0
    total: int = 0
    bfcl_raised: int = 0
    disagreements: list[tuple[Candidate, float, float]] | None = None

    @property
    def rate(self) -> float:
        return self.agree / self.total if self.total else 1.0


def chatgym_score(env: Any, cand: Candidate) -> float:
    env.reset(options={"task_index": cand.index})
    return env.step(cand.message())[1]


def compare(category: str, every: int = 1, **env_kwargs: Any) -> Tally:
    """Agreement of ToolUse-v0 (``env_kwargs`` passed to it) with BFCL on all the candidates of every
    ``every``-th entry (whole entries: building an entry's tools is the slow part of a reset)."""
    from chatgym.envs.tool_use.env import ToolUseEnv

    env = ToolUseEnv(category=category, **env_kwargs)
    tally = Tally(disagreements=[])
    try:
        for cand in candidates(category, env.tasks):
            if cand.index % every:
                continue
            theirs, raised = bfcl_score(env.tasks[cand.index], category, cand)
            ours = chatgym_score(env, cand)
            tally.total += 1
            tally.bfcl_raised += bool(raised)
            if ours == theirs:
                tally.agree += 1
            else:
                tally.disagreements.append((cand, ours, theirs))
    finally:
        env.close()
    return tally


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--every", type=int, default=1, help="score every N-th entry's candidates (default: all)")
    ap.add_argument("--show", type=int, default=3, help="disagreements to print per category")
    ap.add_argument("--matching", default=None, help="ToolUse-v0's parallel_matching (default: its default)")
    ap.add_argument("categories", nargs="*", default=CATEGORIES)
    args = ap.parse_args(argv)
    kwargs = {"parallel_matching": args.matching} if args.matching else {}
    agree = total = 0
    print(f"{'category':<24}{'agree':>8}{'total':>8}{'rate':>10}{'bfcl raised':>13}")
    for category in args.categories:
        t = compare(category, args.every, **kwargs)
        agree, total = agree + t.agree, total + t.total
        print(f"{category:<24}{t.agree:>8}{t.total:>8}{100 * t.rate:>9.2f}%{t.bfcl_raised:>13}")
        for cand, ours, theirs in t.disagreements[: args.show]:
            print(f"    {cand.task_id} {cand.mutation}: chatgym {ours} bfcl {theirs} {cand.calls}"[:400])
    print(f"{'all':<24}{agree:>8}{total:>8}{100 * agree / max(total, 1):>9.2f}%")
    return 0 if agree == total else 1


if __name__ == "__main__":
    sys.exit(main())
