"""The shipped ChatML + hermes tools template: exact rendering, prefix preservation, selection rule."""

from __future__ import annotations

import json

import pytest

from chatgym.envs.messages import assistant, make_tool_call, system, tool, user
from chatgym.trainer.chat.tokenizer import (
    builtin_template,
    get_tokenizer,
    resolve_chat_template,
    template_supports_tools,
)

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two ints.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
ECHO_TOOL = {
    "type": "function",
    "function": {"name": "echo", "description": "Echo.", "parameters": {"type": "object", "properties": {}}},
}

TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(ADD_TOOL)
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("smollm2")


def render(tok, messages, tools=None, gen=False):
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)


def tool_conversation():
    return [
        system("Be brief."),
        user("12+7?"),
        assistant("", [make_tool_call("add", {"a": 12, "b": 7}, "c1")]),
        tool("19", "c1"),
        assistant(
            "It is 19.", [make_tool_call("add", {"a": 19, "b": 0}, "c2"), make_tool_call("echo", {}, "c3")]
        ),
        tool("19", "c2"),
        tool("", "c3"),
        user("Thanks"),
        assistant("19"),
    ]


def test_exact_rendering_of_a_tool_conversation(tok):
    messages = tool_conversation()[:5]
    expected = (
        "<|im_start|>system\nBe brief.\n\n" + TOOLS_BLOCK + "<|im_end|>\n"
        "<|im_start|>user\n12+7?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n19\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nIt is 19.\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 19, "b": 0}}\n</tool_call>\n'
        '<tool_call>\n{"name": "echo", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>assistant\n"
    )
    assert render(tok, messages, [ADD_TOOL], gen=True) == expected


def test_tools_without_a_system_message_get_their_own_system_turn(tok):
    assert render(tok, [user("hi")], [ADD_TOOL]) == (
        "<|im_start|>system\n" + TOOLS_BLOCK + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    )


def test_no_tools_is_plain_chatml_without_a_default_system_prompt(tok):
    assert render(tok, [user("hi")], gen=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (
        render(tok, [system("S"), user("hi")])
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    )


def test_arguments_as_json_text_or_object_render_the_same(tok):
    as_text = assistant("", [make_tool_call("add", {"a": 1, "b": 2}, "c")])
    as_obj = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
    }
    text = render(tok, [user("q"), as_text])
    assert text == render(tok, [user("q"), as_obj])
    assert '"arguments": {"a": 1, "b": 2}' in text  # the object, never a double-encoded string
    assert '"{\\"a' not in text


@pytest.mark.parametrize("with_tools", [True, False])
@pytest.mark.parametrize("drop_system", [True, False])
def test_prefix_preserving_for_every_k(tok, with_tools, drop_system):
    messages = tool_conversation()[1:] if drop_system else tool_conversation()
    tools = [ADD_TOOL, ECHO_TOOL] if with_tools else None
    for k in range(1, len(messages)):
        shorter, longer = render(tok, messages[:k], tools), render(tok, messages[: k + 1], tools)
        assert longer.startswith(shorter), k
        assert len(longer) > len(shorter), k
        if messages[k]["role"] == "assistant":
            # The generation prompt is exactly how the next assistant turn starts.
            assert longer.startswith(render(tok, messages[:k], tools, gen=True)), k


def test_prefix_preserving_in_tokens(tok):
    """The collector appends deltas as tokens: the token ids must be prefixes too, not just the text."""
    messages = tool_conversation()
    for k in range(1, len(messages)):
        shorter = tok(render(tok, messages[:k], [ADD_TOOL]), add_special_tokens=False).input_ids
        longer = tok(render(tok, messages[: k + 1], [ADD_TOOL]), add_special_tokens=False).input_ids
        assert longer[: len(shorter)] == shorter, k


def test_special_tokens_are_single_ids(tok):
    ids = tok(render(tok, [user("hi")], gen=True), add_special_tokens=False).input_ids
    # <|im_start|> = 1, "user" = 4093, "\n" = 198, "hi" = 6004, <|im_end|> = 2, "assistant" = 520 9531
    assert ids == [1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198]


def test_template_from_a_jinja_file(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].content }}")
    assert resolve_chat_template(None, str(path)) == "{{ messages[0].content }}"


SMOLLM2_OWN_PROMPT = (  # SmolLM2's own template, read by hand: a default system turn, tools ignored
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
)


def test_model_is_the_models_own_template_where_get_tokenizer_put_chatml_tools_in_its_place(tok):
    # The failure: get_tokenizer("smollm2") swaps chatml_tools in for SmolLM2's template (which
    # ignores tools), and "model" was then resolved against the tokenizer's template: it rendered the
    # "# Tools" prompt of "auto", while `chatgym rollout --chat-template model` rendered SmolLM2's own.
    from transformers import AutoTokenizer

    from chatgym.trainer.chat.delta import ChatRenderer
    from chatgym.trainer.models.packaged import load_model_path

    own = AutoTokenizer.from_pretrained(load_model_path("smollm2")).chat_template
    assert tok.chat_template == builtin_template()  # the Trainer's tokenizer: chatml_tools swapped in
    messages = [user("hi")]
    expected = tok.apply_chat_template(messages, tools=[ADD_TOOL], chat_template=own, tokenize=False,
                                       add_generation_prompt=True)
    assert expected == SMOLLM2_OWN_PROMPT
    renderer = ChatRenderer(tok, "model")
    assert renderer.chat_template == own
    assert renderer.render(messages, [ADD_TOOL], add_generation_prompt=True) == SMOLLM2_OWN_PROMPT
    assert ChatRenderer(tok, "auto").render(messages, [ADD_TOOL], add_generation_prompt=True).startswith(
        "<|im_start|>system\n# Tools\n")
    # The same tokenizer, asked for "model" at load time, agrees.
    assert ChatRenderer(get_tokenizer("smollm2", "model"), "model").chat_template == own


def test_model_is_refused_for_a_model_without_a_template_even_where_chatml_tools_was_swapped_in(tmp_path):
    from cli_refusals import model_without_chat_template

    from chatgym.trainer.chat.delta import ChatRenderer

    no_template = get_tokenizer(model_without_chat_template(tmp_path))
    assert no_template.chat_template == builtin_template()  # "auto" gave it chatml_tools
    with pytest.raises(ValueError) as caught:
        ChatRenderer(no_template, "model")
    assert str(caught.value) == "chat_template='model' but the model's tokenizer has no chat template"


def test_selection_rule(tok):
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(tok.name_or_path).chat_template
    ours = builtin_template()
    assert not template_supports_tools(own)  # SmolLM2's template never reads `tools`
    assert template_supports_tools(ours)
    assert not template_supports_tools("{# tools #}{{ 'no tools here' }}")  # mentions, never reads
    assert not template_supports_tools(None)
    assert resolve_chat_template(own, "auto") == ours
    reads_tools = "{% for t in tools %}{{ t }}{% endfor %}"
    assert resolve_chat_template(reads_tools, "auto") == reads_tools  # a tool-aware model template wins
    assert resolve_chat_template(own, reads_tools) == reads_tools  # a template string is used as given
    assert resolve_chat_template(own, "model") == own
    assert tok.chat_template == ours
    assert get_tokenizer("smollm2", chat_template="model").chat_template == own
    with pytest.raises(FileNotFoundError, match="chatml_tools"):
        resolve_chat_template(own, "no_such_template")
    with pytest.raises(ValueError, match="no chat template"):
        resolve_chat_template(None, "model")
