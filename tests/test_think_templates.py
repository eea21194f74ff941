"""Think-stripping templates (Qwen3, QwQ) run token-exact in the collector.

Qwen3's stock template drops the ``<think>`` block of an assistant turn once a later user query
follows (and gives the last assistant message an empty one); QwQ's drops every turn's reasoning and
opens ``<think>\\n`` in the generation prompt. Neither is prefix-preserving, so history deltas
cannot serve them; the probe picks ``"base"`` deltas: the model's sampled ids are kept for every turn and
each observation is the new messages rendered after a fixed base conversation.

The templates are the models' own text (trainer/chat/templates/qwen3.jinja, qwq.jinja) on SmolLM2's
tokenizer, whose ``<|im_start|>`` / ``<|im_end|>`` ids (1, 2) are the ChatML ones: what is under test
is the template logic. Expected streams are written out by hand from the templates' text.
"""

from __future__ import annotations

import pytest
from rollout_helpers import TASKS, AddEnv, OkEnv, tool_call_text

from chatgym.envs import messages as M
from chatgym.trainer.chat.delta import ChatRenderer
from chatgym.trainer.chat.template_probe import probe_template
from chatgym.trainer.chat.tokenizer import builtin_template, get_tokenizer, resolve_chat_template
from chatgym.trainer.engines.replay import ReplayEngine, replay_logprob, turn_script
from chatgym.trainer.rollout import Collector, RolloutConfig

IM_START, IM_END, NL = 1, 2, 198
HEADER = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("smollm2")


@pytest.fixture(scope="module")
def model_tok():
    return get_tokenizer("smollm2", chat_template="model")  # SmolLM2's own template


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def collector(tok, template: str, turns: list[list[int]]) -> Collector:
    engine = ReplayEngine(turn_script(turns, enc(tok, HEADER)), tok)
    return Collector(
        engine, tok, RolloutConfig(chat_template=builtin_template(template), episode_timeout_s=30.0)
    )


def test_shipped_templates_are_the_models_own_and_strip_thinking(tok):
    qwen3 = ChatRenderer(tok, builtin_template("qwen3"))
    # The rendering SkyRL documents for Qwen/Qwen3-0.6B's tokenizer (an empty think block is added to
    # the last assistant message).
    assert qwen3.render([M.user("Hi"), M.assistant("Hello")]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n"
    )
    conv = [M.user("Q1"), M.assistant("<think>\nR1\n</think>\n\nA1"), M.user("Q2")]
    # Once Q2 follows, A1's reasoning is gone: the rendering of history changed.
    assert qwen3.render(conv, add_generation_prompt=True) == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n"
    )
    assert qwen3.render(conv[:2]) == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>\n"
    )
    qwq = ChatRenderer(tok, builtin_template("qwq"))
    assert qwq.render(conv, add_generation_prompt=True) == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    # Both read `tools`, so chat_template="auto" keeps a Qwen3 / QwQ model's own template.
    for name in ("qwen3", "qwq"):
        assert resolve_chat_template(builtin_template(name), "auto") == builtin_template(name)
    assert get_tokenizer("smollm2", chat_template="qwen3").chat_template == builtin_template("qwen3")


@pytest.mark.parametrize(
    ("name", "mode"), [("chatml_tools", "history"), ("qwen3", "base"), ("qwq", "base"), ("model", "history")]
)
def test_probe_picks_the_delta_mode(tok, model_tok, name, mode):
    renderer = ChatRenderer(model_tok) if name == "model" else ChatRenderer(tok, builtin_template(name))
    probe = probe_template(renderer, [IM_END])
    assert (probe.delta_mode, probe.turn_suffix, probe.turn_suffix_ids, probe.checked_cuts) == (
        mode,
        "<|im_end|>\n",
        [IM_END, NL],
        3,
    )


def assert_no_turn_twice(tok, traj, thoughts: list[str]) -> None:
    text = tok.decode(traj.token_ids, skip_special_tokens=False)
    assert text.count(HEADER) == traj.num_turns
    for thought in thoughts:  # every turn's sampled reasoning is in the stream exactly once
        assert text.count(thought) == 1


async def test_qwen3_user_turns_keep_every_sampled_think_block(tok):
    turns = [
        [*enc(tok, "<think>\nFirst thought.\n</think>\n\nA1"), IM_END],
        [*enc(tok, "<think>\nSecond thought.\n</think>\n\nA2"), IM_END],
    ]
    col = collector(tok, "qwen3", turns)
    assert col.probe.delta_mode == "base"
    [traj] = await col.collect(lambda: OkEnv(max_turns=2), [0])
    assert traj.error is None, traj.error
    prompt = enc(tok, f"<|im_start|>user\n{TASKS[0]['question']}<|im_end|>\n{HEADER}")
    # After A1's <|im_end|>: the "\n" that closes the turn, the user's "ok", the next header.
    delta = [NL, *enc(tok, f"<|im_start|>user\nok<|im_end|>\n{HEADER}")]
    expected = prompt + turns[0] + delta + turns[1]
    assert traj.token_ids == expected
    mask = [0] * len(prompt) + [1] * len(turns[0]) + [0] * len(delta) + [1] * len(turns[1])
    assert traj.loss_mask == mask
    assert traj.engine_logprobs == [replay_logprob(t) if m else 0.0 for t, m in zip(expected, mask, strict=True)]
    assert_no_turn_twice(tok, traj, ["First thought.", "Second thought."])
    # The template's own re-rendering would have dropped the first thought; the stream kept the
    # sampled ids the model actually conditioned on.
    assert "First thought." not in ChatRenderer(tok, builtin_template("qwen3")).render(traj.messages)


async def test_qwen3_tool_turns_are_token_exact(tok):
    turns = [
        [*enc(tok, "<think>\nAdd 2 and 3.\n</think>\n\n" + tool_call_text("add", a=2, b=3)), IM_END],
        [*enc(tok, "<think>\nNow 5 and 4.\n</think>\n\n" + tool_call_text("add", a=5, b=4)), IM_END],
        [*enc(tok, "<think>\nDone.\n</think>\n\nThe answer is 9."), IM_END],
    ]
    col = collector(tok, "qwen3", turns)
    [traj] = await col.collect(AddEnv, [0])
    assert traj.error is None and traj.terminated and traj.reward == 1.0
    renderer = ChatRenderer(tok, builtin_template("qwen3"))
    env = AddEnv()
    prompt_text = renderer.render(env.initial_messages(TASKS[0]), env.tools, add_generation_prompt=True)
    assert prompt_text.startswith("<|im_start|>system\nYou add numbers with the add tool.\n\n# Tools\n\n")
    assert prompt_text.endswith(
        f"</tool_call><|im_end|>\n<|im_start|>user\n{TASKS[0]['question']}<|im_end|>\n{HEADER}"
    )
    prompt = enc(tok, prompt_text)

    def tool_delta(result: str) -> list[int]:
        # Qwen3 renders a tool result as a user turn wrapping it in <tool_response>.
        return [
            NL,
            *enc(tok, f"<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n{HEADER}"),
        ]

    expected = prompt + turns[0] + tool_delta("5") + turns[1] + tool_delta("9") + turns[2]
    assert traj.token_ids == expected
    assert sum(traj.loss_mask) == sum(len(t) for t in turns)
    assert_no_turn_twice(tok, traj, ["Add 2 and 3.", "Now 5 and 4.", "Done."])


async def test_qwq_generation_prompt_opens_the_think_block(tok):
    # QwQ's generation prompt ends with "<think>\n": the model samples the reasoning and "</think>".
    turns = [
        [*enc(tok, "First thought.\n</think>\n\nA1"), IM_END],
        [*enc(tok, "Second thought.\n</think>\n\nA2"), IM_END],
    ]
    col = collector(tok, "qwq", turns)
    assert col.probe.delta_mode == "base"
    [traj] = await col.collect(lambda: OkEnv(max_turns=2), [0])
    assert traj.error is None, traj.error
    prompt = enc(tok, f"<|im_start|>user\n{TASKS[0]['question']}<|im_end|>\n{HEADER}<think>\n")
    delta = [NL, *enc(tok, f"<|im_start|>user\nok<|im_end|>\n{HEADER}<think>\n")]
    assert traj.token_ids == prompt + turns[0] + delta + turns[1]
    assert traj.loss_mask == [0] * len(prompt) + [1] * len(turns[0]) + [0] * len(delta) + [1] * len(turns[1])
    assert_no_turn_twice(tok, traj, ["First thought.", "Second thought."])
    assert "First thought." not in ChatRenderer(tok, builtin_template("qwq")).render(traj.messages)


def test_a_template_name_or_path_in_the_config_is_resolved_everywhere(tok):
    # Regression: `rollout.chat_template=qwen3` (train/rollout/eval configs) reached the renderer as
    # the literal text "qwen3" and the probe refused it; only the CLI flag resolved names.
    qwen3 = builtin_template("qwen3")
    assert ChatRenderer(tok, "qwen3").chat_template == qwen3
    path = str(resolve_chat_template.__globals__["TEMPLATES_DIR"] / "qwq.jinja")
    assert ChatRenderer(tok, path).chat_template == builtin_template("qwq")
    assert ChatRenderer(tok, "auto").chat_template == resolve_chat_template(tok.chat_template, "auto")
    assert ChatRenderer(tok, qwen3).chat_template == qwen3  # template text is used as given
    collector = Collector(ReplayEngine(tok, {}), tok, RolloutConfig(chat_template="qwen3"))
    assert collector.renderer.chat_template == qwen3 and collector.probe.delta_mode == "base"
    collector.close()


def test_a_template_setting_that_names_nothing_fails_at_config_time():
    with pytest.raises(ValueError, match=r"RolloutConfig.chat_template: chat_template 'qwen4' is not shipped; "
                       r"choose one of \['chatml_tools', 'qwen3', 'qwq'\]"):
        RolloutConfig(chat_template="qwen4")
    with pytest.raises(ValueError, match=r"chat_template file '/nonexistent/t.jinja' does not exist"):
        RolloutConfig(chat_template="/nonexistent/t.jinja")
