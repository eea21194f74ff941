"""Token exactness over eleven published chat templates (tests/data/chat_templates/, SOURCES.md).

For every supported template, generated episodes run through the real Collector (scripted engine,
scripted env) and each trajectory must equal :func:`conformance_helpers.reference_ids` exactly: the
sampled ids with loss mask 1 and nothing else, and between them the template's own rendering of the
observations, cut from Hugging Face renderings of the whole conversation and encoded without
chatgym's renderer. Templates that cannot give such streams are refused when the Collector starts,
with the reason. The default suite runs a sample; ``-m slow`` runs 10,000+ trajectories.
"""

from __future__ import annotations

import time

import pytest
from conformance_helpers import STUB, collector_for, reference_ids, run_batch
from template_families import BY_NAME, FAMILIES, family_tokenizer

from chatgym.trainer.chat.delta import ChatRenderer
from chatgym.trainer.chat.template_probe import TemplateError, probe_template
from chatgym.trainer.engines.replay import replay_logprob

SUPPORTED = [f for f in FAMILIES if f.refused is None]
REFUSED = [f for f in FAMILIES if f.refused is not None]
MODES = {
    "qwen2_5": "history", "qwen3_thinking": "base", "qwen3_non_thinking": "base", "llama3_2": "history",
    "deepseek_v3_1": "base", "phi3_5": "base", "smollm2": "history",
}


def check_batch(fam, pairs) -> int:
    for ep, traj in pairs:
        assert traj.error is None, traj.error
        expected_ids, expected_mask = reference_ids(fam, ep, ep.turns)
        assert traj.token_ids == expected_ids
        assert traj.loss_mask == expected_mask
        masked = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
        assert masked == [t for turn in ep.turns for t in turn]  # exactly the sampled ids
        assert traj.engine_logprobs == [replay_logprob(t) if m else 0.0 for t, m in zip(expected_ids, expected_mask, strict=True)]
    return len(pairs)


def test_eleven_families_each_supported_or_refused():
    assert len(FAMILIES) == 11 and len({f.template for f in FAMILIES}) == 10
    assert sorted(MODES) == sorted(f.name for f in SUPPORTED)


@pytest.mark.parametrize("fam", SUPPORTED, ids=lambda f: f.name)
def test_supported_template_is_token_exact(fam):
    col = collector_for(fam)
    assert col.probe.delta_mode == MODES[fam.name]
    assert check_batch(fam, run_batch(fam, seed=0, n=12, collector=col)) == 12
    col.close()


@pytest.mark.parametrize("fam", REFUSED, ids=lambda f: f.name)
def test_unsupported_template_is_refused_at_start_with_the_reason(fam):
    with pytest.raises(TemplateError, match=fam.refused):
        collector_for(fam)


def test_every_control_token_is_one_id():
    for fam in FAMILIES:
        tok = family_tokenizer(fam.name)
        for text in fam.controls:
            assert len(tok.encode(text, add_special_tokens=False)) == 1, (fam.name, text)


def test_qwen3_full_rendering_drops_the_think_blocks_the_stream_keeps():
    # The stated difference of "base" templates: the template's re-rendering of the whole
    # conversation drops an earlier turn's <think> block once a user query follows; the stream keeps
    # the sampled ids, as the model conditioned on them.
    fam = BY_NAME["qwen3_thinking"]
    pairs = run_batch(fam, seed=7, n=20)
    check_batch(fam, pairs)
    tok = family_tokenizer(fam.name)
    dropped = 0
    for ep, traj in pairs:
        text = tok.decode(traj.token_ids, skip_special_tokens=False)
        full = ChatRenderer(tok, fam.text).render(traj.messages)
        for turn in ep.turns[:-1]:
            thought = tok.decode(turn, skip_special_tokens=False)
            if thought.startswith("<think>\n") and "\n</think>" in thought:
                assert thought.split("</think>")[0] in text
                dropped += thought.split("</think>")[0] not in full
    assert dropped > 0


def test_a_template_that_drops_tool_messages_fails_the_episode_at_the_first_tool_result():
    # Regression: Phi-3.5's template renders no `tool` role; the probe passed it and the collector
    # trained on contexts without the tool results. Now the probe says so and the episode fails.
    fam = BY_NAME["phi3_5"]
    col = collector_for(fam)
    assert col.probe.renders_tool_messages is False
    assert collector_for(BY_NAME["qwen2_5"]).probe.renders_tool_messages is True
    from conformance_helpers import Episode, ScriptedEnv

    ep = Episode([{"role": "user", "content": "Task."}], None,
                 [[{"role": "tool", "content": "5", "tool_call_id": "c", "name": "add"}]], [[5, 6], [7]])
    ep.calls = 0
    col.engine.script = lambda ids: ep.turns[min(ep.calls, 1)]
    import asyncio

    [traj] = asyncio.run(col.collect(lambda: ScriptedEnv(ep), [0]))
    assert traj.error == (
        "template_error: the chat template drops tool messages: the model would never see this tool "
        "result (use a template that renders them, e.g. chatml_tools)"
    )
    assert traj.num_turns == 1 and traj.loss_mask.count(1) == 2  # the first turn's [5, 6] kept


def test_a_template_that_raises_is_a_template_error_naming_its_message():
    # Regression: an exception raised by a template (Gemma's raise_exception) escaped the probe as a
    # jinja2 error instead of the refusal with its reason.
    renderer = ChatRenderer(family_tokenizer("gemma2"), BY_NAME["gemma2"].text)
    with pytest.raises(TemplateError, match=r"^the chat template raised TemplateError: System role not supported$"):
        renderer.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert STUB not in BY_NAME["gemma2"].text


def test_a_python_error_in_a_template_is_wrapped_as_a_jinja_error_is():
    # Regression: a template whose code hit a Python error (here str + int) escaped the renderer as a
    # bare TypeError: a traceback at start-up, an "internal_error" episode instead of a template_error.
    text = "{% for m in messages %}{{ m.role + ': ' + m.content + 1 }}{% endfor %}"
    renderer = ChatRenderer(family_tokenizer("smollm2"), text)
    with pytest.raises(TemplateError, match=r'^the chat template raised TypeError: can only concatenate str \(not "int"\) to str$'):
        renderer.render([{"role": "user", "content": "U"}])
    with pytest.raises(TemplateError, match=r"^the chat template raised TypeError: .*; and new messages rendered after"):
        probe_template(renderer, [2])


@pytest.mark.slow
def test_ten_thousand_generated_trajectories_are_token_exact():
    t0, total = time.perf_counter(), 0
    per = -(-10_000 // len(SUPPORTED))
    for fam in SUPPORTED:
        col = collector_for(fam)
        for seed in range(1, per // 100 + 2):
            total += check_batch(fam, run_batch(fam, seed=seed, n=100, collector=col))
        col.close()
    print(f"{total} trajectories over {len(SUPPORTED)} templates in {time.perf_counter() - t0:.1f} s")
    assert total >= 10_000
