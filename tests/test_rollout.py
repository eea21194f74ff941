"""The rollout collector with a scripted policy (ReplayEngine) and SmolLM2's real tokenizer.

Expected token streams are written out by hand from the chatml_tools template's text (not computed
with the collector's renderer), then encoded with the tokenizer.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from rollout_helpers import ASSISTANT_HEADER, TASKS, AddEnv, OkEnv, SyncEchoEnv, tool_call_text

from chatgym.trainer.chat.delta import ChatRenderer, TemplateError
from chatgym.trainer.engines.replay import ReplayEngine, replay_logprob, turn_script
from chatgym.trainer.rollout.collector import Collector, RolloutConfig, request_seed
from chatgym.trainer.rollout.trace import read_trace

IM_START, IM_END, NL, ENDOFTEXT = 1, 2, 198, 0  # SmolLM2 ids of <|im_start|>, <|im_end|>, "\n", <|endoftext|>


@pytest.fixture(scope="module")
def tok():
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except ModuleNotFoundError as exc:  # the model package is a set-up step (scripts/setup.sh)
        pytest.skip(str(exc))


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def tool_response(content: str) -> str:
    # chatml_tools renders a tool message as its own user turn wrapped in <tool_response>.
    return f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n{ASSISTANT_HEADER}"


def scripted(tok, texts: list[str], eos: int | None = IM_END) -> list[list[int]]:
    return [enc(tok, t) + ([eos] if eos is not None else []) for t in texts]


def make_collector(tok, turns, **cfg) -> Collector:
    engine = ReplayEngine(turn_script(turns, enc(tok, ASSISTANT_HEADER)), tok)
    cfg.setdefault("episode_timeout_s", 30.0)
    return Collector(engine, tok, RolloutConfig(**cfg))


def expected_prompt(tok, task) -> list[int]:
    # The system turn of chatml_tools with the add tool's schema; the renderer's own output is only
    # compared against this once (here), the deltas below are hand-written.
    env = AddEnv()
    text = ChatRenderer(tok).render(env.initial_messages(task), env.tools, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou add numbers with the add tool.\n\n# Tools")
    assert text.endswith(f"<|im_start|>user\n{task['question']}<|im_end|>\n{ASSISTANT_HEADER}")
    return enc(tok, text)


THREE_TURNS = [
    tool_call_text("add", a=2, b=3),
    tool_call_text("add", a=5, b=4),
    "The answer is 9.",
]


async def test_three_turn_tool_episode_is_token_exact(tok):
    turns = scripted(tok, THREE_TURNS)
    col = make_collector(tok, turns)
    [traj] = await col.collect(AddEnv, [0])
    assert traj.error is None and traj.terminated and not traj.truncated

    prompt = expected_prompt(tok, TASKS[0])
    # After each completion ending in <|im_end|>, the template's "\n" closes the turn, then the tool
    # result turn and the next assistant header follow.
    delta1 = [NL, *enc(tok, tool_response("5"))]
    delta2 = [NL, *enc(tok, tool_response("9"))]
    expected = prompt + turns[0] + delta1 + turns[1] + delta2 + turns[2]
    assert traj.token_ids == expected
    assert traj.prompt_len == len(prompt)

    n_gen = sum(len(t) for t in turns)
    assert sum(traj.loss_mask) == n_gen == traj.response_tokens
    mask = [0] * len(prompt) + [1] * len(turns[0]) + [0] * len(delta1) + [1] * len(turns[1])
    mask += [0] * len(delta2) + [1] * len(turns[2])
    assert traj.loss_mask == mask
    assert traj.engine_logprobs == [replay_logprob(t) if m else 0.0 for t, m in zip(expected, mask, strict=True)]

    assert traj.finish_reasons == ["stop", "stop", "stop"]
    assert traj.rewards == [0.0, 0.0, 1.0] and traj.reward == 1.0
    assert [r["observation_tokens"] for r in traj.info["turns"][:2]] == [len(delta1) - 1, len(delta2) - 1]
    assert [r["closing_tokens"] for r in traj.info["turns"][:2]] == [1, 1]
    # Independent end-to-end check: the stream decodes to the template's rendering of the messages.
    text = tok.decode(traj.token_ids, skip_special_tokens=False)
    assert text + "\n" == ChatRenderer(tok).render(traj.messages, AddEnv().tools)
    assert [m["role"] for m in traj.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert traj.task_id == "add-0" and traj.env_id == "AddEnv"
    assert traj.info["tool_results_total"] == 2 and traj.info["tool_errors_total"] == 0
    assert col.last_stats.failed == 0 and col.last_stats.generated_tokens == n_gen


async def test_sampled_ids_are_kept_when_reencoding_differs(tok):
    hel, lo = tok.convert_tokens_to_ids("hel"), tok.convert_tokens_to_ids("lo")
    assert tok.decode([hel, lo]) == "hello" and enc(tok, "hello") == [28120]  # one token when re-encoded
    # Turn 1 answers "hello" split in two tokens; the env has no tool call, so it scores and ends.
    col = make_collector(tok, [[hel, lo, IM_END]])
    [traj] = await col.collect(AddEnv, [2])
    prompt = expected_prompt(tok, TASKS[2])
    assert traj.token_ids == [*prompt, hel, lo, IM_END]
    assert traj.loss_mask == [0] * len(prompt) + [1, 1, 1]
    assert traj.engine_logprobs[-3:] == [replay_logprob(hel), replay_logprob(lo), replay_logprob(IM_END)]
    assert traj.messages[-1] == {"role": "assistant", "content": "hello"}


async def test_sampled_ids_kept_across_turns_with_odd_tokenization(tok):
    # A tool call whose JSON is spelled with unusual token splits: the env parses the text, but the
    # stream keeps the sampled split, and the next turn is built on it.
    call = enc(tok, tool_call_text("add", a=2, b=3))
    hel, lo = tok.convert_tokens_to_ids("hel"), tok.convert_tokens_to_ids("lo")
    odd = [hel, lo, *enc(tok, " "), *call, IM_END]
    turns = [odd, [*enc(tok, "9"), IM_END]]
    col = make_collector(tok, turns)
    [traj] = await col.collect(AddEnv, [0])
    start = traj.prompt_len
    assert traj.token_ids[start : start + len(odd)] == odd
    assert traj.info["turns"][1]["start"] == start + len(odd) + 1 + len(enc(tok, tool_response("5")))
    assert traj.messages[3]["content"] == "5"  # the env ran the call parsed from "hello <tool_call>..."


async def test_eos_is_judged_on_completion_ids_only(tok):
    # Cut at max_tokens=3 without EOS: "length", even though the prompt is full of <|im_end|> ids; the
    # closing tokens are the whole turn suffix <|im_end|>\n (loss mask 0).
    long_answer = enc(tok, "The answer is 9.")  # 6 tokens, no EOS in the first 3
    col = make_collector(tok, [[*long_answer, IM_END], [*enc(tok, "9"), IM_END]], max_tokens=3)
    [traj] = await col.collect(AddEnv, [0])
    prompt = expected_prompt(tok, TASKS[0])
    assert IM_END in prompt
    assert traj.finish_reasons[0] == "length"
    # "The answer" has no call and is scored (reward 0), ending the episode: nothing is appended.
    assert traj.token_ids == prompt + long_answer[:3]
    assert traj.terminated and traj.rewards == [0.0]

    # A cut turn that the env answers is closed with the whole suffix <|im_end|>\n (mask 0).
    col = make_collector(tok, [[*long_answer, IM_END]], max_tokens=5)
    [traj] = await col.collect(OkEnv, [0])
    rec = traj.info["turns"][0]
    assert rec["finish_reason"] == "length" and rec["closing_tokens"] == 2
    after = traj.prompt_len + 5
    ok_turn = enc(tok, f"<|im_start|>user\nok<|im_end|>\n{ASSISTANT_HEADER}")
    assert traj.token_ids[after : after + 2 + len(ok_turn)] == [IM_END, NL, *ok_turn]
    assert traj.loss_mask[after - 1 : after + 3] == [1, 0, 0, 0]


async def test_other_eos_id_gets_full_turn_suffix(tok):
    # eos ids {0, 2}: a turn ending with <|endoftext|> is "stop", closed with the whole <|im_end|>\n.
    turns = [[*enc(tok, tool_call_text("add", a=2, b=3)), ENDOFTEXT], [*enc(tok, "9"), IM_END]]
    col = make_collector(tok, turns, eos_token_ids=(ENDOFTEXT, IM_END))
    [traj] = await col.collect(AddEnv, [0])
    end = traj.prompt_len + len(turns[0])
    assert traj.finish_reasons == ["stop", "stop"]
    assert traj.token_ids[end - 1 : end + 3] == [ENDOFTEXT, IM_END, NL, IM_START]
    assert traj.info["turns"][0]["closing_tokens"] == 2


def ok_prompt(tok, task) -> list[int]:
    # chatml_tools with no tools and no system message renders just the user turn and the header.
    return enc(tok, f"<|im_start|>user\n{task['question']}<|im_end|>\n{ASSISTANT_HEADER}")


OK_DELTA = f"\n<|im_start|>user\nok<|im_end|>\n{ASSISTANT_HEADER}"  # closing "\n" + "ok" turn + header


async def test_per_turn_and_response_budgets(tok):
    answer = [*enc(tok, "The answer is 9."), IM_END]  # 7 tokens
    call = [*enc(tok, tool_call_text("add", a=2, b=3)), IM_END]
    n1 = len(call)
    # max_response_tokens = n1 + 4: turn 2 may generate min(512, 4, ctx) = 4 tokens; it is cut and
    # still goes to the env (no call: scored, terminated). Exactly n1 + 4 generated tokens.
    col = make_collector(tok, [call, answer], max_response_tokens=n1 + 4)
    [traj] = await col.collect(AddEnv, [0])
    assert traj.response_tokens == n1 + 4
    assert [r["max_tokens"] for r in traj.info["turns"]] == [n1 + 4, 4]
    assert traj.finish_reasons == ["stop", "length"] and traj.terminated and not traj.truncated

    # An env that always answers: 7 + 4 tokens, then the response budget is 0 before turn 3, so the
    # episode is truncated by max_response_tokens with exactly the budget generated.
    col = make_collector(tok, [answer], max_response_tokens=11)
    [traj] = await col.collect(OkEnv, [0])
    assert traj.truncated and traj.info["truncated_by"] == "max_response_tokens"
    assert traj.response_tokens == 11 and traj.num_turns == 2
    prompt = ok_prompt(tok, TASKS[0])
    # turn 2 is cut (no EOS) and followed by the whole turn suffix before the "ok" turn.
    expected = prompt + answer + enc(tok, OK_DELTA) + answer[:4] + [IM_END] + enc(tok, OK_DELTA)
    assert traj.token_ids == expected
    assert traj.rewards == [0.5, 0.5] and traj.reward == 1.0

    # Per-turn max_tokens only: every turn capped at 4 tokens.
    col = make_collector(tok, [answer], max_tokens=4, max_response_tokens=10)
    [traj] = await col.collect(OkEnv, [0])
    assert [r["max_tokens"] for r in traj.info["turns"]] == [4, 4, 2]
    assert traj.response_tokens == 10 and traj.info["truncated_by"] == "max_response_tokens"


async def test_context_budget_truncates_with_exact_counts(tok):
    answer = [*enc(tok, "The answer is 9."), IM_END]  # 7 tokens
    prompt = ok_prompt(tok, TASKS[0])
    obs = len(enc(tok, OK_DELTA))  # "\n" + "ok" turn + header = 11 tokens
    # Context = prompt + turn 1 + observation + 3: turn 2 may generate exactly 3 tokens; the "ok"
    # answer to it does not fit, so it is dropped and the episode is truncated by max_model_len.
    max_len = len(prompt) + len(answer) + obs + 3
    col = make_collector(tok, [answer], max_model_len=max_len)
    [traj] = await col.collect(OkEnv, [0])
    # Turn 1 may use all the context left after the prompt (7 + 11 + 3 = 21 < max_tokens = 512).
    assert [r["max_tokens"] for r in traj.info["turns"]] == [len(answer) + obs + 3, 3]
    assert traj.finish_reasons == ["stop", "length"]
    assert traj.truncated and traj.info["truncated_by"] == "max_model_len"
    assert traj.token_ids == prompt + answer + enc(tok, OK_DELTA) + answer[:3]
    assert len(traj.token_ids) == max_len
    assert traj.info["dropped_observation_tokens"] == 2 + obs - 1  # <|im_end|>\n + "ok" turn + header

    # The observation after turn 1 would leave no room for a token: dropped, one turn.
    col = make_collector(tok, [answer], max_model_len=len(prompt) + len(answer) + obs)
    [traj] = await col.collect(OkEnv, [0])
    assert traj.info["truncated_by"] == "max_model_len" and traj.num_turns == 1
    assert traj.token_ids == prompt + answer and traj.info["dropped_observation_tokens"] == obs
    # One more token of context and it fits, and turn 2 gets exactly 1 token.
    col = make_collector(tok, [answer], max_model_len=len(prompt) + len(answer) + obs + 1)
    [traj] = await col.collect(OkEnv, [0])
    assert [r["max_tokens"] for r in traj.info["turns"]] == [len(answer) + obs + 1, 1]

    # The prompt alone fills the context: kept, no turn, and failed (regression: it was a plain reward-0
    # episode, which the leaderboard counted as the model's score).
    col = make_collector(tok, [answer], max_model_len=len(prompt))
    [traj] = await col.collect(OkEnv, [0])
    assert traj.token_ids == prompt and traj.num_turns == 0
    assert traj.truncated and traj.info["truncated_by"] == "max_model_len"
    assert traj.error == f"prompt_too_long: the prompt has {len(prompt)} tokens and max_model_len is {len(prompt)}"
    assert traj.info["error_kind"] == "prompt_too_long"


async def test_observation_is_cut_in_tokens_with_marker(tok):
    text = " word" * 50  # 50 tokens of " word" (id 2229), checked below
    assert enc(tok, text) == [2229] * 50

    async def shout(n: int) -> str:
        """Return a long text.

        Args:
            n: ignored.
        """
        return text

    from chatgym.envs.tools import Tool

    def factory():
        env = AddEnv()
        env.tool_map = {"shout": Tool.from_function(shout)}
        return env

    col = make_collector(tok, scripted(tok, [tool_call_text("shout", n=1), "9"]), max_observation_tokens=8)
    [traj] = await col.collect(factory, [0])
    cut = " word" * 8 + "\n[... 42 more tokens truncated]"
    assert traj.messages[3]["content"] == cut and traj.info["observation_tokens_cut"] == 42
    start = traj.info["turns"][0]["start"] + traj.info["turns"][0]["completion_tokens"]
    delta = [NL, *enc(tok, tool_response(cut))]
    assert traj.token_ids[start : start + len(delta)] == delta


async def test_env_max_turns_truncation(tok):
    call = [*enc(tok, tool_call_text("add", a=2, b=3)), IM_END]
    col = make_collector(tok, [call])
    [traj] = await col.collect(lambda: AddEnv(max_turns=2), [0])
    assert traj.num_turns == 2 and traj.truncated and traj.info["truncated_by"] == "env"


async def test_straggler_and_crash_do_not_block_the_batch(tok):
    turns = scripted(tok, THREE_TURNS)
    col = make_collector(tok, turns, episode_timeout_s=1.0)
    envs = [AddEnv, lambda: AddEnv(hang_s=3600.0), lambda: AddEnv(crash_on_turn=1), AddEnv]
    t = time.perf_counter()
    trajs = await col.collect(envs, [0, 0, 0, 0], group_size=2)
    wall = time.perf_counter() - t
    assert wall < 3.0  # the hung tool is cancelled at 1 s; nothing waits for it
    assert [(x.group_id, x.sample_index) for x in trajs] == [(g, s) for g in range(4) for s in range(2)]
    ok = [x for x in trajs if x.group_id in (0, 3)]
    assert all(x.error is None and x.reward == 1.0 and x.num_turns == 3 for x in ok)
    hung = [x for x in trajs if x.group_id == 1]
    assert all(x.error.startswith("timeout:") and x.info["error_kind"] == "timeout" for x in hung)
    assert all(x.num_turns == 1 for x in hung)  # kept: prompt + first call, stuck in its tool
    crashed = [x for x in trajs if x.group_id == 2]
    assert all(x.error == "env_error: RuntimeError: boom" for x in crashed)
    assert all(x.num_turns == 2 and x.rewards == [0.0] for x in crashed)  # turn 2's step raised
    stats = col.last_stats
    assert (stats.episodes, stats.failed) == (8, 4)
    assert stats.failed_by_kind == {"timeout": 2, "env_error": 2}
    assert stats.mean_reward == 1.0


async def test_sync_env_runs_in_thread_pool_concurrently(tok):
    echo = [*enc(tok, "hi"), IM_END]
    col = make_collector(tok, [echo], env_threads=8)
    t = time.perf_counter()
    trajs = await col.collect(lambda: SyncEchoEnv(sleep_s=0.3, turns=2), 8)
    wall = time.perf_counter() - t
    # 8 episodes x 2 blocking steps of 0.3 s = 4.8 s one after another; ~0.6 s in 8 threads.
    assert wall < 2.5
    assert all(x.error is None and x.rewards == [1.0, 2.0] and x.terminated for x in trajs)
    # The sync env's user message delta is rendered like any other.
    expected_obs = [NL, *enc(tok, f"<|im_start|>user\necho: hi<|im_end|>\n{ASSISTANT_HEADER}")]
    rec = trajs[0].info["turns"][0]
    assert trajs[0].token_ids[rec["start"] + len(echo) :][: len(expected_obs)] == expected_obs


async def test_engine_error_fails_only_its_episodes(tok):
    class FlakyEngine(ReplayEngine):
        async def generate(self, prompt_ids, params):
            if params.seed is not None and params.seed % 2:
                raise ConnectionError("engine went away")
            return await super().generate(prompt_ids, params)

    turns = scripted(tok, ["9"])
    engine = FlakyEngine(turn_script(turns, enc(tok, ASSISTANT_HEADER)), tok)
    col = Collector(engine, tok, RolloutConfig(seed=7))
    trajs = await col.collect(AddEnv, [0], group_size=6)
    failed = [x for x in trajs if x.failed]
    assert 0 < len(failed) < 6
    assert all(x.error == "engine_error: ConnectionError: engine went away" for x in failed)
    assert col.last_stats.failed_by_kind == {"engine_error": len(failed)}


async def test_groups_share_task_and_reset_seed(tok):
    col = make_collector(tok, scripted(tok, ["9"]))
    trajs = await col.collect(
        AddEnv, [0, 1, {"task_id": "row", "question": "1+1?", "answer": 2}], group_size=3
    )
    assert [x.task_id for x in trajs] == ["add-0"] * 3 + ["add-1"] * 3 + ["row"] * 3
    assert [x.reward for x in trajs] == [1.0] * 3 + [0.0] * 6  # the script always answers 9


async def test_a_groups_opening_prompt_is_rendered_once_a_collect_call(tok):
    # 2 tasks x 3 samples: 2 renders in each collect call (not 6); every trajectory opens with the
    # template's exact prompt, and a second call renders again (the memo lives one call).
    col = make_collector(tok, scripted(tok, ["9"]))
    renders = []
    prompt_ids = col.renderer.prompt_ids
    col.renderer.prompt_ids = lambda *a: (renders.append(a[0][-1]["content"]), prompt_ids(*a))[1]
    tasks = [0, {"task_id": "row", "question": "1+1?", "answer": 2}]
    for call in (1, 2):
        trajs = await col.collect(AddEnv, tasks, group_size=3)
        assert len(renders) == 2 * call
        want = [expected_prompt(tok, AddEnv().tasks[0])] * 3 + [expected_prompt(tok, tasks[1])] * 3
        assert [t.token_ids[: t.prompt_len] for t in trajs] == want


async def test_only_runs_a_subset_of_the_grid_with_the_full_grids_seeds(tok):
    # Resuming an evaluation: a subset of the tasks x G grid samples exactly as in the full grid.
    full = make_collector(tok, scripted(tok, ["9"]), seed=7)
    await full.collect(AddEnv, 3, group_size=2, seed=5)
    part = make_collector(tok, scripted(tok, ["9"]), seed=7)
    trajs = await part.collect(AddEnv, 3, group_size=2, seed=5, only={(2, 1), (0, 0)})
    assert [(t.group_id, t.sample_index, t.task_id) for t in trajs] == [(0, 0, "add-0"), (2, 1, "add-2")]
    assert part.last_stats.episodes == 2
    seeds_full = sorted(p.seed for _, p in full.engine.calls)
    seeds_part = sorted(p.seed for _, p in part.engine.calls)
    assert len(seeds_full) == 6 and len(set(seeds_full)) == 6  # one turn per episode, distinct seeds
    assert seeds_part == sorted([request_seed(7, 0, 0, 0), request_seed(7, 2, 1, 0)])
    assert set(seeds_part) <= set(seeds_full)


async def test_trace_jsonl(tok, tmp_path):
    path = tmp_path / "trace.jsonl"
    col = make_collector(tok, scripted(tok, THREE_TURNS), trace_path=str(path))
    trajs = await col.collect(AddEnv, [0, 1])
    col.close()
    records = read_trace(path)
    assert len(records) == 2
    by_group = {r["group_id"]: r for r in records}
    for traj in trajs:
        rec = by_group[traj.group_id]
        assert rec["token_ids"] == traj.token_ids and rec["loss_mask"] == traj.loss_mask
        assert rec["rewards"] == traj.rewards and rec["messages"] == traj.messages
        assert rec["text"] == tok.decode(traj.token_ids, skip_special_tokens=False)
        assert set(rec["timing"]) >= {"generate_s", "env_s", "render_s", "total_s", "queue_s"}

    # A fraction traces the same episodes on every run (a fixed function of batch/group/sample).
    path2 = tmp_path / "half.jsonl"
    col = make_collector(tok, scripted(tok, ["9"]), trace_path=str(path2), trace_fraction=0.5)
    await col.collect(AddEnv, [g % 3 for g in range(10)], group_size=2)
    col.close()
    picked = {(r["group_id"], r["sample_index"]) for r in read_trace(path2)}
    expected = {(g, s) for g in range(10) for s in range(2) if col.tracer.selected(0, g, s)}
    assert picked == expected and 0 < len(picked) < 20


def test_template_that_re_renders_history_gets_base_deltas_and_one_that_fits_neither_fails(tok):
    # Marks the last message: adding a message changes the rendering of the one before it. As for
    # Qwen3's think-stripping, the observation delta is the new messages rendered after a fixed base
    # conversation, which matches the template's full rendering.
    bad = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if loop.last %} (latest){% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    engine = ReplayEngine(lambda ids: [IM_END])
    assert Collector(engine, tok, RolloutConfig(chat_template=bad)).probe.delta_mode == "base"
    # Prefix-preserving for assistant turns, but drops earlier tool results once a user speaks.
    drops = (
        "{% for m in messages %}{% if m.role != 'tool' or loop.last %}<|im_start|>{{ m.role }}\n"
        "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert Collector(engine, tok, RolloutConfig(chat_template=drops)).probe.delta_mode == "base"
    # Numbers the messages too: new messages render differently after the base conversation than
    # after the real history, so neither mode is exact.
    numbered = bad.replace("{{ m.role }}\n", "{{ m.role }} {{ loop.index }}\n")
    with pytest.raises(TemplateError, match=r"not prefix-preserving.*base conversation.*depends on earlier"):
        Collector(engine, tok, RolloutConfig(chat_template=numbered))


def test_turn_end_token_must_be_an_eos_id(tok):
    engine = ReplayEngine(lambda ids: [IM_END])
    with pytest.raises(TemplateError, match=r"'<\|im_end\|>' \(id 2\), which is not among the EOS ids \[1\]"):
        Collector(engine, tok, RolloutConfig(eos_token_ids=(IM_START,)))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_model_len", 0),
        ("max_tokens", -1),
        ("trace_fraction", 1.5),
        ("episode_timeout_s", 0.0),
        ("temperature", -1.0),
    ],
)
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RolloutConfig(**{field: value})


async def test_collect_argument_errors(tok):
    col = make_collector(tok, scripted(tok, ["9"]))
    with pytest.raises(ValueError, match="group_size"):
        await col.collect(AddEnv, [0], group_size=0)
    with pytest.raises(ValueError, match="envs has 2 entries but tasks has 1"):
        await col.collect([AddEnv, AddEnv], [0])
    with pytest.raises(TypeError, match=r"tasks\[0\]"):
        await col.collect(AddEnv, ["zero"])


async def test_invalid_observation_is_an_env_error(tok):
    class BadObs(SyncEchoEnv):
        def step(self, action):
            return [{"role": "robot", "content": 3}], 0.0, False, False, {}

    col = make_collector(tok, scripted(tok, ["hi"]))
    [traj] = await col.collect(BadObs, [0])
    assert traj.error.startswith(
        "env_error: step returned an invalid message at index 0: role must be one of"
    )


async def test_many_concurrent_episodes_overlap_tool_latency(tok):
    # 32 episodes, each tool call sleeps 0.2 s, 2 calls per episode: 12.8 s if run one by one.
    turns = scripted(tok, THREE_TURNS)
    col = make_collector(tok, turns)
    t = time.perf_counter()
    trajs = await col.collect(lambda: AddEnv(latency=lambda: 0.2), [g % 3 for g in range(16)], group_size=2)
    wall = time.perf_counter() - t
    assert all(x.reward == (1.0 if x.group_id % 3 == 0 else 0.0) for x in trajs)
    assert wall < 3.0
    assert asyncio.get_running_loop() is not None
