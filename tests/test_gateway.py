"""The gateway with a real aiohttp server on 127.0.0.1, the real ``openai`` client (AsyncOpenAI) and a
scripted engine (ReplayEngine) over SmolLM2's real tokenizer.

The reference for token-exactness is the collector itself: the same scripted replies on the matching
env episode (``AddEnv`` of tests/rollout_helpers.py), with an agent loop that sends the messages the
env would have added.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from rollout_helpers import ASSISTANT_HEADER, TASKS, AddEnv, tool_call_text

from chatgym.trainer.chat.delta import ChatRenderer
from chatgym.trainer.engines.base import Completion, SamplingParams
from chatgym.trainer.engines.replay import ReplayEngine, replay_logprob, turn_script
from chatgym.trainer.gateway import Gateway, SessionEnded
from chatgym.trainer.rollout.collector import Collector, RolloutConfig

IM_END, NL = 2, 198  # SmolLM2 ids of <|im_end|> and "\n"


@pytest.fixture(scope="module")
def tok():
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except ModuleNotFoundError as exc:  # the model package is a set-up step (scripts/setup.sh)
        pytest.skip(str(exc))


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def scripted(tok, texts: list[str]) -> list[list[int]]:
    return [[*enc(tok, t), IM_END] for t in texts]


def replay(tok, turns, **kw) -> ReplayEngine:
    return ReplayEngine(turn_script(turns, enc(tok, ASSISTANT_HEADER)), tok, **kw)


THREE_TURNS = [tool_call_text("add", a=2, b=3), tool_call_text("add", a=5, b=4), "The answer is 9."]


class Served:
    """A started gateway and an AsyncOpenAI client factory; stopped on exit."""

    def __init__(self, gw: Gateway):
        self.gw = gw
        self.base_url = ""

    async def __aenter__(self) -> Served:
        self.base_url = await self.gw.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.gw.stop()

    def client(self, sid: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=sid, max_retries=0, timeout=30)

    async def post(self, path: str, sid: str | None = None, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {sid}"} if sid else {}
        headers.update(kw.pop("headers", {}))
        async with httpx.AsyncClient(timeout=30) as c:
            return await c.post(self.base_url + path, headers=headers, **kw)


def gateway(tok, turns, **kw) -> Gateway:
    kw.setdefault("sampling", SamplingParams(max_tokens=512))
    return Gateway(replay(tok, turns), tok, **kw)


def add_tool_messages(msg) -> list[dict]:
    """The tool messages AddEnv returns for the assistant message's calls (same ids, same text)."""
    out = []
    for call in msg.tool_calls or []:
        args = json.loads(call.function.arguments)
        out.append({"role": "tool", "content": str(args["a"] + args["b"]), "tool_call_id": call.id,
                    "name": call.function.name})
    return out


async def add_agent(client: openai.AsyncOpenAI, task: dict, *, as_object: bool = False) -> list[dict]:
    """The env's episode as an OpenAI agent: the env's opening messages and tools, the tool results the
    env would return, until an answer without a call; returns the conversation."""
    env = AddEnv()
    messages: list = [dict(m) for m in env.initial_messages(task)]
    for _ in range(8):
        resp = await client.chat.completions.create(model="any", messages=messages, tools=env.tools)
        msg = resp.choices[0].message
        # An agent either appends the SDK's message object or its dict: both must extend the session.
        messages.append(msg if as_object else msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            break
        messages.extend(add_tool_messages(msg))
    return messages


FIELDS = ("token_ids", "loss_mask", "engine_logprobs", "weight_versions", "prompt_len", "finish_reasons",
          "stop_reasons", "messages")


# chatml_tools renders deltas after the history; Qwen3's think-stripping template after a fixed base.
@pytest.mark.parametrize("template", [None, "qwen3"])
async def test_tool_session_is_identical_to_the_collectors_episode(tok, template):
    turns = scripted(tok, THREE_TURNS)
    collector = Collector(replay(tok, turns), tok, RolloutConfig(episode_timeout_s=30.0, chat_template=template))
    [ref] = await collector.collect(AddEnv, [0])
    assert ref.error is None and ref.num_turns == 3
    assert collector.probe.delta_mode == ("base" if template else "history")

    async with Served(gateway(tok, turns, chat_template=template)) as s:
        sid = s.gw.open_session(task_id="add-0", group_id=3, sample_index=1)
        conversation = await add_agent(s.client(sid), TASKS[0])
        s.gw.set_reward(sid, 1.0)
        [traj] = await s.gw.end_session(sid)

    for name in FIELDS:
        assert getattr(traj, name) == getattr(ref, name), name
    # The stream holds the sampled ids exactly, with the replay engine's logprobs on them only.
    assert traj.engine_logprobs == [replay_logprob(t) if m else 0.0 for t, m in zip(traj.token_ids, traj.loss_mask,
                                                                                   strict=True)]
    assert sum(traj.loss_mask) == sum(len(t) for t in turns)
    assert traj.reward == 1.0 and traj.rewards == [0.0, 0.0, 1.0] and traj.terminated and traj.error is None
    assert (traj.task_id, traj.group_id, traj.sample_index) == ("add-0", 3, 1)
    assert traj.info["segments"] == 1 and traj.info["segment"] == 0 and traj.info["session_id"] == sid
    # The server's time holds its rendering and sampling, and is at most the session's whole time.
    timing = traj.timing
    assert timing["render_s"] + timing["generate_s"] < timing["serve_s"] < timing["total_s"]
    assert traj.info["tool_calls_total"] == 2 and traj.info["tool_results_total"] == 2
    assert [r["observation_tokens"] for r in traj.info["turns"][:2]] == [
        r["observation_tokens"] for r in ref.info["turns"][:2]]
    # What the agent saw: OpenAI tool calls parsed from the hermes text, then the plain answer.
    assert conversation[2]["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    assert conversation[-1]["content"] == "The answer is 9."
    with pytest.raises(SessionEnded):
        await s.gw.end_session(sid)


async def test_the_sdk_message_object_and_reserialised_arguments_extend_the_session(tok):
    turns = scripted(tok, THREE_TURNS)
    async with Served(gateway(tok, turns)) as s:
        sid = s.gw.open_session()
        await add_agent(s.client(sid), TASKS[0], as_object=True)
        # Another client re-serialises the arguments (spacing, key order): still the same call.
        sid2 = s.gw.open_session()
        c = s.client(sid2)
        env = AddEnv()
        messages = [dict(m) for m in env.initial_messages(TASKS[0])]
        msg = (await c.chat.completions.create(model="m", messages=messages, tools=env.tools)).choices[0].message
        call = msg.tool_calls[0]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "add", "arguments": '{"b":3,"a":2}'}}]})
        messages.append({"role": "tool", "content": "5", "tool_call_id": call.id})
        resp = await c.chat.completions.create(model="m", messages=messages, tools=env.tools)
        assert resp.model_extra["chatgym"]["new_segment"] is False
        [a] = await s.gw.end_session(sid)
        [b] = await s.gw.end_session(sid2)
    assert a.info["segments"] == 1 and a.num_turns == 3
    assert b.info["segments"] == 1 and b.num_turns == 2


async def test_rewritten_history_opens_a_new_segment(tok):
    turns = scripted(tok, THREE_TURNS)
    renderer = ChatRenderer(tok)
    async with Served(gateway(tok, turns)) as s:
        sid = s.gw.open_session(task_id="add-0")
        c = s.client(sid)
        env = AddEnv()
        messages = [dict(m) for m in env.initial_messages(TASKS[0])]
        msg = (await c.chat.completions.create(model="m", messages=messages, tools=env.tools)).choices[0].message
        messages += [msg.model_dump(exclude_none=True), *add_tool_messages(msg)]
        await c.chat.completions.create(model="m", messages=messages, tools=env.tools)
        # The agent compacts its context: the tool exchange is summarised into one user message.
        summarised = [messages[0], messages[1], {"role": "user", "content": "So far: 2 + 3 = 5. Go on."}]
        resp = await c.chat.completions.create(model="m", messages=summarised, tools=env.tools)
        assert resp.model_extra["chatgym"] == {"segment": 1, "turn": 0, "new_segment": True,
                                               "rewrite": "message 2 (user) differs from the history"}
        s.gw.set_reward(sid, 0.5)
        first, second = await s.gw.end_session(sid)
    assert first.info["segments"] == second.info["segments"] == 2
    assert (first.info["segment"], second.info["segment"]) == (0, 1)
    assert first.info["segment_end"] == "history_rewritten" and first.num_turns == 2
    assert first.info["gateway_rewrites"] == 1 and first.info["gateway_requests"] == 3
    # The new segment is a fresh render of the whole rewritten prompt, then the sampled turn (the script
    # answers the first assistant header of a prompt with its first turn).
    prompt = enc(tok, renderer.render(summarised, env.tools, add_generation_prompt=True))
    assert second.prompt_len == len(prompt)
    assert second.token_ids == prompt + turns[0] and second.loss_mask == [0] * len(prompt) + [1] * len(turns[0])
    assert first.reward == second.reward == 0.5 and second.rewards == [0.5] and first.rewards == [0.0, 0.5]


async def test_an_edited_assistant_message_opens_a_new_segment(tok):
    turns = scripted(tok, ["Hello there.", "Bye."])
    async with Served(gateway(tok, turns)) as s:
        sid = s.gw.open_session()
        c = s.client(sid)
        messages = [{"role": "user", "content": "Hi"}]
        await c.chat.completions.create(model="m", messages=messages)
        messages += [{"role": "assistant", "content": "Hello there!"}, {"role": "user", "content": "Bye"}]
        resp = await c.chat.completions.create(model="m", messages=messages)
        assert resp.model_extra["chatgym"]["rewrite"] == \
            "message 1 (assistant) differs from the assistant message returned"
        trajs = await s.gw.end_session(sid)
    assert [t.num_turns for t in trajs] == [1, 1]


async def test_concurrent_sessions_stay_apart(tok):
    turns = scripted(tok, THREE_TURNS)
    gw = Gateway(replay(tok, turns, delay_s=0.02), tok, sampling=SamplingParams(max_tokens=512))
    collector = Collector(replay(tok, turns), tok, RolloutConfig(episode_timeout_s=30.0))
    refs = await collector.collect(AddEnv, [0, 1, 2])
    async with Served(gw) as s:
        sids = [s.gw.open_session(task_id=i, group_id=i) for i in range(6)]
        await asyncio.gather(*(add_agent(s.client(sid), TASKS[i % 3]) for i, sid in enumerate(sids)))
        for i, sid in enumerate(sids):
            s.gw.set_reward(sid, float(i))
        results = await asyncio.gather(*(s.gw.end_session(sid) for sid in sids))
    for i, [traj] in enumerate(results):
        ref = refs[i % 3]
        assert traj.token_ids == ref.token_ids and traj.loss_mask == ref.loss_mask
        assert traj.task_id == i and traj.reward == float(i) and traj.info["segments"] == 1


async def test_malformed_requests_get_openai_errors_and_lose_nothing(tok):
    turns = scripted(tok, THREE_TURNS)
    collector = Collector(replay(tok, turns), tok, RolloutConfig(episode_timeout_s=30.0))
    [ref] = await collector.collect(AddEnv, [0])
    async with Served(gateway(tok, turns)) as s:
        sid = s.gw.open_session()
        c = s.client(sid)
        env = AddEnv()
        messages = [dict(m) for m in env.initial_messages(TASKS[0])]
        msg = (await c.chat.completions.create(model="m", messages=messages, tools=env.tools)).choices[0].message
        messages += [msg.model_dump(exclude_none=True), *add_tool_messages(msg)]

        bad_json = await s.post("/chat/completions", sid, content=b'{"messages": [',
                                headers={"Content-Type": "application/json"})
        assert bad_json.status_code == 400
        err = bad_json.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        assert "could not parse the JSON body" in err["message"]

        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(model="m", messages=[{"role": "robot", "content": "x"}])
        assert e.value.status_code == 400 and e.value.body["param"] == "messages[0].role"
        assert e.value.body["code"] == "invalid_value"
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(model="m", messages=messages, tools=env.tools, n=2)
        assert e.value.body["param"] == "n"
        with pytest.raises(openai.BadRequestError) as e:  # past int64: was a 500 from the engine's generator
            await c.chat.completions.create(model="m", messages=messages, seed=2**70)
        assert e.value.body["param"] == "seed"
        assert e.value.body["message"] == f"seed must be in [-2**63, 2**63 - 1], got {2**70}"
        missing = await s.post("/chat/completions", sid, json={"model": "m"})
        assert missing.status_code == 400 and missing.json()["error"] == {
            "message": "Missing required parameter: 'messages'.", "type": "invalid_request_error",
            "param": "messages", "code": "missing_required_parameter"}
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(model="m", messages=messages, max_tokens=0)
        assert e.value.body["param"] == "max_tokens"

        # The session goes on where it was: the same trajectory as without the bad requests.
        while True:
            msg = (await c.chat.completions.create(model="m", messages=messages, tools=env.tools)).choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                break
            messages += add_tool_messages(msg)
        [traj] = await s.gw.end_session(sid)
    assert traj.token_ids == ref.token_ids and traj.loss_mask == ref.loss_mask
    assert traj.engine_logprobs == ref.engine_logprobs and traj.info["segments"] == 1
    assert traj.info["gateway_bad_requests"] == 6


async def test_unknown_and_ended_session_ids_are_refused(tok):
    async with Served(gateway(tok, scripted(tok, ["ok"]))) as s:
        msgs = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.AuthenticationError) as e:
            await s.client("not-a-session").chat.completions.create(model="m", messages=msgs)
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        sid = s.gw.open_session()
        await s.client(sid).chat.completions.create(model="m", messages=msgs)
        end = await s.post(f"/sessions/{sid}/end")
        assert end.status_code == 200 and len(end.json()["trajectories"]) == 1
        with pytest.raises(openai.AuthenticationError):
            await s.client(sid).chat.completions.create(model="m", messages=msgs)
        assert (await s.post(f"/sessions/{sid}/end")).status_code == 401
        assert (await s.post("/sessions/nope/reward", json={"reward": 1.0})).status_code == 401
        # Ended over HTTP: the trajectories wait for the owner, who can still set the reward.
        s.gw.set_reward(sid, 2.0)
        [traj] = await s.gw.end_session(sid)
        assert traj.reward == 2.0 and traj.info["ended_by"] == "end"
        with pytest.raises(SessionEnded):
            s.gw.set_reward(sid, 1.0)


async def test_idle_session_times_out(tok):
    async with Served(gateway(tok, scripted(tok, ["ok"]), session_timeout_s=0.3)) as s:
        sid = s.gw.open_session(task_id="t")
        await s.client(sid).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        r = await s.post(f"/sessions/{sid}/reward", json={"reward": 1.0})
        assert r.status_code == 200
        await asyncio.sleep(1.0)
        assert s.gw.open_sessions == []
        with pytest.raises(openai.AuthenticationError):
            await s.client(sid).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        ended = s.gw.pop_ended()
    [traj] = ended[sid]
    assert traj.info["ended_by"] == "timeout" and traj.info["error_kind"] == "timeout"
    assert traj.reward == 1.0 and traj.num_turns == 1


async def test_malformed_tool_call_becomes_readable_content(tok):
    broken = '<tool_call>\n{"name": "add", "arguments": {"a": 2,}\n</tool_call>'
    turns = scripted(tok, [broken, "9"])
    async with Served(gateway(tok, turns)) as s:
        sid = s.gw.open_session()
        env = AddEnv()
        resp = await s.client(sid).chat.completions.create(
            model="m", messages=[dict(m) for m in env.initial_messages(TASKS[0])], tools=env.tools)
        [traj] = await s.gw.end_session(sid)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content.startswith("[tool call not parsed: tool call 1: invalid JSON in <tool_call>")
    assert traj.info["tool_errors_by_kind"] == {"parse_error": 1}
    assert traj.token_ids[traj.prompt_len:] == turns[0]


async def test_tool_call_ids_never_repeat_within_a_session(tok):
    # The failure: each turn's calls were numbered from call_0, so a session's second call shared the
    # first's id. Now ids count the session's call attempts (malformed ones included), over its
    # segments too, as an env's ids count its episode's (the same rule: ParsedAction.numbered_from).
    broken = '<tool_call>\n{"name": "add", "arguments": {"a": 2,}\n</tool_call>'
    texts = [broken + "\n" + tool_call_text("add", a=2, b=3),
             tool_call_text("add", a=5, b=4) + "\n" + tool_call_text("add", a=1, b=1), "9"]
    turns = scripted(tok, texts)
    env = AddEnv()
    env.reset(options={"task": TASKS[0]})
    for text in texts:
        env.step(text)
    env_ids = [[c["id"] for c in m["tool_calls"]] for m in env.messages if m.get("tool_calls")]
    assert env_ids == [["call_0", "call_1"], ["call_2", "call_3"]]
    async with Served(gateway(tok, turns)) as s:
        for _ in range(2):  # a replayed session gets the same ids
            sid = s.gw.open_session()
            c = s.client(sid)
            messages = [dict(m) for m in env.initial_messages(TASKS[0])]
            ids = []
            for _ in range(2):
                msg = (await c.chat.completions.create(model="m", messages=messages, tools=env.tools)).choices[0].message
                ids.append([call.id for call in msg.tool_calls])
                messages += [msg.model_dump(exclude_none=True), *add_tool_messages(msg)]
            # A rewritten history opens a new segment; the script answers it with its first turn again.
            msg = (await c.chat.completions.create(model="m", messages=messages[:2], tools=env.tools)).choices[0].message
            ids.append([call.id for call in msg.tool_calls])
            trajs = await s.gw.end_session(sid)
            # The malformed attempt is no tool_call (it is content) but holds its place: ids as the env's.
            assert ids == [["call_1"], ["call_2", "call_3"], ["call_5"]]
            assert len(trajs) == 2



async def test_generated_ids_step_around_the_ids_a_client_put_in_the_history(tok):
    # The failure: the session numbered its calls from its own count alone, so a history holding a
    # client's call_0 (a scripted first step) got a second call_0 from the gateway, and a client's
    # call_2 a second call_2. Now a generated id takes the next free number, as an env's does.
    client_call = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}
    env = AddEnv()
    env.reset(options={"task": TASKS[0]})
    env.step({"role": "assistant", "content": "", "tool_calls": [client_call]})
    env.step(tool_call_text("add", a=2, b=3))
    env.step(tool_call_text("add", a=5, b=4) + "\n" + tool_call_text("add", a=1, b=2))
    env_ids = [[c["id"] for c in m["tool_calls"]] for m in env.messages if m.get("tool_calls")]
    assert env_ids == [["call_0"], ["call_1"], ["call_2", "call_3"]]
    # The script answers by assistant turns in the prompt: the client's own call is turn 0.
    texts = ["(the client's turn)", tool_call_text("add", a=2, b=3),
             tool_call_text("add", a=5, b=4) + "\n" + tool_call_text("add", a=1, b=2)]
    async with Served(gateway(tok, scripted(tok, texts))) as s:
        for _ in range(2):  # a replayed session gets the same ids
            sid = s.gw.open_session()
            c = s.client(sid)
            messages = [dict(m) for m in env.initial_messages(TASKS[0])]
            messages += [{"role": "assistant", "content": "", "tool_calls": [client_call]},
                         {"role": "tool", "content": "2", "tool_call_id": "call_0", "name": "add"}]
            ids = []
            for _ in range(2):
                msg = (await c.chat.completions.create(model="m", messages=messages, tools=env.tools)).choices[0].message
                ids.append([call.id for call in msg.tool_calls])
                messages += [msg.model_dump(exclude_none=True), *add_tool_messages(msg)]
            await s.gw.end_session(sid)
            # As the env's, less the client's call, which the session did not make (nor count).
            assert ids == [["call_1"], ["call_2", "call_3"]]
        # A client id equal to the next count is stepped around too.
        sid = s.gw.open_session()
        messages = [dict(m) for m in env.initial_messages(TASKS[0])]
        messages += [{"role": "assistant", "content": "", "tool_calls": [{**client_call, "id": "call_1"}]},
                     {"role": "tool", "content": "2", "tool_call_id": "call_1", "name": "add"}]
        c = s.client(sid)
        msg = (await c.chat.completions.create(model="m", messages=messages, tools=env.tools)).choices[0].message
        assert [call.id for call in msg.tool_calls] == ["call_0"]
        messages += [msg.model_dump(exclude_none=True), *add_tool_messages(msg)]
        msg = (await c.chat.completions.create(model="m", messages=messages, tools=env.tools)).choices[0].message
        assert [call.id for call in msg.tool_calls] == ["call_2", "call_3"]


WORDS = " ".join(f"w{i}" for i in range(40))


class WordyAddEnv(AddEnv):
    """AddEnv whose tool results open with 40 words: past an 8-token observation budget."""

    async def react(self, turn):
        out = await super().react(turn)
        out.messages = [{**m, "content": f"{WORDS} {m['content']}"} for m in out.messages]
        return out


async def test_tool_results_are_cut_to_max_observation_tokens_as_the_collector_cuts_them(tok):
    # The failure: the gateway rendered an agent's tool results whole, whatever
    # rollout.max_observation_tokens; the collector cuts the same env observation to it.
    turns = scripted(tok, THREE_TURNS)
    collector = Collector(replay(tok, turns), tok,
                          RolloutConfig(episode_timeout_s=30.0, max_observation_tokens=8))
    [ref] = await collector.collect(WordyAddEnv, [0])
    env = AddEnv()
    async with Served(gateway(tok, turns, max_observation_tokens=8)) as s:
        sid = s.gw.open_session()
        c = s.client(sid)
        messages = [dict(m) for m in env.initial_messages(TASKS[0])]
        for _ in range(3):
            msg = (await c.chat.completions.create(model="m", messages=messages, tools=env.tools)).choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            messages += [{**m, "content": f"{WORDS} {m['content']}"} for m in add_tool_messages(msg)]
        # A history cut back to the first tool result: a fresh prompt, its tool message cut too.
        await c.chat.completions.create(model="m", messages=messages[:4], tools=env.tools)
        first, second = await s.gw.end_session(sid)
    for name in FIELDS:
        assert getattr(first, name) == getattr(ref, name), name
    # Each result keeps its first 8 tokens and a marker naming the rest (the words are plain text).
    ids_5, ids_9 = enc(tok, f"{WORDS} 5"), enc(tok, f"{WORDS} 9")
    cut_5 = tok.decode(ids_5[:8]) + f"\n[... {len(ids_5) - 8} more tokens truncated]"
    assert first.messages[3]["content"] == cut_5
    assert first.info["observation_tokens_cut"] == ref.info["observation_tokens_cut"] == len(ids_5) + len(ids_9) - 16
    cut_history = [*messages[:3], {**messages[3], "content": cut_5}]
    prompt = enc(tok, ChatRenderer(tok).render(cut_history, env.tools, add_generation_prompt=True))
    assert second.token_ids[:second.prompt_len] == prompt
    assert second.info["observation_tokens_cut"] == len(ids_5) - 8
    # The agent keeps its whole result: what it sent is what the session compares against.
    assert messages[3]["content"] == f"{WORDS} 5"


async def test_context_budget_answers_length_and_truncates(tok):
    turns = scripted(tok, THREE_TURNS)
    env = AddEnv()
    prompt_len = len(ChatRenderer(tok).prompt_ids(env.initial_messages(TASKS[0]), env.tools))
    # Room for the first turn (cut by max_model_len) but not for the tool result after it.
    limit = prompt_len + 10
    collector = Collector(replay(tok, turns), tok, RolloutConfig(episode_timeout_s=30.0, max_model_len=limit))
    [ref] = await collector.collect(AddEnv, [0])
    async with Served(gateway(tok, turns, max_model_len=limit)) as s:
        sid = s.gw.open_session()
        c = s.client(sid)
        messages = [dict(m) for m in env.initial_messages(TASKS[0])]
        first = await c.chat.completions.create(model="m", messages=messages, tools=env.tools)
        assert first.choices[0].finish_reason == "length" and first.usage.completion_tokens == 10
        # The cut text holds no complete call; the agent answers as an env would not: with a user turn.
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
        second = await c.chat.completions.create(model="m", messages=messages, tools=env.tools)
        assert second.choices[0].finish_reason == "length" and second.choices[0].message.content == ""
        assert second.usage.completion_tokens == 0
        [traj] = await s.gw.end_session(sid)
    assert traj.truncated and traj.info["truncated_by"] == "max_model_len"
    assert traj.token_ids == ref.token_ids and traj.loss_mask == ref.loss_mask
    assert traj.info["turns"][0]["cut_by"] == "max_model_len"


async def test_prompt_too_long_is_a_failed_segment(tok):
    async with Served(gateway(tok, scripted(tok, ["ok"]), max_model_len=8)) as s:
        sid = s.gw.open_session()
        resp = await s.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a long enough question " * 3}])
        [traj] = await s.gw.end_session(sid)
    assert resp.choices[0].finish_reason == "length"
    assert traj.info["error_kind"] == "prompt_too_long" and traj.num_turns == 0 and sum(traj.loss_mask) == 0


async def test_logprobs_stop_models_stream_and_path_form(tok):
    turns = scripted(tok, ["Hello </b> world"])
    engine = replay(tok, turns)
    async with Served(Gateway(engine, tok, sampling=SamplingParams(max_tokens=64, temperature=0.7))) as s:
        sid = s.gw.open_session()
        path_client = openai.AsyncOpenAI(base_url=s.base_url.replace("/v1", f"/s/{sid}/v1"), api_key="x",
                                         max_retries=0)
        models = await path_client.models.list()
        assert [m.id for m in models.data] == ["chatgym"]
        resp = await path_client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=2, stop=["</b>"],
            seed=7, temperature=0.0)
        params = engine.calls[-1][1]
        assert (params.seed, params.temperature, params.stop, params.max_tokens) == (7, 0.0, ("</b>",), 64)
        ids = [e.token for e in resp.choices[0].logprobs.content]
        assert resp.choices[0].message.content == "Hello </b>" and "".join(ids) == "Hello </b>"
        assert resp.choices[0].logprobs.content[0].top_logprobs[0].logprob == resp.choices[0].logprobs.content[0].logprob
        stream = await s.client(sid).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "again"}], stream=True)
        chunks = [ch async for ch in stream]
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "Hello </b> world"
        assert chunks[-1].choices[0].finish_reason == "stop"
        trajs = await s.gw.end_session(sid)
    assert [t.stop_reasons for t in trajs] == [["</b>"], [IM_END]]


async def test_engine_error_is_a_500_and_the_retry_continues(tok):
    turns = scripted(tok, ["ok"])

    class Flaky(ReplayEngine):
        fail_next = True

        async def generate(self, prompt_ids, params) -> Completion:
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("GPU fell off")
            return await super().generate(prompt_ids, params)

    engine = Flaky(turn_script(turns, enc(tok, ASSISTANT_HEADER)), tok)
    async with Served(Gateway(engine, tok)) as s:
        sid = s.gw.open_session()
        msgs = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.InternalServerError) as e:
            await s.client(sid).chat.completions.create(model="m", messages=msgs)
        assert e.value.body["code"] == "engine_error" and "GPU fell off" in e.value.body["message"]
        await s.client(sid).chat.completions.create(model="m", messages=msgs)
        [traj] = await s.gw.end_session(sid)
    assert traj.num_turns == 1 and traj.info["gateway_engine_errors"] == 1 and traj.info["segments"] == 1


async def test_tool_choice_none_offers_no_tools_and_parses_no_calls(tok):
    turns = scripted(tok, [tool_call_text("add", a=2, b=3)])
    engine = replay(tok, turns)
    env = AddEnv()
    messages = [dict(m) for m in env.initial_messages(TASKS[0])]
    async with Served(Gateway(engine, tok)) as s:
        sid = s.gw.open_session()
        resp = await s.client(sid).chat.completions.create(model="m", messages=messages, tools=env.tools,
                                                           tool_choice="none")
        [traj] = await s.gw.end_session(sid)
    assert engine.calls[0][0] == enc(tok, ChatRenderer(tok).render(messages, None, add_generation_prompt=True))
    assert resp.choices[0].message.tool_calls is None and resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content == tool_call_text("add", a=2, b=3)
    assert traj.num_turns == 1


async def test_unknown_route_gets_an_openai_shaped_404(tok):
    async with Served(gateway(tok, scripted(tok, ["ok"]))) as s, httpx.AsyncClient() as c:
        r = await c.get(s.base_url + "/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


def sync_agent(base_url: str, sid: str) -> list[dict]:
    """The add agent with the blocking ``openai.OpenAI`` client, as an agent program is usually written."""
    client = openai.OpenAI(base_url=base_url, api_key=sid, max_retries=0, timeout=30)
    env = AddEnv()
    messages: list = [dict(m) for m in env.initial_messages(TASKS[0])]
    while True:
        msg = client.chat.completions.create(model="m", messages=messages, tools=env.tools).choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return messages
        messages.extend(add_tool_messages(msg))


async def test_blocking_client_in_a_thread(tok):
    turns = scripted(tok, THREE_TURNS)
    collector = Collector(replay(tok, turns), tok, RolloutConfig(episode_timeout_s=30.0))
    [ref] = await collector.collect(AddEnv, [0])
    async with Served(gateway(tok, turns)) as s:
        sid = s.gw.open_session()
        await asyncio.to_thread(sync_agent, s.base_url, sid)
        r = await s.post(f"/sessions/{sid}/reward", json={"reward": 1.0})
        assert r.status_code == 200 and r.json() == {"ok": True}
        [traj] = await s.gw.end_session(sid)
    assert traj.token_ids == ref.token_ids and traj.engine_logprobs == ref.engine_logprobs and traj.reward == 1.0


async def test_a_request_in_flight_is_not_timed_out(tok):
    gw = Gateway(replay(tok, scripted(tok, ["ok"]), delay_s=1.0), tok, session_timeout_s=0.3)
    async with Served(gw) as s:
        sid = s.gw.open_session()
        resp = await s.client(sid).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert resp.choices[0].message.content == "ok" and s.gw.open_sessions == [sid]
        [traj] = await s.gw.end_session(sid)
    assert traj.info["ended_by"] == "end" and traj.error is None and traj.terminated


async def test_response_budget_truncates_the_segment(tok):
    turns = scripted(tok, THREE_TURNS)
    collector = Collector(replay(tok, turns), tok, RolloutConfig(episode_timeout_s=30.0, max_response_tokens=30))
    [ref] = await collector.collect(AddEnv, [0])
    assert ref.info["truncated_by"] == "max_response_tokens"
    async with Served(gateway(tok, turns, max_response_tokens=30)) as s:
        sid = s.gw.open_session()
        conversation = await add_agent(s.client(sid), TASKS[0])
        [traj] = await s.gw.end_session(sid)
    assert traj.token_ids == ref.token_ids and traj.loss_mask == ref.loss_mask
    assert traj.truncated and traj.info["truncated_by"] == "max_response_tokens"
    assert [t["cut_by"] for t in traj.info["turns"] if "cut_by" in t] == [t["cut_by"] for t in ref.info["turns"]
                                                                        if "cut_by" in t]
    # The first turn was cut inside its closing tag: the call is complete, the finish reason says "length".
    assert conversation[2]["tool_calls"][0]["function"]["name"] == "add" and conversation[-1]["content"] == ""
    assert traj.finish_reasons == ["length"]


async def test_scorer_rewards_sessions_that_report_none_and_the_header_names_the_session(tok):
    seen = []

    async def scorer(messages, meta):
        seen.append((messages[-1]["content"], meta))
        return 1.0 if "9" in messages[-1]["content"] else 0.0

    def broken(messages, meta):
        raise RuntimeError("no judge")

    for fn, reward in ((scorer, 1.0), (broken, 0.0)):
        async with Served(gateway(tok, scripted(tok, ["It is 9."]), scorer=fn)) as s:
            sid = s.gw.open_session(meta={"answer": 9})
            r = await s.post("/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "?"}]},
                             headers={"X-Chatgym-Session": sid})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "It is 9."
            [traj] = await s.gw.end_session(sid)
        assert traj.reward == reward and traj.info["meta"] == {"answer": 9}
    assert seen == [("It is 9.", {"answer": 9})]
    assert traj.info["reward_missing"] is True and traj.info["scorer_error"] == "RuntimeError: no judge"


async def test_a_conversation_the_template_refuses_is_a_400(tok):
    strict = ("{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
              "{{ raise_exception('system only first') }}{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
              "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    async with Served(gateway(tok, scripted(tok, ["ok"]), chat_template=strict)) as s:
        sid = s.gw.open_session()
        with pytest.raises(openai.BadRequestError) as e:
            await s.client(sid).chat.completions.create(model="m", messages=[
                {"role": "user", "content": "hi"}, {"role": "system", "content": "late"}])
        assert "system only first" in e.value.body["message"]
        resp = await s.client(sid).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert resp.choices[0].message.content == "ok"
        [traj] = await s.gw.end_session(sid)
    assert traj.num_turns == 1 and traj.info["gateway_bad_requests"] == 1


async def test_a_sessions_sampling_seed_follows_the_collectors_rule(tok):
    """open_session(sampling_seed=b): a request without a seed is sampled with hash((b, group, sample,
    turn)) % 2**31, turn counting the session's sampled turns over its segments; a failed request
    samples none (its retry gets the same seed); a request's own seed wins; no rule: the default."""
    turns = scripted(tok, ["one", "two", "three", "four"])
    seeds: list[int | None] = []

    class Flaky(ReplayEngine):
        fail_next = True

        async def generate(self, prompt_ids, params) -> Completion:
            seeds.append(params.seed)
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("transient")
            return await super().generate(prompt_ids, params)

    engine = Flaky(turn_script(turns, enc(tok, ASSISTANT_HEADER)), tok)
    async with Served(Gateway(engine, tok, sampling=SamplingParams(max_tokens=16, seed=3))) as s:
        sid = s.gw.open_session(group_id=1, sample_index=2, sampling_seed=11)
        c = s.client(sid)
        msgs = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.InternalServerError):
            await c.chat.completions.create(model="m", messages=msgs)
        msg = (await c.chat.completions.create(model="m", messages=msgs)).choices[0].message
        msgs += [msg.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        await c.chat.completions.create(model="m", messages=msgs, seed=7)
        await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "anew"}])  # segment 2
        first, second = await s.gw.end_session(sid)
        plain = s.gw.open_session(group_id=1, sample_index=2)
        await s.client(plain).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        await s.gw.end_session(plain)
    rule = [hash((11, 1, 2, turn)) % 2**31 for turn in (0, 2)]
    assert seeds == [rule[0], rule[0], 7, rule[1], 3]
    assert (first.num_turns, second.num_turns) == (2, 1)


def test_a_session_body_with_a_seed_past_int64_is_refused_naming_it():
    from chatgym.trainer.gateway.openai_api import ApiError, session_fields

    assert session_fields({"sampling_seed": -(2**63)}) == {"sampling_seed": -(2**63)}
    with pytest.raises(ApiError) as e:
        session_fields({"sampling_seed": 2**63})
    assert e.value.param == "sampling_seed"


async def test_shutdown_refuses_new_sessions_and_requests_and_writes_every_session_with_turns(
    tok, tmp_path, monkeypatch, capsys
):
    # Regression: `chatgym gateway` ended the sessions it saw when SIGINT came, while it still took new
    # ones: a session opened during the drain was answered 200 but never written to --out.
    import os
    import signal

    from chatgym.trainer.gateway import cli

    built: list[Gateway] = []

    def build(cfg, *, port, on_end, workdir):  # cli.serve's gateway on a slow scripted engine
        built.append(Gateway(replay(tok, scripted(tok, ["ok", "late"]), delay_s=1.0), tok, port=port,
                             on_end=on_end, http_sessions=True))
        return built[0]

    monkeypatch.setattr(cli, "build_gateway", build)
    out = tmp_path / "t.jsonl"
    server = asyncio.create_task(cli.serve(None, port=0, out=out, workdir=tmp_path))
    try:
        while not out.exists():  # made once the gateway listens, with the signal handlers set right after
            assert not server.done()
            await asyncio.sleep(0.01)
        base = f"http://127.0.0.1:{built[0].port}/v1"
        msgs = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(timeout=30) as c:
            sid = (await c.post(base + "/sessions")).json()["session_id"]
            other = (await c.post(base + "/sessions")).json()["session_id"]
            in_flight = asyncio.create_task(c.post(base + "/chat/completions", json=msgs,
                                                   headers={"Authorization": f"Bearer {sid}"}))
            while not built[0].engine.calls:
                await asyncio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(0.2)  # the shutdown has begun; the request in flight still samples
            late = await c.post(base + "/sessions")
            turn = await c.post(base + "/chat/completions", json=msgs, headers={"Authorization": f"Bearer {other}"})
            done = await in_flight
        await asyncio.wait_for(server, 30)
    finally:
        server.cancel()
    refused = {"error": {"message": "the gateway is shutting down: it opens no new sessions and serves no new "
                                    "requests", "type": "server_error", "param": None, "code": "shutting_down"}}
    assert (late.status_code, late.json()) == (503, refused)
    assert (turn.status_code, turn.json()) == (503, refused)
    assert done.status_code == 200 and done.json()["choices"][0]["message"]["content"] == "ok"
    [line] = out.read_text().splitlines()
    written = json.loads(line)
    assert (written["info"]["session_id"], written["info"]["ended_by"]) == (sid, "shutdown")
    assert capsys.readouterr().out.splitlines()[-1] == "chatgym gateway: stopped (2 open sessions ended, 1 with turns written)"
    assert len(built[0].engine.calls) == 1
