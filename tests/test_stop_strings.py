"""Stop strings: the shared rule, the scripted engine, the collector and Search-v0.

The rule (``engines.common``): generation ends after the first token whose addition makes the decoded
completion contain a stop string; that token is kept whole. Expected cut points are written out from
SmolLM2's real tokenization of the scripted text (the ids are listed in the comments) and checked
against an independent prefix-by-prefix decode.
"""

from __future__ import annotations

import pytest
from rollout_helpers import ASSISTANT_HEADER

from chatgym.envs.search.env import SearchEnv, format_passages
from chatgym.retrievers.base import Document
from chatgym.retrievers.bm25 import BM25Retriever
from chatgym.trainer.chat.delta import ChatRenderer
from chatgym.trainer.engines.base import SamplingParams
from chatgym.trainer.engines.common import (
    StopStringChecker,
    completion_text,
    earliest_stop,
    first_stop_cut,
    judge_stop,
    server_stop,
)
from chatgym.trainer.engines.replay import ReplayEngine, replay_logprob, turn_script
from chatgym.trainer.rollout import Collector, RolloutConfig
from chatgym.trainer.rollout.trace import read_trace

IM_END, NL = 2, 198  # SmolLM2's <|im_end|> and "\n"
SEARCH_STOPS = ("</search>", "</answer>")


@pytest.fixture(scope="module")
def tok():
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except ModuleNotFoundError as exc:  # the model package is a set-up step (scripts/setup.sh)
        pytest.skip(str(exc))


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def naive_cut(tok, ids, stops):
    """Independent reference: decode every prefix, the first that contains a stop string."""
    for n in range(1, len(ids) + 1):
        text = tok.decode(ids[:n], skip_special_tokens=False)
        hits = [(text.find(s) + len(s), i) for i, s in enumerate(stops) if s in text]
        if hits:
            return n, stops[min(hits)[1]]
    return None


# ---- the rule ----------------------------------------------------------------------------------


def test_sampling_params_stop_is_a_tuple_of_non_empty_strings():
    assert SamplingParams(stop=["</search>", "</answer>"]).stop == SEARCH_STOPS
    assert SamplingParams(stop="</answer>").stop == ("</answer>",)  # one string, not its characters
    assert SamplingParams().stop == ()
    with pytest.raises(ValueError, match="non-empty strings"):
        SamplingParams(stop=["</search>", ""])
    with pytest.raises(ValueError, match="non-empty strings"):
        SamplingParams(stop=[3])


def test_earliest_ending_stop_wins_and_ties_go_by_order():
    assert earliest_stop("<answer>x</answer> <search>y</search>", SEARCH_STOPS) == "</answer>"
    assert earliest_stop("<search>y</search><answer>x</answer>", SEARCH_STOPS) == "</search>"
    assert earliest_stop("xab", ["ab", "b"]) == "ab"  # both end at 3: the first listed
    assert earliest_stop("xab", ["b", "ab"]) == "b"
    assert earliest_stop("nothing here", SEARCH_STOPS) is None


def test_cut_keeps_the_whole_token_that_completes_the_match(tok):
    # A sampled "<search>a</search>.<search>b</search>" as
    # ['<', 'search', '>', 'a', '</', 'search', '>.', '<', 'search', '>', 'b', '</', 'search', '>']:
    # the 7th id, '>.' (19369), completes "</search>" in its middle and is kept whole.
    ids = enc(tok, "<search>a</search>.") + enc(tok, "<search>b</search>")
    assert ids[:7] == [44, 7916, 46, 81, 9617, 7916, 19369]
    assert first_stop_cut(tok, ids, SEARCH_STOPS) == (7, "</search>") == naive_cut(tok, ids, SEARCH_STOPS)
    assert tok.decode(ids[:7]) == "<search>a</search>."  # the text runs one character past the stop
    # The incremental checker (what the transformers engine runs after each token) agrees.
    check = StopStringChecker(tok, SEARCH_STOPS)
    assert [check(ids[:n]) for n in range(1, 8)] == [None] * 6 + ["</search>"]
    assert first_stop_cut(tok, ids[:6], SEARCH_STOPS) is None  # "</search" is not a match yet
    assert first_stop_cut(tok, ids, ()) is None


def test_checker_window_agrees_with_full_decodes_on_long_and_multibyte_text(tok):
    # A long completion with multi-byte characters (3-byte "€", 4-byte emoji) before the stop: the
    # windowed check of the last few dozen ids must find the same cut as decoding every prefix.
    text = "€" * 40 + " déjà vu 😀😀 " * 20 + "<answer>Zürich 😀</answer> tail"
    ids = enc(tok, text)
    want = naive_cut(tok, ids, SEARCH_STOPS)
    assert want is not None and want[0] < len(ids) and want[1] == "</answer>"
    check = StopStringChecker(tok, SEARCH_STOPS)
    found = next(n for n in range(1, len(ids) + 1) if check(ids[:n]) is not None)
    assert (found, check(ids[:found])) == want == first_stop_cut(tok, ids, SEARCH_STOPS)


def test_checker_needs_a_tokenizer_and_stops():
    with pytest.raises(ValueError, match="tokenizer"):
        StopStringChecker(None, SEARCH_STOPS)
    with pytest.raises(ValueError, match="at least one"):
        StopStringChecker(object(), ())


def test_judge_stop_and_text_keep_a_stop_string_but_drop_an_eos():
    stop = frozenset({2})
    assert judge_stop([5, 6], stop, "</search>") == ("stop", "</search>")
    assert judge_stop([5, 2], stop) == ("stop", 2)
    assert judge_stop([2, 5], stop) == ("length", None)

    class Tok:
        def decode(self, ids, skip_special_tokens):
            return "|".join(map(str, ids))

    assert completion_text(Tok(), [4, 5], "stop", "</search>") == "4|5"  # the last id is content
    assert completion_text(Tok(), [4, 2], "stop", 2) == "4"
    assert completion_text(Tok(), [4, 2], "stop") == "4"


def test_server_stop_names_the_servers_stop_string():
    eos = frozenset({2})
    assert server_stop([5, 6], eos, True, "stop", "</answer>") == ("stop", "</answer>")
    assert server_stop([5, 2], eos, True, "stop", None) == ("stop", 2)
    assert server_stop([5, 6], eos, True, "length", None) == ("length", None)
    # A remote model (EOS unknown here): the server's reason and its matched id.
    assert server_stop([5, 9], frozenset(), False, {"type": "stop", "matched": 9}, 9) == ("stop", 9)
    assert server_stop([5], frozenset(), False, "length", None) == ("length", None)


# ---- the scripted engine -----------------------------------------------------------------------


async def test_replay_engine_cuts_at_the_stop_string_and_names_it(tok):
    ids = enc(tok, "<search>a</search>.") + enc(tok, "<search>b</search>") + [IM_END]
    engine = ReplayEngine(lambda prompt: ids, tok)
    out = await engine.generate([1], SamplingParams(max_tokens=50, stop=SEARCH_STOPS))
    assert out.token_ids == [44, 7916, 46, 81, 9617, 7916, 19369]
    assert out.logprobs == [replay_logprob(t) for t in out.token_ids]  # one per kept id
    assert (out.finish_reason, out.stop_reason) == ("stop", "</search>")
    # Without stop strings the same script runs to its EOS.
    full = await engine.generate([1], SamplingParams(max_tokens=50, stop_token_ids=(IM_END,)))
    assert full.token_ids == ids and full.stop_reason == IM_END
    # A stop string completed by the last id max_tokens allows is still a stop.
    seven = await engine.generate([1], SamplingParams(max_tokens=7, stop=SEARCH_STOPS))
    assert (seven.token_ids, seven.finish_reason, seven.stop_reason) == (ids[:7], "stop", "</search>")
    six = await engine.generate([1], SamplingParams(max_tokens=6, stop=SEARCH_STOPS))
    assert (six.finish_reason, six.stop_reason) == ("length", None)
    with pytest.raises(ValueError, match="tokenizer"):
        await ReplayEngine(lambda prompt: ids).generate([1], SamplingParams(stop=SEARCH_STOPS))


# ---- Search-v0 tags mode through the collector --------------------------------------------------

TASK = {"task_id": "q0", "question": "Which city is the capital of France?", "answers": ["Paris"]}
DOCS = [
    Document("Paris", "Paris is the capital and largest city of France.", {"title": "Paris"}),
    Document("Lyon", "Lyon is a city in France.", {"title": "Lyon"}),
    Document("Berlin", "Berlin is the capital of Germany.", {"title": "Berlin"}),
]


class IgnoresStops(ReplayEngine):
    """A scripted engine that does NOT honour stop strings (as an engine without support would)."""

    async def generate(self, prompt_ids, params):
        out = await super().generate(prompt_ids, SamplingParams(max_tokens=params.max_tokens))
        self.calls[-1] = (list(prompt_ids), params)  # record what it was asked for
        return out


def search_collector(tok, turns, engine_cls=ReplayEngine, **cfg):
    engine = engine_cls(turn_script(turns, enc(tok, ASSISTANT_HEADER)), tok)
    cfg.setdefault("episode_timeout_s", 30.0)
    return Collector(engine, tok, RolloutConfig(**cfg)), engine


def search_env(retriever):
    return lambda: SearchEnv(mode="tags", retriever=retriever, topk=1, max_passage_tokens=None)


@pytest.mark.parametrize("engine_cls", [ReplayEngine, IgnoresStops])
async def test_search_tags_turn_ends_after_the_first_search(tok, engine_cls, tmp_path):
    retriever = BM25Retriever(DOCS)
    # Turn 1 would write two searches (and an answer) in one turn; turn 2 answers, then rambles.
    first = "<search>capital of France</search>\n<search>Berlin</search><answer>Berlin</answer>"
    second = "<answer>Paris</answer> and more text"
    turns = [[*enc(tok, first), IM_END], [*enc(tok, second), IM_END]]
    col, engine = search_collector(tok, turns, engine_cls, trace_path=str(tmp_path / "t.jsonl"))
    [traj] = await col.collect(search_env(retriever), [TASK])
    assert traj.error is None and traj.terminated and traj.reward == 1.0

    # The engine was asked to stop at the env's stop strings on every turn.
    assert [params.stop for _, params in engine.calls] == [SEARCH_STOPS, SEARCH_STOPS]
    # Turn 1 keeps exactly the ids through the one completing "</search>": 9 of the scripted ids
    # ['<','search','>','capital',' of',' France','</','search','>'].
    kept1 = enc(tok, "<search>capital of France</search>")
    assert len(kept1) == 9 and turns[0][:9] == kept1
    kept2 = enc(tok, "<answer>Paris</answer>")  # ['<','answer','>','Paris','</','answer','>']
    assert turns[1][:7] == kept2
    # The env saw one action: one search, whose passages came back; the history holds the cut turn.
    assert traj.info["searches"] == 1
    assert [m["content"] for m in traj.messages[2:]] == [
        "<search>capital of France</search>",
        f"<information>{format_passages(retriever.search('capital of France', 1))}</information>",
        "<answer>Paris</answer>",
    ]
    # Token-exact stream: prompt + turn 1 + the whole turn suffix (no EOS was sampled) + the user turn
    # with the passages + assistant header + turn 2.
    env = SearchEnv(mode="tags", retriever=retriever, topk=1)
    prompt = enc(tok, ChatRenderer(tok).render(env.initial_messages(TASK), None, add_generation_prompt=True))
    obs = enc(tok, f"<|im_start|>user\n{traj.messages[3]['content']}<|im_end|>\n{ASSISTANT_HEADER}")
    assert traj.token_ids == prompt + kept1 + [IM_END, NL] + obs + kept2
    mask = [0] * len(prompt) + [1] * 9 + [0] * (2 + len(obs)) + [1] * 7
    assert traj.loss_mask == mask
    assert traj.engine_logprobs == [
        replay_logprob(t) if m else 0.0 for t, m in zip(traj.token_ids, mask, strict=True)
    ]
    # Which stop ended each turn is recorded, in the trajectory, the turn records and the trace.
    assert traj.finish_reasons == ["stop", "stop"]
    assert traj.stop_reasons == ["</search>", "</answer>"]
    assert [r["stop_reason"] for r in traj.info["turns"]] == ["</search>", "</answer>"]
    # An engine that ignored the stop strings is cut by the collector; the dropped ids are counted.
    dropped = [r.get("stop_cut_tokens", 0) for r in traj.info["turns"]]
    if engine_cls is IgnoresStops:
        assert dropped == [len(turns[0]) - 9, len(turns[1]) - 7]
    else:
        assert dropped == [0, 0]
    [line] = read_trace(tmp_path / "t.jsonl")
    assert line["stop_reasons"] == ["</search>", "</answer>"]
    assert [r["stop_reason"] for r in line["info"]["turns"]] == ["</search>", "</answer>"]


async def test_eos_turns_record_the_eos_id_and_envs_without_stops_send_none(tok):
    from rollout_helpers import AddEnv

    col, engine = search_collector(tok, [[*enc(tok, "It is 9."), IM_END]])
    [traj] = await col.collect(AddEnv, [0])
    assert engine.calls[0][1].stop == ()
    assert traj.finish_reasons == ["stop"] and traj.stop_reasons == [IM_END]
    cut, _ = search_collector(tok, [enc(tok, "It is 9, 9, 9")], max_tokens=3)
    [traj] = await cut.collect(AddEnv, [0])
    assert traj.finish_reasons == ["length"] and traj.stop_reasons == [None]


async def test_bad_env_stop_strings_fail_the_episode(tok):
    from rollout_helpers import OkEnv

    class BadStops(OkEnv):
        stop_strings = ("</a>", "")

    col, _ = search_collector(tok, [[*enc(tok, "hi"), IM_END]])
    [traj] = await col.collect(BadStops, [0])
    assert traj.info["error_kind"] == "env_error" and "stop_strings" in traj.error


# ---- the API (message-level) path of evaluation -------------------------------------------------


async def test_api_episode_search_tags_one_action_per_turn():
    # chatgym eval with an OpenAI-compatible API: a real HTTP server on 127.0.0.1 plays the model and
    # writes two searches in one reply; the env's stop strings cut the reply after the first.
    from concurrent.futures import ThreadPoolExecutor

    from aiohttp import web

    from chatgym.trainer.engines.openai_chat import OpenAIChatEngine
    from chatgym.trainer.eval.chat_policy import api_act, run_chat_episode

    replies = [
        "<search>capital of France</search>\n<search>Berlin</search><answer>Berlin</answer>",
        "<answer>Paris</answer> and more text",
    ]
    bodies = []

    async def completions(request):
        bodies.append(await request.json())
        content = replies[min(len(bodies), len(replies)) - 1]
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": content}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)  # the OS picks a free port
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

    class OneTask(SearchEnv):
        def load_tasks(self, split):
            return [TASK]

    retriever = BM25Retriever(DOCS)
    engine = OpenAIChatEngine("fake-model", url, "k", retries=0)
    act = api_act(engine, SamplingParams(max_tokens=64, temperature=0))
    with ThreadPoolExecutor(2) as pool:
        traj = await run_chat_episode(
            act, lambda: OneTask(mode="tags", retriever=retriever, topk=1), {}, 0, 0, None, pool, 30.0
        )
    await engine.close()
    await runner.cleanup()
    assert traj.error is None and traj.reward == 1.0 and traj.info["searches"] == 1
    assert [m["content"] for m in traj.messages[2:]] == [
        "<search>capital of France</search>",
        f"<information>{format_passages(retriever.search('capital of France', 1))}</information>",
        "<answer>Paris</answer>",
    ]
    assert all("stop" not in b for b in bodies)  # client mode (default): cut here, exact on any API
    assert traj.finish_reasons == ["stop", "stop"] and traj.stop_reasons == ["</search>", "</answer>"]


async def test_engine_responder_keeps_its_stop_strings(tok):
    from chatgym.trainer.engines.responder import EngineResponder

    ids = [*enc(tok, "Rating: [[8]] because"), IM_END]
    params = SamplingParams(max_tokens=20, temperature=0, stop=["]]"])
    judge = EngineResponder(ReplayEngine(lambda prompt: ids, tok), tok, params=params, trace=True)
    message, trace = await judge.respond_with_trace([{"role": "user", "content": "Rate it."}])
    assert judge.params.stop == ("]]",) and IM_END in judge.params.stop_token_ids
    assert message == {"role": "assistant", "content": "Rating: [[8]]"}
    n = first_stop_cut(tok, ids, ["]]"])[0]
    assert trace["token_ids"] == ids[:n] and trace["stop_reason"] == "]]" and trace["finish_reason"] == "stop"
