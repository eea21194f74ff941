"""ToolUse-v0 scores as BFCL's own evaluation functions do, rule for rule.

BFCL's side is bfcl-eval's ``ast_checker`` and ``is_empty_output`` / ``is_function_calling_format_output``,
imported from the installed package by ``scripts/bfcl_fidelity.py`` (which says what it stands in
for: BFCL's model registry, whose imports need every model SDK). Every rule is checked on hand-made
inputs against BFCL's verdict *and* a value written here; then on the systematic candidates (ground
truths and mutations of every single-turn entry): a sample in the default suite, all under ``slow``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs.tool_use.bfcl import check_calls
from chatgym.envs.tool_use.env import ToolUseEnv

pytest.importorskip("bfcl_eval", reason="needs bfcl-eval (scripts/setup.sh installs it)")

_spec = importlib.util.spec_from_file_location("bfcl_fidelity", Path(__file__).parents[1] / "scripts" / "bfcl_fidelity.py")
fidelity = importlib.util.module_from_spec(_spec)
sys.modules["bfcl_fidelity"] = fidelity  # dataclasses look their module up there
_spec.loader.exec_module(fidelity)


def bfcl_valid(functions, calls, answer, category="simple_python") -> bool:
    """BFCL's own ast_checker on decoded calls ``[(name, args)]``."""
    bfcl = fidelity.load_bfcl()
    decoded = [{name: args} for name, args in calls]
    return bool(bfcl.ast_checker(functions, decoded, answer, bfcl.language, category, fidelity.MODEL)["valid"])


def doc(**props):
    return [{"name": "f", "description": "", "parameters": {"type": "dict", "properties": props, "required": []}}]


# (rule, param doc, allowed values, given value, right verdict). The right verdict is BFCL's, read
# from its ast_checker; the comment says why.
RULES = [
    # int -> float at the top level only
    ("int for float", {"type": "float"}, [5.0], 5, True),
    ("int items in a float array", {"type": "array", "items": {"type": "float"}}, [[1.0, 3.0]], [1, 3], False),
    ("float items in a float array", {"type": "array", "items": {"type": "float"}}, [[1.0, 3.0]], [1.0, 3.0], True),
    # ...unless the allowed list's first item is an int: its type counts as the item type
    ("int items, int answer", {"type": "array", "items": {"type": "float"}}, [[1, 3]], [1, 3], True),
    # an omittable ("" first) allowed value waives the item type check; the value check still runs
    ("item check waived by ''", {"type": "array", "items": {"type": "float"}}, ["", [1, 3]], [1, 3], True),
    ("float for int", {"type": "integer"}, [5], 5.0, False),
    ("bool for int", {"type": "integer"}, [1], True, False),
    ("str for int", {"type": "integer"}, [5], "5", False),
    # `any` is checked as a string: case and punctuation normalised
    ("any, other case", {"type": "any"}, ["my_data"], "MY_DATA", True),
    ("any, int for str answer", {"type": "any"}, ["5"], 5, False),
    ("any, int answer", {"type": "any"}, [5], 5, True),  # the answer's type (int) makes it a variable
    # strings: spaces and ,./-_*^ dropped, lower case
    ("string normalised", {"type": "string"}, ["April 1, 2024"], "april 1 2024", True),
    ("string changed", {"type": "string"}, ["April 1, 2024"], "April 2, 2024", False),
    # empty values: "" marks "may be omitted", and an empty string / list then passes
    ("empty string, omittable", {"type": "string"}, ["", "x"], "", True),
    ("empty string, required", {"type": "string"}, ["x"], "", False),
    ("empty list, omittable", {"type": "array", "items": {"type": "integer"}}, ["", [1]], [], True),
    ("empty list, required", {"type": "array", "items": {"type": "integer"}}, [[1]], [], False),
    ("empty dict, omittable keys", {"type": "dict", "properties": {}}, [{"a": ["", 1]}], {}, True),
    ("empty dict, needed key", {"type": "dict", "properties": {}}, [{"a": [1]}], {}, False),
    (
        "empty list of dicts, omittable",
        {"type": "array", "items": {"type": "dict"}},
        ["", [{"a": [1]}]],
        [],
        True,
    ),
    # normalisation is one level deep: list items yes, items of nested lists no; dict string values
    # yes, lists inside dicts no
    ("list items normalised", {"type": "array", "items": {"type": "string"}}, [["New York"]], ["new-york"], True),
    (
        "nested list items not normalised",
        {"type": "array", "items": {"type": "array"}},
        [[["a"]]],
        [["A"]],
        False,
    ),
    ("dict string value normalised", {"type": "dict", "properties": {}}, [{"k": ["Big Apple"]}], {"k": "big-apple"}, True),
    ("list in a dict not normalised", {"type": "dict", "properties": {}}, [{"k": [["a"]]}], {"k": ["A"]}, False),
    ("dict with an unknown key", {"type": "dict", "properties": {}}, [{"k": [1]}], {"k": 1, "z": 1}, False),
    # a variable: the answer's type differs from the doc's; compared as is (no normalisation)
    ("variable", {"type": "integer"}, ["n"], "n", True),
    ("variable, other case", {"type": "integer"}, ["n"], "N", False),
    ("list order matters", {"type": "array", "items": {"type": "integer"}}, [[1, 2]], [2, 1], False),
]


@pytest.mark.parametrize(("spec", "options", "value", "right"), [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_value_rule_matches_bfcl(spec, options, value, right):
    functions, answer = doc(x=spec), [{"f": {"x": options}}]
    assert bfcl_valid(functions, [("f", {"x": value})], answer) is right
    assert check_calls([("f", {"x": value})], answer, functions).valid is right


@pytest.mark.parametrize(
    ("index", "call", "right"),
    [
        # the issue's examples on the real entries: doc `interval` is an array of float
        (13, {"name": "calculate_area_under_curve", "arguments": {"function": "x**2", "interval": [1, 3]}}, 0.0),
        (13, {"name": "calculate_area_under_curve", "arguments": {"function": "x**2", "interval": [1.0, 3.0]}}, 1.0),
        # `data` is typed any, the answer "my_data": compared as a string, case-insensitively
        (109, {"name": "random_forest.train", "arguments": {"n_estimators": 100, "max_depth": 5, "data": "MY_DATA"}}, 1.0),
        (109, {"name": "random_forest.train", "arguments": {"n_estimators": 100, "max_depth": 5, "data": "my_data2"}}, 0.0),
    ],
)
def test_issue_examples_on_the_real_entries(index, call, right):
    env = ToolUseEnv(category="simple")
    entry = env.tasks[index]
    assert bfcl_valid(entry["function"], [(call["name"], call["arguments"])], entry["ground_truth"]) is bool(right)
    env.reset(options={"task_index": index})
    text = f"<tool_call>{json.dumps(call)}</tool_call>"
    assert env.step(text)[1] == right
    env.close()


def test_call_rules_match_bfcl():
    functions = [
        {
            "name": "f",
            "description": "",
            "parameters": {
                "type": "dict",
                "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "string"}},
                "required": ["a"],
            },
        }
    ]
    answer = [{"f": {"a": [1], "b": ["x", ""]}}]
    cases = [
        ([("f", {"a": 1})], True),  # b may be omitted
        ([("f", {"a": 1, "b": "X"})], True),
        ([("f", {"b": "x"})], False),  # required a missing
        ([("f", {"a": 1, "c": "y"})], False),  # c is in the doc but not in the answer
        ([("f", {"a": 1, "d": 1})], False),  # d is in neither
        ([("g", {"a": 1})], False),  # another name
        ([("f", {"a": 1}), ("f", {"a": 1})], False),  # one call too many
        ([], False),
    ]
    for calls, right in cases:
        assert bfcl_valid(functions, calls, answer) is right, calls
        assert check_calls(calls, answer, functions).valid is right, calls
    assert check_calls([("f", {"a": 1, "c": "y"})], answer, functions).error == "f: unexpected parameter 'c'"


# parallel_178: four get_stock_price calls. In the order [Apple 01-01, MS 01-01, MS 02-01, Apple 02-01]
# BFCL's greedy pass gives Apple 01-01 to expected call 0 (company MS *or* Apple, 01-01), MS 02-01 to
# call 1, and then finds no Apple 01-01 left for call 2; the assignment MS 01-01 -> 0, Apple 01-01 -> 2
# exists, so the reply is right and "optimal" says so.
PARALLEL_178 = [("Apple", "2022-01-01"), ("Microsoft", "2022-01-01"), ("Microsoft", "2022-02-01"), ("Apple", "2022-02-01")]


def parallel_178_message():
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "get_stock_price", "arguments": json.dumps({"company_name": c, "date": d})}}
        for i, (c, d) in enumerate(PARALLEL_178)
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def test_parallel_matching_bfcl_by_default_optimal_as_option():
    entry = next(e for e in ToolUseEnv(category="parallel").tasks if e["id"] == "parallel_178")
    calls = [("get_stock_price", {"company_name": c, "date": d}) for c, d in PARALLEL_178]
    assert bfcl_valid(entry["function"], calls, entry["ground_truth"], "parallel") is False
    index = next(i for i, e in enumerate(ToolUseEnv(category="parallel").tasks) if e["id"] == "parallel_178")
    rewards = {}
    for matching in ("bfcl", "optimal"):
        env = gym.make("ToolUse-v0", category="parallel", parallel_matching=matching).unwrapped
        env.reset(options={"task_index": index})
        _, rewards[matching], _, _, info = env.step(parallel_178_message())
        if matching == "bfcl":
            assert info["check_error"] == (
                "no call matches expected call 2 (get_stock_price): the calls that match it were claimed by "
                "earlier expected calls (BFCL's greedy pass)"
            )
        env.close()
    assert rewards == {"bfcl": 0.0, "optimal": 1.0}
    # the same calls in the answer's order pass both ways
    in_order = [calls[1], calls[2], calls[0], calls[3]]
    assert bfcl_valid(entry["function"], in_order, entry["ground_truth"], "parallel") is True
    assert check_calls(in_order, entry["ground_truth"], entry["function"]).valid
    with pytest.raises(ValueError, match=r"parallel_matching must be one of \('bfcl', 'optimal'\), got 'best'"):
        ToolUseEnv(category="parallel", parallel_matching="best")


@pytest.mark.parametrize(
    ("reply", "right"),
    [
        ('<tool_call>{"name": "f", "arguments": {"x": 1,}}</tool_call>', 1.0),  # malformed: no call (BFCL decode fails)
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', 1.0),  # not {name: {args}}: BFCL's is_empty_output
        ("I can't help with that.", 1.0),
        ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', 0.0),
        ('<tool_call>{"name": "f", "arguments": {}}</tool_call>', 0.0),  # a call, even without arguments
        # one malformed call makes the whole reply undecodable for BFCL's decoder
        ('<tool_call>{"name": "f", "arguments": {"x": 1,}}</tool_call>\n<tool_call>{"name": "f", "arguments": {}}</tool_call>', 1.0),
    ],
)
def test_irrelevance_decoding(reply, right):
    env = ToolUseEnv(category="irrelevance")
    env.reset(options={"task_index": 0})
    assert env.step(reply)[1] == right
    env.close()


@pytest.mark.parametrize(
    ("arguments", "right"),
    [
        ('{"x": 1,}', 1.0),  # not JSON
        ('"{\\"x\\": 1}"', 1.0),  # a JSON string holding JSON: json.loads gives a str, not call format
        ("", 1.0),  # json.loads("") raises
        ("[1]", 1.0),
        ('{"x": 1}', 0.0),
        ({"x": 1}, 0.0),  # already an object
    ],
)
def test_irrelevance_decoding_of_structured_calls(arguments, right):
    env = ToolUseEnv(category="irrelevance")
    env.reset(options={"task_index": 0})
    call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": arguments}}
    assert env.step({"role": "assistant", "content": "", "tool_calls": [call]})[1] == right
    if isinstance(arguments, str):  # BFCL's verdict on the same wire call
        cand = fidelity.Candidate("irrelevance", 0, "irrelevance_0", "", (("f", arguments),))
        assert fidelity.bfcl_score(env.tasks[0], "irrelevance", cand)[0] == right
    env.close()


def test_irrelevance_decoding_matches_bfcl():
    bfcl = fidelity.load_bfcl()
    entry = ToolUseEnv(category="irrelevance").tasks[0]
    verdicts = {
        c.mutation: fidelity.bfcl_score(entry, "irrelevance", c)[0]
        for c in fidelity.irrelevance_candidates("irrelevance", 0, entry)
    }
    assert verdicts == {
        "no_call": 1.0,
        "no_calls_list": 1.0,
        "call_empty_arguments": 0.0,
        "call_filled": 0.0,
        "malformed_arguments": 1.0,
        "arguments_array": 1.0,
        "arguments_double_encoded": 1.0,  # json.loads gives a string: not in call format
        "malformed_then_call": 1.0,
        "two_calls": 0.0,
    }
    assert bfcl.is_empty_output([{"f": [1]}]) and not bfcl.is_empty_output([{"f": {}}])


# The candidates (ground truths and mutations, scripts/bfcl_fidelity.py) of 1 entry in SAMPLE of each
# category run in the default suite; all of them under `slow`.
SAMPLE = 25


@pytest.mark.parametrize("category", fidelity.CATEGORIES)
def test_agreement_with_bfcl_on_a_sample(category):
    tally = fidelity.compare(category, every=SAMPLE)
    assert tally.total > 0
    assert [(c.task_id, c.mutation, ours, theirs) for c, ours, theirs in tally.disagreements] == []


@pytest.mark.slow
@pytest.mark.parametrize("category", fidelity.CATEGORIES)
def test_agreement_with_bfcl_on_every_candidate(category):
    tally = fidelity.compare(category)
    assert [(c.task_id, c.mutation, ours, theirs) for c, ours, theirs in tally.disagreements] == []


# ---- every rule on a grid: doc types x allowed values x given values ------------------------------

GRID_VALUES = [
    0, 1, 2, 1.0, 2.5, True, False, None, "", "a", "A", "a b", "A-B", "n", "1",
    [], [1], [1.0], [1, 2], [2, 1], [1, 2.0], ["a"], ["A"], ["a", 1], [True], [[1]], [["a"]], [["A"]], [[]],
    {}, {"k": 1}, {"k": 1.0}, {"k": "a"}, {"k": "A b"}, {"k": ["a"]}, {"k": ["A"]}, {"k": 1, "z": 2},
    [{"k": 1}], [{"k": "A"}], [{}], [{"k": 1}, {"k": 2}],
]
GRID_SPECS = [
    {"type": t} for t in ("string", "integer", "float", "boolean", "any", "dict")
] + [
    {"type": "array", "items": {"type": t}} for t in ("string", "integer", "float", "boolean", "dict", "array", "any")
] + [{"type": "tuple", "items": {"type": "integer"}}]


def grid_options():
    singles = [1, 1.0, 2.5, True, "a", "a b", "n", [1], [1.0], [1, 2], ["a"], [["a"]], [], {"k": [1]}, {"k": ["a", ""]},
               {"k": [["a"]]}, {"k": [1], "z": [""]}, [{"k": [1]}], [{"k": ["a"]}], [{"k": [1]}, {"k": [2]}]]
    out = [[""]]
    for v in singles:
        out += [[v], ["", v], [v, ""]]
    return [*out, [1, "a"], ["a", 1], [[1], ["a"]], [["a"], [1]], [{"k": [1]}, {"k": ["a"]}]]


def test_every_value_rule_on_a_grid_matches_bfcl():
    """Doc types x allowed-value lists x given values, each scored by BFCL's ast_checker and ours."""
    bfcl = fidelity.load_bfcl()
    n = raised = 0
    disagree = []
    for spec in GRID_SPECS:
        functions = doc(x=spec)
        for options in grid_options():
            answer = [{"f": {"x": options}}]
            for value in GRID_VALUES:
                try:
                    theirs = bool(
                        bfcl.ast_checker(functions, [{"f": {"x": value}}], answer, bfcl.language, "simple_python", fidelity.MODEL)["valid"]
                    )
                except Exception:  # BFCL's code does not handle the input: no match
                    theirs, raised = False, raised + 1
                ours = check_calls([("f", {"x": value})], answer, functions).valid
                n += 1
                if ours != theirs:
                    disagree.append((spec, options, value, ours, theirs))
    assert n == len(GRID_SPECS) * len(grid_options()) * len(GRID_VALUES) == 14 * 66 * 41
    assert raised == 185  # e.g. a list option for a dict-items array given non-dict items
    assert disagree[:20] == [] and len(disagree) == 0
