"""Engines as simulated users / judges (``chatgym.trainer.engines.responder``): prompt rendering,
reply decoding, traces for co-training; the chat-API adapter against a real local HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from aiohttp import web

from chatgym.envs import messages as M
from chatgym.envs.agents import ask
from chatgym.envs.judge.env import JudgeEnv
from chatgym.trainer.chat.tokenizer import get_tokenizer
from chatgym.trainer.engines.openai_chat import OpenAIChatEngine
from chatgym.trainer.engines.replay import ReplayEngine, replay_logprob
from chatgym.trainer.engines.responder import ChatResponder, EngineResponder, as_responder


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smollm2")


def test_engine_responder_renders_generates_and_decodes(tokenizer):
    reply_ids = tokenizer.encode("Rating: [[7]]", add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # The script would go on after <|im_end|>; the engine must stop there (EOS in stop ids).
    engine = ReplayEngine(lambda prompt: [*reply_ids, end, 42, 43], tokenizer)
    responder = EngineResponder(engine, tokenizer, trace=True)
    conversation = [M.system("You judge."), M.user("Rate: 2+2=4")]
    message, trace = asyncio.run(ask(responder, conversation))
    assert message == M.assistant("Rating: [[7]]")
    # Prompt ids computed independently with the tokenizer's own chat template call.
    expected_prompt = tokenizer.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert engine.calls[0][0] == expected_prompt == trace["prompt_ids"]
    assert trace["token_ids"] == [*reply_ids, end]
    assert trace["logprobs"] == [replay_logprob(t) for t in [*reply_ids, end]]
    assert trace["finish_reason"] == "stop" and trace["messages"] == conversation
    assert end in engine.calls[0][1].stop_token_ids


def test_untraced_responder_and_prompt_limit(tokenizer):
    engine = ReplayEngine(lambda prompt: tokenizer.encode("hi", add_special_tokens=False), tokenizer)
    responder = EngineResponder(engine, tokenizer, max_prompt_tokens=5)
    with pytest.raises(ValueError, match="max_prompt_tokens=5"):
        asyncio.run(responder.respond([M.user("a long enough conversation to pass five tokens")]))
    responder.max_prompt_tokens = None
    assert asyncio.run(ask(responder, [M.user("x")])) == (M.assistant("hi"), None)


def test_engine_without_tokenizer_is_refused():
    with pytest.raises(ValueError, match="pass tokenizer="):
        EngineResponder(ReplayEngine(lambda p: []))


def test_traced_engine_judge_in_judge_env(tokenizer):
    ids = tokenizer.encode("Fine. Rating: [[8]]", add_special_tokens=False)
    judge = EngineResponder(ReplayEngine(lambda p: ids, tokenizer), tokenizer, trace=True)
    env = JudgeEnv(split="all", judge=judge)
    env.reset(options={"task_index": 0})
    _, reward, *_, info = env.step("An answer.")
    assert reward == pytest.approx(7 / 9 / 2)
    [trace] = info["judge_traces"]
    assert trace["token_ids"] == ids and trace["rating"] == 8.0 and trace["question_turn"] == 0
    assert "An answer." in tokenizer.decode(trace["prompt_ids"])
    env.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_chat_responder_talks_to_a_real_http_server():
    received = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        received.append(body)
        last = body["messages"][-1]["content"]
        return web.json_response(
            {"choices": [{"message": {"role": "assistant", "content": f"echo: {last}"}}]}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    engine = OpenAIChatEngine("judge-model", base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
    try:
        responder = as_responder(engine)
        assert isinstance(responder, ChatResponder)
        assert await responder.respond([M.user("hello")]) == M.assistant("echo: hello")
        assert received[0]["model"] == "judge-model" and received[0]["messages"] == [M.user("hello")]
        assert "tools" not in received[0]
    finally:
        await engine.close()
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _tool_call_server(completions):
    """An OpenAIChatEngine on a real aiohttp ``/v1/chat/completions`` answered by ``completions``."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    engine = OpenAIChatEngine("agent-model", base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
    try:
        yield engine
    finally:
        await engine.close()
        await runner.cleanup()


async def test_openai_chat_replaces_server_ids_that_repeat():
    # Regression: a server's own ids were kept even when they repeated (within a turn, or an id of an
    # earlier turn), so two calls shared one id and their results could not be told apart. The first
    # use keeps the server's id; a repeat gets a made id. Real HTTP server.
    turns = iter([["dup", "dup", "fresh"], ["dup", "other", "other"]])

    async def completions(request: web.Request) -> web.Response:
        calls = [{"id": i, "type": "function", "function": {"name": "add", "arguments": "{}"}} for i in next(turns)]
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": calls}}]})

    async with _tool_call_server(completions) as engine:
        first = await engine.chat([M.user("add")])
        assert [c["id"] for c in first["tool_calls"]] == ["dup", "call_1", "fresh"]
        history = [M.user("add"), first]
        history += [{"role": "tool", "content": "2", "tool_call_id": c["id"]} for c in first["tool_calls"]]
        second = await engine.chat(history)  # the 4th-6th calls of the episode: call_3, (other), call_5
        assert [c["id"] for c in second["tool_calls"]] == ["call_3", "other", "call_5"]


async def test_openai_chat_numbers_id_less_tool_calls_after_the_conversation():
    # Regression: a server's tool calls without ids got call_{i} per turn, so the second turn's call
    # was call_0 again and a client pairing tool results by id mixed the two turns' calls up. Real
    # HTTP server; its calls carry no id (or an empty one).
    async def completions(request: web.Request) -> web.Response:
        call = {"type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        return web.json_response(
            {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call, {**call, "id": ""}]}}]}
        )

    async with _tool_call_server(completions) as engine:
        first = await engine.chat([M.user("add")])
        assert [c["id"] for c in first["tool_calls"]] == ["call_0", "call_1"]
        history = [M.user("add"), first]
        history += [{"role": "tool", "content": "2", "tool_call_id": c["id"]} for c in first["tool_calls"]]
        # The user's own id call_3 is taken: the second turn's calls are the 3rd and 4th -> call_2, call_4.
        history.append({"role": "tool", "content": "x", "tool_call_id": "call_3"})
        second = await engine.chat(history)
        assert [c["id"] for c in second["tool_calls"]] == ["call_2", "call_4"]
