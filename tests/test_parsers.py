"""Tool-call parsers: exact calls for each format and each tricky case, plus fuzzing (never raises).

Expected calls are written out literally (``arguments`` as the JSON text ``json.dumps`` gives for the
hand-written object); nothing here is computed with the parser's own helpers.
"""

from __future__ import annotations

import json
import keyword
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatgym.envs import ChatEnv, StepOutcome
from chatgym.envs import messages as M
from chatgym.envs.parsers import (
    PARSERS,
    ParsedAction,
    get_parser,
    parse_openai_message,
    parse_openai_tool_calls,
)


def call(i: int, name: str, arguments: str) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


hermes = get_parser("hermes")
llama_json = get_parser("json")
pythonic = get_parser("pythonic")


# ---- hermes --------------------------------------------------------------------------------------


def test_hermes_single_call_and_surrounding_text():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert hermes.parse(text) == ParsedAction(
        "Let me look.", [call(0, "get_weather", '{"city": "Paris"}')], []
    )


def test_hermes_two_calls_in_order():
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        '<tool_call>{"name": "mul", "arguments": {"a": 3, "b": 4}}</tool_call>'
    )
    assert hermes.parse(text) == ParsedAction(
        "", [call(0, "add", '{"a": 1, "b": 2}'), call(1, "mul", '{"a": 3, "b": 4}')], []
    )


def test_hermes_call_inside_think_is_not_a_call():
    text = (
        '<think>I could call <tool_call>{"name": "rm", "arguments": {"path": "/"}}</tool_call> '
        "but I should not.</think>\n"
        '<tool_call>{"name": "ls", "arguments": {"path": "."}}</tool_call>'
    )
    parsed = hermes.parse(text)
    assert parsed.calls == [call(0, "ls", '{"path": "."}')]
    assert parsed.errors == []
    # The reasoning stays in the content (it is text outside the calls), verbatim.
    assert parsed.content == text[: text.index("</think>") + len("</think>")]


def test_hermes_close_tag_without_open_ends_template_opened_reasoning():
    # Qwen3 / DeepSeek-R1 templates put "<think>" in the prompt: the turn starts inside the block.
    text = 'maybe <tool_call>{"name": "rm", "arguments": {}}</tool_call>?</think><tool_call>{"name": "ls"}</tool_call>'
    assert hermes.parse(text).calls == [call(0, "ls", "{}")]


def test_hermes_unclosed_think_makes_the_rest_reasoning():
    text = '<think>I will call <tool_call>{"name": "ls", "arguments": {}}</tool_call> and then'
    assert hermes.parse(text) == ParsedAction(text, [], [])


def test_hermes_reasoning_tags_none_counts_every_call():
    text = '<think><tool_call>{"name": "ls", "arguments": {}}</tool_call></think>'
    parsed = get_parser("hermes", reasoning_tags=None).parse(text)
    assert parsed == ParsedAction("<think></think>", [call(0, "ls", "{}")], [])


def test_hermes_arguments_string_holding_json_is_decoded_once():
    text = '<tool_call>{"name": "f", "arguments": "{\\"q\\": \\"12345\\", \\"n\\": 2}"}</tool_call>'
    assert hermes.parse(text).calls == [call(0, "f", '{"q": "12345", "n": 2}')]
    # Encoded twice: decoding once leaves a string, which is not an object.
    twice = json.dumps({"name": "f", "arguments": json.dumps(json.dumps({"q": 1}))})
    assert hermes.parse(f"<tool_call>{twice}</tool_call>") == ParsedAction(
        "", [], ["tool call 1 (f): arguments must be a JSON object; got a string holding a string"]
    )


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ("[1, 2]", "arguments must be a JSON object, got an array"),
        ('"x"', "arguments is a string that is not valid JSON (Expecting value): 'x'"),
        ('"[1]"', "arguments must be a JSON object; got a string holding an array"),
        ('"3"', "arguments must be a JSON object; got a string holding a number"),
        ("3", "arguments must be a JSON object, got a number"),
        ("2.5", "arguments must be a JSON object, got a number"),
        ("null", "arguments must be a JSON object, got null"),
        ('"null"', "arguments must be a JSON object; got a string holding null"),
        ("true", "arguments must be a JSON object, got a boolean"),
    ],
)
def test_hermes_non_object_arguments_are_errors(arguments, error):
    text = f'<tool_call>{{"name": "f", "arguments": {arguments}}}</tool_call>'
    assert hermes.parse(text) == ParsedAction("", [], [f"tool call 1 (f): {error}"])


def test_hermes_missing_arguments_mean_no_arguments_and_parameters_is_accepted():
    text = (
        '<tool_call>{"name": "now"}</tool_call><tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>'
    )
    assert hermes.parse(text).calls == [call(0, "now", "{}"), call(1, "f", '{"x": 1}')]


def test_hermes_bad_name_is_an_error():
    text = (
        '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": 3}</tool_call><tool_call>[]</tool_call>'
    )
    assert hermes.parse(text).errors == [
        'tool call 1: "name" must be a non-empty string, got null',
        'tool call 2: "name" must be a non-empty string, got a number',
        'tool call 3: expected a JSON object {"name": ..., "arguments": {...}}, got an array',
    ]


def test_hermes_invalid_json_is_an_error_and_later_calls_still_count():
    text = (
        '<tool_call>{"name": "f", "arguments": {"x": }}</tool_call>'
        '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    )
    parsed = hermes.parse(text)
    # Each attempt's id is its position among the turn's attempts: g, written second, is call_1.
    assert parsed == ParsedAction(
        "",
        [call(1, "g", "{}")],
        [
            'tool call 1: invalid JSON in <tool_call> (Expecting value): \'{"name": "f", "arguments": {"x": }}\''
        ],
    )
    # The malformed block as written, under the id its error answers (no JSON, so no readable name).
    assert parsed.error_calls == [call(0, "invalid", '{"name": "f", "arguments": {"x": }}')]
    assert parsed.all_calls() == [parsed.error_calls[0], parsed.calls[0]]



def test_hermes_empty_block_is_an_error_and_later_calls_still_count():
    # Regression (fresh-user walk): "<tool_call></tool_call>" read as text, so the turn had no call
    # and the env scored it as the final answer, ending the episode.
    text = 'Let me check. <tool_call></tool_call> <tool_call>\n</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>'
    parsed = hermes.parse(text)
    empty = 'empty <tool_call> block (expected {"name": ..., "arguments": {...}})'
    assert parsed == ParsedAction("Let me check.", [call(2, "g", "{}")], [f"tool call 1: {empty}", f"tool call 2: {empty}"])
    assert parsed.error_calls == [call(0, "invalid", ""), call(1, "invalid", "")]
    assert parsed.all_calls() == [*parsed.error_calls, parsed.calls[0]]

def test_hermes_invalid_backslash_escape_is_repaired():
    # JSON has no "\d" escape; the only sensible reading is a literal backslash (a regex here).
    text = r'<tool_call>{"name": "grep", "arguments": {"pattern": "\d+\.txt", "path": "C:\data"}}</tool_call>'
    parsed = hermes.parse(text)
    assert parsed.errors == []
    assert parsed.calls == [call(0, "grep", r'{"pattern": "\\d+\\.txt", "path": "C:\\data"}')]
    assert json.loads(parsed.calls[0]["function"]["arguments"]) == {
        "pattern": "\\d+\\.txt",
        "path": "C:\\data",
    }


def test_hermes_valid_escapes_are_untouched_and_raw_newlines_accepted():
    text = (
        '<tool_call>{"name": "w", "arguments": {"s": "a\\\\d\\n\\u00e9", "code": "x = 1\ny = 2"}}</tool_call>'
    )
    assert json.loads(hermes.parse(text).calls[0]["function"]["arguments"]) == {
        "s": "a\\d\né",
        "code": "x = 1\ny = 2",
    }


def test_hermes_close_tag_inside_an_argument_string_does_not_end_the_block():
    text = '<tool_call>{"name": "echo", "arguments": {"text": "a </tool_call> b"}}</tool_call> done'
    assert hermes.parse(text) == ParsedAction("done", [call(0, "echo", '{"text": "a </tool_call> b"}')], [])


def test_hermes_text_after_the_last_call_is_content():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>\nI will wait for the result.'
    assert hermes.parse(text) == ParsedAction("I will wait for the result.", [call(0, "f", "{}")], [])


def test_hermes_missing_close_tag_is_tolerated_when_the_object_is_complete():
    # Generation often stops on "</tool_call>" as a stop string, so the tag never appears.
    text = '<tool_call>{"name": "f", "arguments": {"a": 1}}\n'
    assert hermes.parse(text) == ParsedAction("", [call(0, "f", '{"a": 1}')], [])


def test_hermes_junk_between_object_and_close_tag_is_an_error():
    text = '<tool_call>{"name": "f", "arguments": {}}}</tool_call>'
    assert hermes.parse(text) == ParsedAction(
        "", [], ["tool call 1: unexpected text after the JSON object in <tool_call>: '}'"]
    )


def test_hermes_openai_shaped_object_and_nan():
    text = (
        '<tool_call>{"type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 1}"}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": {"x": NaN}}</tool_call>'
    )
    assert hermes.parse(text) == ParsedAction(
        "",
        [call(0, "f", '{"a": 1}')],
        [
            "tool call 2: invalid JSON in <tool_call> (NaN is not valid JSON): "
            '\'{"name": "g", "arguments": {"x": NaN}}\''
        ],
    )


def test_hermes_unterminated_block_reports_and_stops_at_the_next_block():
    text = '<tool_call>{"name": "f", "arguments": {"a": "unterminated<tool_call>{"name": "g"}</tool_call>'
    # The string "unterminated<tool_call>{" closes at the quote before `name`, so the decoder stops
    # there; the broken block then ends at the next "<tool_call>", and that block is read normally.
    parsed = hermes.parse(text)
    assert parsed == ParsedAction(
        "",
        [call(1, "g", "{}")],
        [
            "tool call 1: invalid JSON in <tool_call> (Expecting ',' delimiter): "
            '\'{"name": "f", "arguments": {"a": "unterminated\''
        ],
    )
    assert parsed.error_calls == [call(0, "invalid", '{"name": "f", "arguments": {"a": "unterminated')]


# ---- Llama 3 JSON --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "f", "parameters": {"a": 1}}',
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}',
        '  {"name": "f", "arguments": {"a": 1}}  ',
        '[{"name": "f", "parameters": {"a": 1}}]',
        '```json\n{"name": "f", "parameters": {"a": 1}}\n```',
        '<think>call {"name": "g", "parameters": {}}?</think>\n{"name": "f", "parameters": {"a": 1}}',
        '{"name": "f", "parameters": "{\\"a\\": 1}"}',
    ],
)
def test_json_single_call_forms(text):
    assert llama_json.parse(text).calls == [call(0, "f", '{"a": 1}')]
    assert llama_json.parse(text).errors == []


def test_json_several_calls_in_order_and_trailing_text():
    text = '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}\nDone.'
    assert llama_json.parse(text) == ParsedAction("Done.", [call(0, "f", '{"a": 1}'), call(1, "g", "{}")], [])
    listed = '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]'
    assert llama_json.parse(listed).calls == [call(0, "f", '{"a": 1}'), call(1, "g", "{}")]


def test_json_fenced_calls_keep_the_prose_and_allow_fences_in_strings():
    text = 'Sure.\n```json\n{"name": "f", "arguments": {"md": "```py\\nx\\n```"}}\n```\nThanks.'
    assert llama_json.parse(text) == ParsedAction(
        "Sure.\n\nThanks.", [call(0, "f", '{"md": "```py\\nx\\n```"}')], []
    )


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 42.",
        '{"answer": 42}',  # JSON, but not a call
        "[1, 2, 3] are the numbers",
        "[citation needed]",
        'See {"name": "f", "parameters": {}} for details',  # not at the start, not fenced: prose
        '```json\n{"result": 1}\n```',
        '<think>{"name": "f", "parameters": {}}</think>',
        '<think>{"name": "f", "parameters": {}}',
    ],
)
def test_json_prose_is_not_a_call(text):
    assert llama_json.parse(text) == ParsedAction(text.strip(), [], [])


def test_json_broken_call_is_an_error():
    text = '{"name": "f", "parameters": {"a": 1,}}'
    assert llama_json.parse(text) == ParsedAction(
        "",
        [],
        ["tool call 1: invalid JSON (Expecting property name enclosed in double quotes): " + repr(text)],
    )


def test_json_non_object_parameters_are_errors():
    text = '[{"name": "f", "parameters": [1]}, {"name": "g", "parameters": {}}]'
    parsed = llama_json.parse(text)
    assert parsed == ParsedAction(
        "", [call(1, "g", "{}")], ["tool call 1 (f): arguments must be a JSON object, got an array"]
    )
    assert parsed.all_calls() == [call(0, "f", "[1]"), call(1, "g", "{}")]


def test_json_broken_second_call_is_an_error_and_the_first_still_counts():
    text = '{"name": "a", "parameters": {}}; {"name": "b", bad}'
    assert llama_json.parse(text) == ParsedAction(
        "",
        [call(0, "a", "{}")],
        [
            'tool call 2: invalid JSON (Expecting property name enclosed in double quotes): \'{"name": "b", bad}\''
        ],
    )


def test_deep_nesting_is_an_error_not_a_crash():
    deep = "[" * 5000 + "]" * 5000  # deeper than the JSON decoder's recursion allows
    parsed = hermes.parse(f'<tool_call>{{"name": "f", "arguments": {{"a": {deep}}}}}</tool_call>')
    assert parsed.errors == [
        "tool call 1: invalid JSON in <tool_call> (JSON nested too deeply): "
        + repr('{"name": "f", "arguments": {"a": ' + "[" * 84 + "...")
    ]
    # The history keeps the whole block as written, not the error's snippet of it.
    assert parsed.error_calls == [call(0, "invalid", '{"name": "f", "arguments": {"a": ' + deep + "}}")]
    assert (
        llama_json.parse('{"name": "f", "parameters": ' + deep + "}")
        .errors[0]
        .startswith("tool call 1: invalid JSON (JSON nested too deeply)")
    )
    assert (
        pythonic.parse("[f(a=" + "[" * 300 + "]" * 300 + ")]")
        .errors[0]
        .startswith("tool call 1: invalid Python call list (too many nested parentheses)")
    )
    for parser in (hermes, llama_json, pythonic):
        assert parser.parse("[" * 100_000).calls == []


# ---- pythonic ------------------------------------------------------------------------------------


def test_pythonic_two_calls_with_literals():
    text = '[get_weather(city="Paris, \\"FR\\"", days=3), search(q="a]b", tags=("x", "y"), opts={"k": None})]'
    assert pythonic.parse(text) == ParsedAction(
        "",
        [
            call(0, "get_weather", '{"city": "Paris, \\"FR\\"", "days": 3}'),
            call(1, "search", '{"q": "a]b", "tags": ["x", "y"], "opts": {"k": null}}'),
        ],
        [],
    )


def test_pythonic_text_after_the_list_and_llama4_tags():
    assert pythonic.parse("[now()] and then I will answer.") == ParsedAction(
        "and then I will answer.", [call(0, "now", "{}")], []
    )
    assert pythonic.parse("<|python_start|>[now(tz='UTC')]<|python_end|>").calls == [
        call(0, "now", '{"tz": "UTC"}')
    ]


def test_pythonic_call_inside_think_is_not_a_call():
    text = "<think>[delete(path='/')] would be bad</think>\n[ls(path='.')]"
    assert pythonic.parse(text).calls == [call(0, "ls", '{"path": "."}')]
    assert pythonic.parse("<think>[delete(path='/')]").calls == []


def test_pythonic_never_evaluates(capsys, tmp_path):
    marker = tmp_path / "pwned"
    text = f"[f(a=print('side effect')), g(b=open({str(marker)!r}, 'w')), h(c=__import__('os').getcwd())]"
    parsed = pythonic.parse(text)
    assert parsed.calls == []
    assert parsed.errors == [
        f"tool call {i} ({n}): argument {a!r} is not a literal (use strings, numbers, True/False/None, lists and dicts)"
        for i, n, a in [(1, "f", "a"), (2, "g", "b"), (3, "h", "c")]
    ]
    assert capsys.readouterr().out == ""
    assert not marker.exists()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[f(1)]", "tool call 1 (f): positional arguments are not supported; write name=value"),
        ("[f(**{'a': 1})]", "tool call 1 (f): ** unpacking is not supported; write name=value"),
        ("[f(a={1, 2})]", "tool call 1 (f): argument 'a': a set is not a JSON value"),
        ("[f(a=1e999)]", "tool call 1 (f): argument 'a': inf is not a JSON number"),
        ("[f(a={1: 2})]", "tool call 1 (f): argument 'a': object keys must be strings, got 1"),
        ("[f(a=b'x')]", "tool call 1 (f): argument 'a': a bytes is not a JSON value"),
        ("[f()(a=1)]", "tool call 1: the function must be a plain name, got 'f()'"),
        ("[f(), 3]", "tool call 2: expected a call like name(arg=value), got '3'"),
        ("[f(a=1, a=2)]", "tool call 1 (f): argument 'a' is given twice"),
        ("[f(a=1", "tool call 1: invalid Python call list ('(' was never closed): '[f(a=1'"),
    ],
)
def test_pythonic_errors(text, error):
    assert error in pythonic.parse(text).errors


def test_pythonic_dotted_names_are_returned_as_written():
    # The parser does not know the tools; the env rejects "os.system" as an unknown tool.
    assert pythonic.parse("[os.system(command='ls')]").calls == [call(0, "os.system", '{"command": "ls"}')]


@pytest.mark.parametrize(
    "text", ["[1, 2]", "[1] Smith et al.", "[x for x in y]", "The answer is [f(1)]", "[see below"]
)
def test_pythonic_prose_is_not_a_call(text):
    assert pythonic.parse(text) == ParsedAction(text, [], [])


# ---- OpenAI structured ---------------------------------------------------------------------------


def test_openai_message_keeps_server_ids_and_validates_arguments():
    msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "chatcmpl-tool-9", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
            {"type": "function", "function": {"name": "g", "arguments": json.dumps(json.dumps({"b": 2}))}},
            {"id": "x", "type": "function", "function": {"name": "h", "arguments": "[1]"}},
            {"id": "y", "type": "function", "function": {"name": "i", "arguments": "{oops"}},
            {"id": "z", "type": "function", "function": {"name": "j", "arguments": {"c": 3}}},
            {"id": "w", "type": "function", "function": {"name": "k", "arguments": ""}},
            {"id": "v"},
        ],
    }
    assert parse_openai_message(msg) == ParsedAction(
        "",
        [
            {"id": "chatcmpl-tool-9", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
            call(1, "g", '{"b": 2}'),  # no server id: call_<index among calls>
            {"id": "z", "type": "function", "function": {"name": "j", "arguments": '{"c": 3}'}},
            {"id": "w", "type": "function", "function": {"name": "k", "arguments": "{}"}},
        ],
        [
            "tool call 3 (h): arguments must be a JSON object, got an array",
            "tool call 4: arguments are not valid JSON (Expecting property name enclosed in double quotes): '{oops'",
            'tool call 7: expected {"function": {"name": ..., "arguments": ...}}',
        ],
        ["x", "y", "v"],  # each error answers its server id
    )


def test_openai_parser_text_has_no_calls():
    parser = get_parser("openai")
    text = '<tool_call>{"name": "f"}</tool_call>'
    assert parser.parse(text) == ParsedAction(text, [], [])
    assert parser.parse_message(
        {"role": "assistant", "content": " hi ", "tool_calls": "nope"}
    ) == ParsedAction("hi", [], ["tool_calls must be a list, got a string"], [None])


def test_get_parser():
    assert sorted(PARSERS) == ["hermes", "json", "openai", "pythonic"]
    for name in PARSERS:
        assert get_parser(name).name == name
    with pytest.raises(
        ValueError, match=r"unknown tool-call parser 'qwen'; choose one of \['hermes', 'json'"
    ):
        get_parser("qwen")
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        hermes.parse(b"<tool_call>")


# ---- through the env -----------------------------------------------------------------------------


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: The text.
    """
    return text.upper()


class EchoEnv(ChatEnv):
    """One task; tools add and shout; any answer ends the episode with reward 0."""

    def load_tasks(self, split):
        return [{"task_id": "t0", "question": "hi"}]

    def initial_messages(self, task):
        return [M.system("You have tools."), M.user(task["question"])]

    async def score(self, turn):
        return StepOutcome(reward=0.0, terminated=True)


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (
            "hermes",
            '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
            '<tool_call>{"name": "shout", "arguments": {"text": "ok"}}</tool_call>',
        ),
        (
            "json",
            '[{"name": "add", "parameters": {"a": 2, "b": 3}}, {"name": "shout", "parameters": {"text": "ok"}}]',
        ),
        ("pythonic", '[add(a=2, b=3), shout(text="ok")]'),
    ],
)
def test_two_calls_get_two_tool_results_in_order(parser, text):
    env = EchoEnv(tools=[add, shout], parser=parser)
    try:
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(text)
        assert obs == [
            {"role": "tool", "content": "5", "tool_call_id": "call_0", "name": "add"},
            {"role": "tool", "content": "OK", "tool_call_id": "call_1", "name": "shout"},
        ]
        assert (reward, terminated, truncated, info["tool_calls"], info["tool_errors"]) == (
            0.0,
            False,
            False,
            2,
            0,
        )
        assert env.messages[2]["tool_calls"] == [
            call(0, "add", '{"a": 2, "b": 3}'),
            call(1, "shout", '{"text": "ok"}'),
        ]
    finally:
        env.close()


@pytest.mark.parametrize(
    ("parser", "text", "name"),
    [
        (
            "hermes",
            '<tool_call>{"name": "os.system", "arguments": {"command": "touch {marker}"}}</tool_call>',
            "os.system",
        ),
        (
            "hermes",
            '<tool_call>{"name": "eval", "arguments": {"source": "open({marker!r}, \'w\')"}}</tool_call>',
            "eval",
        ),
        ("json", '{"name": "print", "parameters": {"value": "side effect"}}', "print"),
        ("pythonic", "[os.system(command='touch {marker}')]", "os.system"),
        ("pythonic", "[exec(source=\"open({marker!r}, 'w')\")]", "exec"),
    ],
)
def test_unknown_tool_executes_nothing_and_lists_the_tools(parser, text, name, tmp_path, capfd):
    marker = str(tmp_path / "pwned")
    env = EchoEnv(tools=[add, shout], parser=parser)
    try:
        env.reset(seed=0)
        obs, _, terminated, _, info = env.step(
            text.replace("{marker}", marker).replace("{marker!r}", repr(marker))
        )
        assert obs == [
            {
                "role": "tool",
                "content": f"Error: unknown tool {name!r}. Available tools: add, shout.",
                "tool_call_id": "call_0",
                "name": name,
            }
        ]
        assert (terminated, info["tool_errors"]) == (False, 1)
    finally:
        env.close()
    assert not (tmp_path / "pwned").exists()
    assert "side effect" not in capfd.readouterr().out


def test_parse_errors_reach_the_model_through_the_env():
    env = EchoEnv(tools=[add], parser="hermes")
    try:
        env.reset(seed=0)
        obs, _, terminated, _, info = env.step('<tool_call>{"name": "add", "arguments": [2, 3]}</tool_call>')
        assert obs == [
            {
                "role": "tool",
                "content": "Error: could not parse tool call: tool call 1 (add): arguments must be a JSON object, "
                "got an array. Available tools: add.",
                "tool_call_id": "call_0",
            }
        ]
        assert (terminated, info["tool_calls"], info["tool_errors"]) == (False, 0, 1)
    finally:
        env.close()


def test_structured_server_calls_are_validated_through_the_env():
    env = EchoEnv(tools=[add], parser="openai")
    try:
        env.reset(seed=0)
        action = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "srv-1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '"{\\"a\\": 1, \\"b\\": 1}"'},
                },
                {"id": "srv-2", "type": "function", "function": {"name": "add", "arguments": "null"}},
            ],
        }
        obs, *_ = env.step(action)
        assert [m["content"] for m in obs] == [
            "2",
            "Error: could not parse tool call: tool call 2 (add): arguments must be a JSON object, got null. "
            "Available tools: add.",
        ]
        assert obs[0]["tool_call_id"] == "srv-1"
    finally:
        env.close()


# ---- fuzzing -------------------------------------------------------------------------------------

# Fragments that steer random text into every branch (tags, JSON and Python syntax, escapes).
_FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<|python_tag|>",
    "<|python_start|>",
    "<|python_end|>",
    "```json\n",
    "```",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    '"',
    "'",
    "\\",
    "\\d",
    "\\u12",
    ":",
    ",",
    ";",
    "=",
    " ",
    "\n",
    '"name"',
    '"arguments"',
    '"parameters"',
    '"function"',
    "f",
    "os.system",
    "NaN",
    "null",
    "1e999",
    "9" * 30,
    "**",
    "set()",
    "b''",
    "a=",
    "True",
]
# Openings that get past each format's first check, so the fuzzer reaches the deep branches.
_STARTS = [
    "",
    '<tool_call>{"name": "f", "arguments": ',
    '{"name": "f", "parameters": ',
    '[{"name": "f", "arguments": ',
    '```json\n{"name": "f", "arguments": ',
    "[f(a=",
    "[f(",
    "[os.system(",
    "<think>",
    "x</think>[g(b=",
]
_fragment_texts = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=4)), max_size=40).map(
    "".join
)
_texts = st.one_of(
    st.text(max_size=200),
    _fragment_texts,
    st.tuples(st.sampled_from(_STARTS), _fragment_texts).map("".join),
)


def _check_shape(parsed: ParsedAction) -> None:
    assert isinstance(parsed.content, str)
    assert all(isinstance(e, str) and e for e in parsed.errors)
    # Every call and every error has one place in the order written.
    assert len(parsed.error_positions) == len(parsed.errors)
    order = parsed.in_order()
    assert [i for kind, i in order if kind == "call"] == list(range(len(parsed.calls)))
    assert [i for kind, i in order if kind == "error"] == list(range(len(parsed.errors)))
    assert [p for p, (kind, _) in enumerate(order) if kind == "error"] == parsed.error_positions
    for c in parsed.calls:
        assert c["type"] == "function"
        assert isinstance(c["function"]["name"], str) and c["function"]["name"]
        assert isinstance(json.loads(c["function"]["arguments"]), dict)
    # The history's calls: one per attempt, id call_<position>, every error recorded with a
    # non-empty name and string arguments (what a chat API requires of a tool_call).
    history = parsed.all_calls()
    assert [c["id"] for c in history] == [f"call_{p}" for p in range(len(order))]
    assert [history[p] for p, (kind, _) in enumerate(order) if kind == "call"] == parsed.calls
    assert [history[p] for p in parsed.error_positions] == parsed.error_calls
    for c in parsed.error_calls:
        assert c["type"] == "function" and isinstance(c["function"]["arguments"], str)
        assert isinstance(c["function"]["name"], str) and c["function"]["name"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_texts, name=st.sampled_from(sorted(PARSERS)))
def test_fuzz_parsers_never_raise(text, name):
    _check_shape(get_parser(name).parse(text))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["id", "type", "function"]),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                lambda c: (
                    st.lists(c, max_size=3)
                    | st.dictionaries(st.sampled_from(["name", "arguments"]), c, max_size=2)
                ),
                max_leaves=6,
            ),
        ),
        max_size=4,
    )
)
def test_fuzz_openai_tool_calls_never_raise(tool_calls):
    parsed = parse_openai_message({"role": "assistant", "content": "", "tool_calls": tool_calls})
    for c in parsed.calls:
        assert isinstance(json.loads(c["function"]["arguments"]), dict)


# Round trips: a call written by an independent encoder (json.dumps / repr) parses back to itself.
# Strings exclude the reasoning tags: a "</think>" inside an argument would end template-opened
# reasoning (the documented rule, shared with vLLM's reasoning parsers).
_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s)
)
_strings = st.text(max_size=12).filter(lambda s: "think>" not in s)
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _strings,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(_strings, c, max_size=3),
    max_leaves=8,
)
_arguments = st.dictionaries(_names, _json_values, max_size=4)


@settings(max_examples=100, deadline=None)
@given(name=_names, args=_arguments, prose=_strings.filter(lambda s: "<tool_call>" not in s))
def test_roundtrip_hermes(name, args, prose):
    text = f"{prose}<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
    parsed = hermes.parse(text)
    assert parsed.errors == []
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.calls] == [
        (name, args)
    ]
    assert parsed.content == prose.strip()


@settings(max_examples=100, deadline=None)
@given(calls=st.lists(st.tuples(_names, _arguments), min_size=1, max_size=3))
def test_roundtrip_json(calls):
    text = json.dumps([{"name": n, "parameters": a} for n, a in calls])
    parsed = llama_json.parse(text)
    assert parsed.errors == []
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.calls] == calls


@settings(max_examples=100, deadline=None)
@given(calls=st.lists(st.tuples(_names, _arguments), min_size=1, max_size=3))
def test_roundtrip_pythonic(calls):
    # repr() of JSON-like Python values is a Python literal (floats repr round-trip exactly).
    text = "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in calls) + "]"
    parsed = pythonic.parse(text)
    assert parsed.errors == []
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.calls]
    assert got == calls
    assert not any(isinstance(v, float) and not math.isfinite(v) for _, a in got for v in a.values())


_suffixes = st.one_of(st.text(max_size=40), _fragment_texts).filter(
    lambda s: (
        not any(t in s for t in ("<tool_call>", "think>"))
        and not s.lstrip().startswith(("{", "[", ";", "<|"))
    )
)


@settings(max_examples=100, deadline=None)
@given(suffix=_suffixes, fmt=st.sampled_from(["hermes", "json", "pythonic"]))
def test_fuzz_text_after_the_last_call_is_content(suffix, fmt):
    head = {
        "hermes": '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
        "json": '{"name": "f", "parameters": {"a": 1}}',
        "pythonic": "[f(a=1)]",
    }[fmt]
    assert get_parser(fmt).parse(head + " " + suffix) == ParsedAction(
        suffix.strip(), [call(0, "f", '{"a": 1}')], []
    )


def test_generated_call_ids_never_take_a_servers_id_of_the_same_turn():
    # Regression: a call the server sent without an id got call_<position>, which another call of
    # the turn could already carry as its server id: two tool messages then answered one id.
    bad_then_named = [
        {"type": "function", "function": {"name": "add", "arguments": "{bad"}},
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
    ]
    named_then_bare = [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
        {"type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}},
    ]
    # The generated id takes the next free number (it was call_0_ and call_1_, a suffix).
    for tool_calls, ids in ((bad_then_named, ["call_1", "call_0"]), (named_then_bare, ["call_1", "call_2"])):
        parsed = parse_openai_message({"role": "assistant", "content": "", "tool_calls": tool_calls})
        assert [c["id"] for c in parsed.all_calls()] == ids
    # The valid calls alone, as parse_openai_tool_calls returns them, by the same rule.
    assert [c["id"] for c in parse_openai_tool_calls(named_then_bare)[0]] == ["call_1", "call_2"]


def test_a_server_id_that_repeats_gets_a_made_id_within_the_turn_and_across_turns():
    # Regression: parse_openai_message kept every server id, so two calls of one turn sharing "dup",
    # or a turn reusing an id of an earlier turn, left two tool results answering one id. The first
    # use keeps its id; a repeat gets call_<n> by the rule of ids the parser makes (as
    # OpenAIChatEngine.parse_response does).
    dup_bad = {"id": "dup", "type": "function", "function": {"name": "add", "arguments": "{bad"}}
    turn1 = [
        {"id": "dup", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
        dup_bad,
        {"id": "fresh", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}},
    ]
    first = parse_openai_message({"role": "assistant", "content": "", "tool_calls": turn1})
    assert [c["id"] for c in first.all_calls()] == ["dup", "call_1", "fresh"]
    # The malformed repeat no longer answers the server's "dup": its error answers call_1.
    assert first.error_ids == [None]
    assert first.error_call(0) == {
        "id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{bad"}}
    assert [c["id"] for c in parse_openai_tool_calls(turn1[:1] * 2)[0]] == ["dup", "call_1"]
    history = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": "", "tool_calls": first.all_calls()},
        *({"role": "tool", "content": "ok", "tool_call_id": i} for i in ("dup", "call_1", "fresh")),
    ]
    # Turn 2 holds attempts 3-5; "fresh" is the history's, the second "other" the turn's.
    turn2 = [
        {"id": i, "type": "function", "function": {"name": "add", "arguments": '{"a": 3}'}}
        for i in ("fresh", "other", "other")
    ]
    second = parse_openai_message({"role": "assistant", "content": "", "tool_calls": turn2})
    assert [c["id"] for c in second.calls] == ["fresh", "other", "call_2"]
    assert [c["id"] for c in second.numbered_after(history).calls] == ["call_3", "other", "call_5"]
