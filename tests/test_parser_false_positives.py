"""No parser reads data, code fences, JSON examples or quoted call syntax as a call.

The failure: with ``parser="json"`` a fenced ```` ```json {"name": "my-app", "version": "1.0.0"}``` ````
(or ``[{"name": "alice", "age": 30}]``) was a call to ``my-app`` with ``{}``; on Math-v0 the correct
``<answer>`` next to it then scored 0 (the "call" ran, failed, and the one turn was used up). The rule:
an object is a call only with the call shape (``name`` plus ``arguments``/``parameters``, nothing
else but ``type``/``id``); hermes tags mentioned in prose, inside markdown code or in quotes are text.
Real calls next to such text are still read (true positives below).
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs.parsers import PARSERS, ParsedAction, get_parser, parse_openai_message


def call(i: int, name: str, arguments: str) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


PROSE = [
    # the examples
    '```json\n{"name": "my-app", "version": "1.0.0"}\n```',
    '[{"name": "alice", "age": 30}]',
    'Your package.json:\n```json\n{"name": "my-app", "version": "1.0.0"}\n```\nRun npm install.',
    # data that fails to decode is still data (no "arguments"/"parameters" key): not a broken call
    '```json\n{"name": "my-app", "version": "1.0.0",}\n```',
    '{"name": "alice", "age": 30,}',
    # a tool's definition is not a call to it
    '```json\n{"name": "get_weather", "description": "Weather now.", "parameters": {"type": "object"}}\n```',
    '{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}',
    # hermes syntax mentioned, quoted in code, fenced, or in quotes
    "I will wrap the call in <tool_call> tags.",
    "Use <tool_call> and </tool_call> around the JSON.",
    'Write `<tool_call>{"name": "f", "arguments": {}}</tool_call>` to call f.',
    'Write ``<tool_call>{"name": "f", "arguments": {"s": "`"}}</tool_call>`` to call f.',
    'The format:\n```\n<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>\n```\nThat is all.',
    'The format:\n  ````xml\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\n```\n````\nDone.',
    'The format is "<tool_call>{"name": "f", "arguments": {}}</tool_call>".',
    'It reads \u201c<tool_call>{"name": "f", "arguments": {}}</tool_call>\u201d in the docs.',
    # an empty block quoted or in code is a mention too (unquoted it is a malformed call)
    'An empty "<tool_call></tool_call>" is no call.',
    'An empty `<tool_call></tool_call>` is no call.',
    # a call-shaped JSON example quoted inline or in a fence not tagged json
    'The format is `{"name": "f", "parameters": {"a": 1}}` for Llama.',
    '`{"name": "f", "parameters": {"a": 1}}` is the format.',
    'Example:\n```\n{"name": "f", "parameters": {"a": 1}}\n```',
    # pythonic syntax quoted or fenced
    'Call `[get_weather(city="Paris")]` to get the weather.',
    '```python\n[get_weather(city="Paris")]\n```',
    # plain answers
    "The answer is 42.",
    "<answer>9500</answer>",
]


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize("text", PROSE)
def test_no_parser_reads_prose_as_a_call(name, text):
    assert get_parser(name).parse(text) == ParsedAction(text.strip(), [], [])


@pytest.mark.parametrize("text", PROSE)
def test_structured_message_content_is_never_a_call(text):
    # The openai format's calls come only from tool_calls; its content is text whatever it holds.
    assert parse_openai_message({"role": "assistant", "content": text}) == ParsedAction(text.strip(), [], [])


# ---- true positives next to such text -----------------------------------------------------------

llama_json = get_parser("json")
hermes = get_parser("hermes")


def test_json_data_block_and_call_block_in_one_reply():
    data = 'Config:\n```json\n{"name": "my-app", "version": "1.0.0"}\n```\n'
    text = data + '```json\n{"name": "f", "parameters": {"a": 1}}\n```'
    assert llama_json.parse(text) == ParsedAction(data.strip(), [call(0, "f", '{"a": 1}')], [])


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "f", "parameters": {"a": 1}}',
        '{"type": "function", "name": "f", "parameters": {"a": 1}}',
        '{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}',
        '{"id": "x", "name": "f", "arguments": "{\\"a\\": 1}"}',
        'Sure.\n```json\n{"name": "f", "arguments": {"a": 1}}\n```',
    ],
)
def test_json_call_shapes_are_still_calls(text):
    parsed = llama_json.parse(text)
    assert (parsed.calls, parsed.errors) == ([call(0, "f", '{"a": 1}')], [])


def test_json_broken_call_shape_is_still_an_error():
    # "name" and "parameters" both written: a call that failed to decode, reported to the model.
    text = '```json\n{"name": "f", "parameters": {"a": 1,}}\n```'
    parsed = llama_json.parse(text)
    assert parsed.calls == []
    assert parsed.errors == [
        "tool call 1: invalid JSON (Expecting property name enclosed in double quotes): "
        + repr('{"name": "f", "parameters": {"a": 1,}}\n```')
    ]


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (  # a quoted example and a real call in one reply
            'The format is `<tool_call>{"name": "f", "arguments": {}}</tool_call>`; calling now: '
            '<tool_call>{"name": "g", "arguments": {"a": 1}}</tool_call>',
            'The format is `<tool_call>{"name": "f", "arguments": {}}</tool_call>`; calling now:',
        ),
        (  # inline code in the prose before the call
            'I will run `ls` first.\n<tool_call>{"name": "g", "arguments": {"a": 1}}</tool_call>',
            "I will run `ls` first.",
        ),
        (  # a fence that never closes does not swallow the call
            'Plan:\n```python\nx = 1\n<tool_call>{"name": "g", "arguments": {"a": 1}}</tool_call>',
            "Plan:\n```python\nx = 1",
        ),
        (  # an apostrophe and a lone backtick are not quotes
            'It\'s time: don`t wait. <tool_call>{"name": "g", "arguments": {"a": 1}}</tool_call>',
            "It's time: don`t wait.",
        ),
        (  # a fenced code block closed before the call
            'Code:\n```py\nprint(1)\n```\n<tool_call>{"name": "g", "arguments": {"a": 1}}</tool_call>',
            "Code:\n```py\nprint(1)\n```",
        ),
    ],
)
def test_hermes_calls_next_to_quoted_text_are_still_calls(text, content):
    assert hermes.parse(text) == ParsedAction(content, [call(0, "g", '{"a": 1}')], [])


def test_hermes_stray_backtick_in_prose_and_one_in_an_argument_are_no_code_span():
    text = 'Don`t worry. <tool_call>{"name": "g", "arguments": {"s": "`"}}</tool_call>'
    assert hermes.parse(text) == ParsedAction("Don`t worry.", [call(0, "g", '{"s": "`"}')], [])


def test_hermes_call_with_backticks_in_its_arguments():
    text = '<tool_call>{"name": "run", "arguments": {"code": "```py\\nx = `1`\\n```"}}</tool_call> ok'
    assert hermes.parse(text) == ParsedAction("ok", [call(0, "run", '{"code": "```py\\nx = `1`\\n```"}')], [])


def test_hermes_tag_with_non_json_body_and_a_close_tag_is_text():
    # Not JSON after the tag: the tag is talked about (vLLM's hermes parser also returns it as content).
    text = "<tool_call>get_weather(city='Paris')</tool_call>"
    assert hermes.parse(text) == ParsedAction(text, [], [])


# ---- the Math-v0 example ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("parser", "extra"),
    [
        ("json", '```json\n{"name": "my-app", "version": "1.0.0"}\n```'),
        ("json", '[{"name": "alice", "age": 30}]'),
        ("hermes", 'Format: `<tool_call>{"name": "calculate", "arguments": {}}</tool_call>`'),
    ],
)
def test_math_answer_next_to_data_block_scores_one(parser, extra):
    pytest.importorskip("reasoning_gym")
    env = gym.make("Math-v0", split="train", size=4, parser=parser).unwrapped
    try:
        env.reset(options={"task_index": 0})
        answer = env.task["answer"]
        for text in (f"{extra}\n<answer>{answer}</answer>", f"<answer>{answer}</answer>\n{extra}"):
            env.reset(options={"task_index": 0})
            obs, reward, terminated, truncated, info = env.step(text)
            assert (obs, reward, terminated, truncated, info["tool_calls"]) == ([], 1.0, True, False, 0)
    finally:
        env.close()
