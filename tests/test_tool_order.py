"""One tool message per call, in the calls' order, each with its call's id, errors included.

The failure: an assistant turn with a malformed call first and a valid one second got the tool messages
[valid result, error], so templates that pair results with calls by position (Qwen's
``<tool_response>`` blocks, Llama's ``ipython`` turns) showed the valid call answered by an error.
Checked for every parser and through every env that runs tools (ChatEnv itself, Math-v0's calculator,
an MCP server from a tools config, Search-v0, CodeSandbox-v0, ToolUse-v0 multi-turn, UserSim-v0).
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs import ChatEnv, StepOutcome
from chatgym.envs import messages as M
from chatgym.envs.parsers import ParsedAction, get_parser


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


class AddEnv(ChatEnv):
    def load_tasks(self, split):
        return [{"task_id": "t0"}]

    def initial_messages(self, task):
        return [M.system("Tool: add."), M.user("1 + 2?")]

    async def score(self, turn):
        return StepOutcome(reward=0.0, terminated=True)


def hermes_call(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def structured(*calls: tuple[str, str, str]) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls
        ],
    }


BAD_JSON_ERROR = (
    "Error: could not parse tool call: tool call 1: arguments are not valid JSON "
    "(Expecting property name enclosed in double quotes): '{not json'. Available tools: add."
)


def test_issue_example_structured_bad_then_good():
    env = AddEnv(tools=[add])
    try:
        env.reset(seed=0)
        obs, _, _, _, info = env.step(
            structured(("c1", "add", "{not json"), ("c2", "add", '{"a": 1, "b": 2}'))
        )
        assert obs == [
            {"role": "tool", "content": BAD_JSON_ERROR, "tool_call_id": "c1"},
            {"role": "tool", "content": "3", "tool_call_id": "c2", "name": "add"},
        ]
        assert (info["tool_calls"], info["tool_errors"]) == (1, 1)
        # The history's assistant turn holds both calls in the same order, so each tool message
        # answers the call at its own position.
        assert [c["id"] for c in env.messages[-3]["tool_calls"]] == ["c1", "c2"]
    finally:
        env.close()


def test_issue_example_two_hermes_blocks_bad_then_good():
    env = AddEnv(tools=[add])
    try:
        env.reset(seed=0)
        obs, *_ = env.step(
            '<tool_call>{"name": "add", "arguments": {not json}}</tool_call>'
            + hermes_call("add", {"a": 1, "b": 2})
        )
        assert obs == [
            {
                "role": "tool",
                "content": "Error: could not parse tool call: tool call 1: invalid JSON in <tool_call> "
                "(Expecting property name enclosed in double quotes): "
                '\'{"name": "add", "arguments": {not json}}\'. Available tools: add.',
                "tool_call_id": "call_error_0",
            },
            {"role": "tool", "content": "3", "tool_call_id": "call_0", "name": "add"},
        ]
    finally:
        env.close()


# Per text format: four attempts, bad / good (1+2) / bad / good (3+4), so the errors sit at positions 0 and 2.
INTERLEAVED = {
    "hermes": '<tool_call>{"name": "add", "arguments": [1]}</tool_call>'
    + hermes_call("add", {"a": 1, "b": 2})
    + '<tool_call>{"name": 3}</tool_call>'
    + hermes_call("add", {"a": 3, "b": 4}),
    "json": '[{"name": "add", "parameters": [1]}, {"name": "add", "parameters": {"a": 1, "b": 2}}, '
    '{"name": 3, "parameters": {}}, {"name": "add", "parameters": {"a": 3, "b": 4}}]',
    "pythonic": "[add(1), add(a=1, b=2), add(a={1}), add(a=3, b=4)]",
}


@pytest.mark.parametrize("fmt", sorted(INTERLEAVED))
def test_every_text_parser_records_where_each_error_stood(fmt):
    parsed = get_parser(fmt).parse(INTERLEAVED[fmt])
    assert [c["function"]["arguments"] for c in parsed.calls] == ['{"a": 1, "b": 2}', '{"a": 3, "b": 4}']
    assert len(parsed.errors) == 2 and parsed.error_positions == [0, 2]
    assert parsed.in_order() == [("error", 0), ("call", 0), ("error", 1), ("call", 1)]


@pytest.mark.parametrize("fmt", sorted(INTERLEAVED))
def test_every_text_parser_answers_in_call_order_through_the_env(fmt):
    env = AddEnv(tools=[add], parser=fmt)
    try:
        env.reset(seed=0)
        obs, _, _, _, info = env.step(INTERLEAVED[fmt])
        assert [m["tool_call_id"] for m in obs] == ["call_error_0", "call_0", "call_error_1", "call_1"]
        assert [m["content"] for m in obs][1::2] == ["3", "7"]
        assert all(m["content"].startswith("Error: could not parse tool call: tool call 1") for m in obs[:1])
        assert obs[2]["content"].startswith("Error: could not parse tool call: tool call 3")
        assert (info["tool_calls"], info["tool_errors"]) == (2, 2)
    finally:
        env.close()


def test_structured_interleaved_calls_keep_server_order_and_ids():
    env = AddEnv(tools=[add], parser="openai")
    try:
        env.reset(seed=0)
        action = structured(
            ("s1", "add", '{"a": 1, "b": 2}'),
            ("s2", "add", "[1]"),
            ("s3", "nope", "{}"),  # well-formed, unknown tool: an error from the runner, still in place
            ("s4", "add", "{oops"),
            ("s5", "add", '{"a": 3, "b": 4}'),
        )
        obs, *_ = env.step(action)
        assert [m["tool_call_id"] for m in obs] == ["s1", "s2", "s3", "s4", "s5"]
        assert [obs[0]["content"], obs[4]["content"]] == ["3", "7"]
        assert obs[2]["content"] == "Error: unknown tool 'nope'. Available tools: add."
        assert [c["id"] for c in env.messages[-6]["tool_calls"]] == ["s1", "s2", "s3", "s4", "s5"]
    finally:
        env.close()


def test_in_order_without_recorded_positions_puts_errors_last():
    # A ParsedAction built by hand (no positions) keeps the old meaning: calls, then errors.
    action = ParsedAction("", [{"id": "a"}, {"id": "b"}], ["e"])
    assert action.in_order() == [("call", 0), ("call", 1), ("error", 0)]
    bad_positions = ParsedAction("", [{"id": "a"}], ["e", "f"], error_positions=[0, 7])
    assert bad_positions.in_order() == [("call", 0), ("error", 0), ("error", 1)]
    # Positions are bookkeeping, not part of equality: pinned parses still compare equal.
    assert ParsedAction("", [], ["e"], error_positions=[0]) == ParsedAction("", [], ["e"])


# ---- through every env that runs tools -------------------------------------------------------------
# Each factory returns (env, reset options, a tool name, valid arguments for it).


def _math_calculator():
    env = gym.make("MathCalculator-v0", split="train", size=4).unwrapped
    return env, {"task_index": 0}, "calculate", {"expression": "1 + 2"}


def _math_with_mcp_server():
    from pathlib import Path

    pytest.importorskip("mcp")
    config = Path(__file__).resolve().parents[1] / "examples" / "tools.yaml"
    env = gym.make("Math-v0", size=4, max_turns=8, tools_config=str(config)).unwrapped
    return env, {"task_index": 0}, "count_words", {"text": "one two three"}


def _search():
    from chatgym.envs.search.env import SearchEnv
    from chatgym.retrievers.base import Document
    from chatgym.retrievers.bm25 import BM25Retriever

    tiny = BM25Retriever([Document("a", "Mount Everest is the highest mountain.", {"title": "Everest"})])
    task = {"question": "Highest mountain?", "answers": ["Mount Everest"]}
    return SearchEnv(retriever=tiny, mode="tool"), {"task": task}, "search", {"query": "highest mountain"}


def _code_sandbox():
    return gym.make("CodeSandbox-v0").unwrapped, {"task_index": 0}, "run_python", {"code": "print(1 + 2)"}


def _tool_use_multi_turn():
    from chatgym.envs.tool_use.env import ToolUseEnv

    return ToolUseEnv(category="multi_turn_base"), {"task_index": 0}, "pwd", {}


def _usersim():
    from chatgym.envs.usersim.env import UserSimEnv

    env = UserSimEnv(domain="airline", split="base")
    return env, {"task_index": 0}, "calculate", {"expression": "1 + 2"}


ENVS = {
    "math_calculator": _math_calculator,
    "mcp_server": _math_with_mcp_server,
    "search": _search,
    "code_sandbox": _code_sandbox,
    "tool_use_multi_turn": _tool_use_multi_turn,
    "usersim": _usersim,
}


@pytest.mark.parametrize("kind", sorted(ENVS))
def test_every_tool_env_answers_a_bad_then_good_turn_in_order(kind):
    env, options, name, arguments = ENVS[kind]()
    good = json.dumps(arguments)
    try:
        # The valid call alone, in a fresh episode: the content its tool message must carry below.
        env.reset(options=options)
        alone, *_ = env.step(structured(("g", name, good)))
        assert len(alone) == 1 and alone[0]["tool_call_id"] == "g"
        expected = alone[0]["content"]

        turns = {
            "structured": (structured(("b", name, "{not json"), ("g", name, good)), ["b", "g"]),
            "hermes": (
                f'<tool_call>{{"name": "{name}", "arguments": {{not json}}}}</tool_call>'
                + hermes_call(name, arguments),
                ["call_error_0", "call_0"],
            ),
        }
        for action, ids in turns.values():
            env.reset(options=options)
            obs, *_ = env.step(action)
            assert [m["role"] for m in obs] == ["tool", "tool"]
            assert [m["tool_call_id"] for m in obs] == ids
            assert obs[0]["content"].startswith("Error: could not parse tool call: tool call 1")
            assert obs[1]["content"] == expected
    finally:
        env.close()


def test_structured_call_without_server_id_keeps_its_place_in_the_history():
    # A server call without an id gets call_<i>; the history used to move it after the malformed calls.
    env = AddEnv(tools=[add], parser="openai")
    try:
        env.reset(seed=0)
        action = structured(("", "add", '{"a": 1, "b": 2}'), ("s2", "add", "{oops"))
        del action["tool_calls"][0]["id"]
        obs, *_ = env.step(action)
        assert [m["tool_call_id"] for m in obs] == ["call_0", "s2"]
        assert [c["id"] for c in env.messages[-3]["tool_calls"]] == ["call_0", "s2"]
        assert obs[0]["content"] == "3"
    finally:
        env.close()
