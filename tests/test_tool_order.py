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


def fn_call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


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
                "tool_call_id": "call_0",
            },
            {"role": "tool", "content": "3", "tool_call_id": "call_1", "name": "add"},
        ]
        # The history's assistant turn records both calls, the malformed one as written (its JSON
        # does not decode, so no name can be read): call i is answered by tool message i.
        assert env.messages[-3] == {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                fn_call("call_0", "invalid", '{"name": "add", "arguments": {not json}}'),
                fn_call("call_1", "add", '{"a": 1, "b": 2}'),
            ],
        }
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
        assert [m["tool_call_id"] for m in obs] == ["call_0", "call_1", "call_2", "call_3"]
        assert [c["id"] for c in env.messages[-5]["tool_calls"]] == ["call_0", "call_1", "call_2", "call_3"]
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
    # Built without error_calls, an error is recorded in the history by a stand-in under its own id.
    assert action.all_calls() == [{"id": "a"}, {"id": "b"}, fn_call("call_error_0", "invalid", "")]
    served = ParsedAction("", [], ["e"], ["srv-9"])
    assert served.all_calls() == [fn_call("srv-9", "invalid", "")]
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
                ["call_0", "call_1"],
            ),
        }
        for action, ids in turns.values():
            env.reset(options=options)
            obs, *_ = env.step(action)
            assert [m["role"] for m in obs] == ["tool", "tool"]
            assert [m["tool_call_id"] for m in obs] == ids
            assert [c["id"] for c in env.unwrapped.messages[-3]["tool_calls"]] == ids
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


# ---- the history after a malformed call: one recorded call per tool message ------------------------
# The failure: after a hermes turn [malformed, valid] the history held one assistant tool_call (the
# valid one) and then two tool messages, the error first; a template or chat API pairing results with
# calls by position showed the error as the valid call's result. Now the turn records every attempt,
# a malformed one as written (name, or "invalid"; arguments as text) under the id its error answers.

BAD_BLOCK = '<tool_call>{"name": "add", "arguments": {not json}}</tool_call>'
BAD_BLOCK_ERROR = (
    "Error: could not parse tool call: tool call {n}: invalid JSON in <tool_call> (Expecting property "
    "name enclosed in double quotes): '{{\"name\": \"add\", \"arguments\": {{not json}}}}'. Available tools: add."
)


def _turn(env: ChatEnv, action) -> tuple[dict, list[dict]]:
    """Step ``action``; the assistant message the history recorded and the tool messages after it."""
    obs, *_ = env.step(action)
    return env.messages[-len(obs) - 1], obs


@pytest.fixture
def add_env():
    env = AddEnv(tools=[add])
    env.reset(seed=0)
    yield env
    env.close()


def test_history_valid_then_malformed(add_env):
    recorded, obs = _turn(add_env, hermes_call("add", {"a": 1, "b": 2}) + BAD_BLOCK)
    assert recorded == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            fn_call("call_0", "add", '{"a": 1, "b": 2}'),
            fn_call("call_1", "invalid", '{"name": "add", "arguments": {not json}}'),
        ],
    }
    assert obs == [
        {"role": "tool", "content": "3", "tool_call_id": "call_0", "name": "add"},
        {"role": "tool", "content": BAD_BLOCK_ERROR.format(n=2), "tool_call_id": "call_1"},
    ]


def test_history_two_malformed_calls(add_env):
    text = "Let me add.\n" + BAD_BLOCK + '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>'
    recorded, obs = _turn(add_env, text)
    assert recorded == {
        "role": "assistant",
        "content": "Let me add.",
        "tool_calls": [
            fn_call("call_0", "invalid", '{"name": "add", "arguments": {not json}}'),
            # The JSON decodes: the name and the arguments as written are kept.
            fn_call("call_1", "add", "[1, 2]"),
        ],
    }
    assert obs == [
        {"role": "tool", "content": BAD_BLOCK_ERROR.format(n=1), "tool_call_id": "call_0"},
        {
            "role": "tool",
            "content": "Error: could not parse tool call: tool call 2 (add): arguments must be a JSON "
            "object, got an array. Available tools: add.",
            "tool_call_id": "call_1",
        },
    ]


# Per text format, the history of INTERLEAVED (bad, 1+2, bad, 3+4): every attempt at its place.
INTERLEAVED_HISTORY = {
    "hermes": [
        fn_call("call_0", "add", "[1]"),
        fn_call("call_1", "add", '{"a": 1, "b": 2}'),
        fn_call("call_2", "invalid", '{"name": 3}'),
        fn_call("call_3", "add", '{"a": 3, "b": 4}'),
    ],
    "json": [
        fn_call("call_0", "add", "[1]"),
        fn_call("call_1", "add", '{"a": 1, "b": 2}'),
        fn_call("call_2", "invalid", "{}"),
        fn_call("call_3", "add", '{"a": 3, "b": 4}'),
    ],
    # A pythonic call's arguments are its source text: they are not JSON.
    "pythonic": [
        fn_call("call_0", "add", "add(1)"),
        fn_call("call_1", "add", '{"a": 1, "b": 2}'),
        fn_call("call_2", "add", "add(a={1})"),
        fn_call("call_3", "add", '{"a": 3, "b": 4}'),
    ],
}


@pytest.mark.parametrize("fmt", sorted(INTERLEAVED))
def test_every_text_parser_records_each_malformed_call_in_the_history(fmt):
    env = AddEnv(tools=[add], parser=fmt)
    try:
        env.reset(seed=0)
        recorded, obs = _turn(env, INTERLEAVED[fmt])
        assert recorded == {"role": "assistant", "content": "", "tool_calls": INTERLEAVED_HISTORY[fmt]}
        assert [m["tool_call_id"] for m in obs] == ["call_0", "call_1", "call_2", "call_3"]
        assert [m["content"] for m in obs][1::2] == ["3", "7"]
    finally:
        env.close()


@pytest.mark.parametrize(
    ("fmt", "text", "recorded_call"),
    [
        ("json", '{"name": "add", "parameters": {"a": 1,}}', ("invalid", '{"name": "add", "parameters": {"a": 1,}}')),
        ("pythonic", "[add(a=1), add(b=]", ("invalid", "[add(a=1), add(b=]")),
        ("pythonic", "[x.y[0](), add(a=1, b=2)]", ("invalid", "x.y[0]()")),
    ],
)
def test_a_call_that_does_not_parse_is_recorded_as_its_text(fmt, text, recorded_call):
    env = AddEnv(tools=[add], parser=fmt)
    try:
        env.reset(seed=0)
        recorded, obs = _turn(env, text)
        assert recorded["tool_calls"][0] == fn_call("call_0", *recorded_call)
        assert [m["tool_call_id"] for m in obs] == [c["id"] for c in recorded["tool_calls"]]
        assert obs[0]["content"].startswith("Error: could not parse tool call: tool call 1")
    finally:
        env.close()


def test_structured_malformed_call_without_an_id_is_answered_by_its_position():
    # A server call without an id: its error used to answer "call_error_0", which no call had.
    env = AddEnv(tools=[add], parser="openai")
    try:
        env.reset(seed=0)
        action = structured(("s1", "add", '{"a": 1, "b": 2}'), ("", "add", "{oops"), ("s3", "", "[]"))
        del action["tool_calls"][1]["id"]
        recorded, obs = _turn(env, action)
        assert recorded == {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                fn_call("s1", "add", '{"a": 1, "b": 2}'),
                fn_call("call_1", "add", "{oops"),  # as sent, under its position's id
                fn_call("s3", "invalid", "[]"),  # an empty name is no name a chat API takes
            ],
        }
        assert [m["tool_call_id"] for m in obs] == ["s1", "call_1", "s3"]
    finally:
        env.close()


@pytest.mark.parametrize(
    ("tool_calls", "error"),
    [("foo", "tool_calls must be a list, got a string"),
     ([{"id": "x"}], 'tool call 1: expected {"function": {"name": ..., "arguments": ...}}')],
)
def test_a_structured_tool_call_list_that_is_malformed_is_answered_not_raised(tool_calls, error):
    # Regression (fresh-user walk): these raised "action must be a str or an assistant Message" out of
    # step(), against docs/envs.md's "a bad tool call ... never raises out of step".
    env = AddEnv(tools=[add], parser="openai")
    try:
        env.reset(seed=0)
        obs, reward, terminated, _, _ = env.step({"role": "assistant", "content": None, "tool_calls": tool_calls})
        assert [m["role"] for m in obs] == ["tool"] and not terminated and reward == 0.0
        assert obs[0]["content"].startswith(f"Error: could not parse tool call: {error}")
        assert env.messages[-2]["role"] == "assistant" and env.messages[-2]["content"] == ""
    finally:
        env.close()


def _pairs(text: str) -> list[tuple[str, str]]:
    """The last assistant turn's ``<tool_call>`` blocks zipped, by position, with the
    ``<tool_response>`` blocks after it — the way a model reading the rendering pairs them."""
    import re

    turn = text[text.rindex("<|im_start|>assistant") :]
    calls = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", turn, re.S)
    results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", turn, re.S)
    assert len(calls) == len(results)
    return list(zip(calls, results, strict=True))


@pytest.mark.parametrize("template", ["chatml_tools", "qwen3"])
def test_rerendered_history_puts_each_error_after_its_own_call(template):
    from chatgym.trainer.chat.tokenizer import builtin_template, get_tokenizer

    tok = get_tokenizer("smollm2")
    tok.chat_template = builtin_template(template)
    env = AddEnv(tools=[add])
    try:
        env.reset(seed=0)
        env.step(BAD_BLOCK + hermes_call("add", {"a": 1, "b": 2}))
        rendered = tok.apply_chat_template(env.messages, tools=env.tools, tokenize=False)
    finally:
        env.close()
    (bad_call, bad_result), (good_call, good_result) = _pairs(rendered)
    assert bad_call == '{"name": "invalid", "arguments": {"name": "add", "arguments": {not json}}}'
    assert bad_result == BAD_BLOCK_ERROR.format(n=1)
    assert good_call == '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert good_result == "3"


# ---- call ids over an episode -----------------------------------------------------------------------
# The failure: every turn's parse numbered its calls from call_0, so the history of a two-turn episode
# held two different calls under "call_0" and a client pairing tool_call_ids across the conversation
# (the OpenAI API) could not tell them apart. Now a generated id counts the episode's call attempts.


def test_call_ids_count_on_over_the_episode_and_keep_server_ids():
    env = AddEnv(tools=[add])  # hermes text turns; a structured turn gets the openai checks
    try:
        for _ in range(2):  # a replayed episode gets the same ids
            env.reset(seed=0)
            # Turn 1: attempts 0 (malformed) and 1 (valid).
            first, obs1 = _turn(env, BAD_BLOCK + hermes_call("add", {"a": 1, "b": 2}))
            # Turn 2: attempts 2 and 3.
            second, obs2 = _turn(env, hermes_call("add", {"a": 3, "b": 4}) + hermes_call("add", {"a": 5, "b": 6}))
            # Turn 3, structured: attempt 4 has no server id and its count's id "call_4" is the turn's
            # other, server-given id, so it gets the next free number, "call_5"; the server's id is kept.
            action = structured(("", "add", '{"a": 7, "b": 8}'), ("call_4", "add", '{"a": 9, "b": 1}'))
            del action["tool_calls"][0]["id"]
            third, obs3 = _turn(env, action)
            assert [c["id"] for c in first["tool_calls"]] == [m["tool_call_id"] for m in obs1] == ["call_0", "call_1"]
            assert [c["id"] for c in second["tool_calls"]] == [m["tool_call_id"] for m in obs2] == ["call_2", "call_3"]
            assert [c["id"] for c in third["tool_calls"]] == [m["tool_call_id"] for m in obs3] == ["call_5", "call_4"]
            assert [m["content"] for m in obs2 + obs3] == ["7", "11", "15", "10"]
    finally:
        env.close()


def test_a_generated_id_steps_around_every_id_the_episode_used():
    # The failure: a generated id was call_<attempts before> and stepped around the current turn's
    # server ids only, so a server's call_1 in turn 1 and the parser's call_1 (1 attempt before) in
    # turn 2 made the history ['call_1', 'call_1'], with two tool messages answering call_1.
    env = gym.make("MathCalculator-v0")
    turns = [
        structured(("call_1", "calculate", '{"expression": "1+1"}')),
        hermes_call("calculate", {"expression": "2+2"}),  # attempt 1: call_1 is taken, call_2 is free
        # Attempts 2 and 3: call_2 is taken, so call_3, then call_4 (call_3 is now the turn's).
        hermes_call("calculate", {"expression": "3+3"}) + hermes_call("calculate", {"expression": "4+4"}),
    ]
    try:
        for _ in range(2):  # a replayed episode gets the same ids
            env.reset(seed=0)
            answers = [m for action in turns for m in env.step(action)[0]]
            history = [c["id"] for m in env.unwrapped.messages if m.get("tool_calls") for c in m["tool_calls"]]
            assert history == ["call_1", "call_2", "call_3", "call_4"]
            assert [(m["tool_call_id"], m["content"]) for m in answers] == [
                ("call_1", "2"), ("call_2", "4"), ("call_3", "6"), ("call_4", "8")]
    finally:
        env.close()


def test_a_history_id_ahead_of_the_count_is_stepped_around_and_later_numbers_go_on_from_it():
    env = AddEnv(tools=[add])
    try:
        env.reset(seed=0)
        # A client's own id, call_3, ahead of the count (1 attempt before the next turn).
        _turn(env, structured(("call_3", "add", '{"a": 1, "b": 1}')))
        turn, obs = _turn(env, "".join(hermes_call("add", {"a": i, "b": 1}) for i in range(3)))
        # Attempts 1, 2, 3: call_1, call_2, then call_3 is taken, so call_4.
        assert [c["id"] for c in turn["tool_calls"]] == [m["tool_call_id"] for m in obs] == ["call_1", "call_2", "call_4"]
        turn, _ = _turn(env, hermes_call("add", {"a": 0, "b": 0}))
        assert [c["id"] for c in turn["tool_calls"]] == ["call_5"]  # attempt 4: call_4 is taken
    finally:
        env.close()


def test_a_repeated_server_id_gets_a_made_id_and_its_result_answers_that_id():
    # Regression: a server's id was kept even when it repeated, within the turn or one of an earlier
    # turn, so two tool messages answered one tool_call_id. The first use keeps it; a repeat gets
    # call_<n>, n its attempt's place in the episode (the rule of OpenAIChatEngine's made ids).
    env = AddEnv(tools=[add])
    try:
        for _ in range(2):  # a replayed episode gets the same ids
            env.reset(seed=0)
            first, obs1 = _turn(env, structured(
                ("dup", "add", '{"a": 1, "b": 2}'), ("dup", "add", '{"a": 3, "b": 4}'), ("fresh", "add", '{"a": 5, "b": 6}')))
            # Attempts 3-5: "fresh" is turn 1's, the second "other" this turn's.
            second, obs2 = _turn(env, structured(
                ("fresh", "add", '{"a": 1, "b": 1}'), ("other", "add", '{"a": 2, "b": 2}'), ("other", "add", '{"a": 3, "b": 3}')))
            assert [c["id"] for c in first["tool_calls"]] == [m["tool_call_id"] for m in obs1] == ["dup", "call_1", "fresh"]
            assert [c["id"] for c in second["tool_calls"]] == [m["tool_call_id"] for m in obs2] == ["call_3", "other", "call_5"]
            assert [m["content"] for m in obs1 + obs2] == ["3", "7", "11", "2", "4", "6"]
    finally:
        env.close()
