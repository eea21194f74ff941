"""SGLangServerEngine against a FAKE of SGLang's HTTP server (SGLang has no CPU build to run here).

``FakeSGLang`` is the one fake in the engine tests: a real aiohttp server on 127.0.0.1 that answers
``/generate``, ``/update_weights_from_disk`` and ``/flush_cache`` in the shapes SGLang documents
(``GenerateReqInput`` / ``SamplingParams`` in, ``text`` / ``output_ids`` / ``meta_info`` with
``output_token_logprobs`` = ``[[logprob, id, text|null], ...]`` and ``finish_reason`` =
``{"type": "stop", "matched": id}`` or ``{"type": "length", "length": n}`` out). Its "model" emits a
scripted id sequence with logprob ``-0.5 * (i + 1)`` for the i-th id, so every expected value is known
exactly. Stop strings are matched as SGLang does (the decoded output checked after every id; the
request ends on the id that completes one, ``finish_reason`` ``{"type": "stop", "matched": str}``,
and with ``no_stop_trim`` the ids and the text keep it); for that the fake decodes with SmolLM2's
tokenizer.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from aiohttp import web
from safetensors.torch import load_file

from chatgym.trainer.engines import SamplingParams, make_engine
from chatgym.trainer.engines.http import ServerError
from chatgym.trainer.engines.sglang_server import SGLangServerEngine

EOS = 2  # SmolLM2's <|im_end|>
SCRIPT = [504, 2988, 314, 216, 36, 30, EOS, 77, 78]  # the fake model's output: 6 ids, then EOS


class FakeSGLang:
    """A FAKE SGLang server: documented request/response shapes, scripted outputs."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.fail_next: list[int] = []  # HTTP statuses to answer before behaving
        self.update_ok = True
        self.script = SCRIPT
        self.tokenizer = None  # set to decode for stop strings
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/update_weights_from_disk", self.update_weights)
        app.router.add_route("*", "/flush_cache", self.flush_cache)
        self.runner = web.AppRunner(app)

    async def start(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)  # port 0: the OS picks a free one
        await site.start()
        port = self.runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        await self.runner.cleanup()

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("/generate", body))
        if self.fail_next:
            return web.Response(status=self.fail_next.pop(0), text="overloaded")
        sp = body["sampling_params"]
        if sp["max_new_tokens"] > 1000:
            return web.json_response({"error": {"message": "max_new_tokens too large"}}, status=400)
        stops = {EOS, *sp.get("stop_token_ids", [])}
        out: list[int] = []
        matched = None
        for token in self.script:
            out.append(token)
            if token in stops:
                matched = token
                break
            if sp.get("stop"):
                text = self.tokenizer.decode(out, skip_special_tokens=False)
                hit = [s for s in sp["stop"] if s in text]
                if hit:
                    matched = hit[0]
                    break
            if len(out) == sp["max_new_tokens"]:
                break
        finish = (
            {"type": "stop", "matched": matched}
            if matched is not None
            else {"type": "length", "length": len(out)}
        )
        meta = {
            "id": "req-1",
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(out),
            "cached_tokens": 0,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[-0.5 * (i + 1), t, None] for i, t in enumerate(out)]
        return web.json_response({"text": "ignored", "output_ids": out, "meta_info": meta})

    async def update_weights(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("/update_weights_from_disk", body))
        if not self.update_ok:
            return web.json_response({"success": False, "message": "shape mismatch"})
        return web.json_response({"success": True, "message": "Succeeded to update model weights."})

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.requests.append(("/flush_cache", {}))
        return web.Response(text="Cache flushed.")


@pytest.fixture
async def fake():
    server = FakeSGLang()
    url = await server.start()
    server.url = url
    yield server
    await server.stop()


@pytest.fixture(scope="module")
def tokenizer():
    from chatgym.trainer.chat.tokenizer import get_tokenizer

    return get_tokenizer("smollm2")


@pytest.fixture
async def engine(fake, tokenizer):
    eng = SGLangServerEngine("smollm2", fake.url, tokenizer=tokenizer, retries=2, timeout_s=10)
    eng.client.backoff_s = 0.01
    yield eng
    await eng.close()


async def test_request_body_follows_sglang_api(engine, fake):
    params = SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, top_k=20, stop_token_ids=(36,), seed=11)
    await engine.generate([1, 4093, 198], params)
    path, body = fake.requests[-1]
    assert path == "/generate"
    assert body == {
        "input_ids": [1, 4093, 198],
        "sampling_params": {
            "max_new_tokens": 5,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "stop_token_ids": [36],
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "sampling_seed": 11,
        },
        "return_logprob": True,
        "stream": False,
    }
    await engine.generate([1], SamplingParams(max_tokens=2))
    assert fake.requests[-1][1]["sampling_params"]["top_k"] == -1  # ours -1/0 -> SGLang's "disabled"
    assert "sampling_seed" not in fake.requests[-1][1]["sampling_params"]


async def test_stop_on_eos_keeps_the_eos_id_and_its_logprob(engine):
    out = await engine.generate([1, 4093, 198], SamplingParams(max_tokens=50))
    assert out.token_ids == [504, 2988, 314, 216, 36, 30, 2]
    assert out.logprobs == [-0.5, -1.0, -1.5, -2.0, -2.5, -3.0, -3.5]
    assert out.finish_reason == "stop"
    assert out.text == "The answer is 4."  # decoded locally, EOS left out
    assert out.info["server_finish_reason"] == {"type": "stop", "matched": 2}
    assert out.info["prompt_tokens"] == 3


async def test_length_even_when_the_prompt_contains_eos(engine):
    out = await engine.generate([1, 2, 198, 2], SamplingParams(max_tokens=3))
    assert out.token_ids == [504, 2988, 314]
    assert out.finish_reason == "length"


async def test_stop_token_ids_and_no_logprobs(engine, fake):
    out = await engine.generate([1], SamplingParams(max_tokens=50, stop_token_ids=(216,), logprobs=False))
    assert out.token_ids == [504, 2988, 314, 216]
    assert out.finish_reason == "stop"
    assert out.logprobs == []
    assert fake.requests[-1][1]["return_logprob"] is False


async def test_retries_on_503_then_succeeds(engine, fake):
    fake.fail_next = [503, 503]
    out = await engine.generate([1], SamplingParams(max_tokens=2))
    assert out.token_ids == [504, 2988]
    assert [p for p, _ in fake.requests] == ["/generate"] * 3


async def test_gives_up_after_retries_and_never_retries_a_400(engine, fake):
    fake.fail_next = [503, 503, 503]
    with pytest.raises(ServerError, match="HTTP 503") as err:
        await engine.generate([1], SamplingParams(max_tokens=2))
    assert err.value.status == 503
    assert len(fake.requests) == 3  # 1 + retries=2
    fake.requests.clear()
    with pytest.raises(ServerError, match="max_new_tokens too large") as err:
        await engine.generate([1], SamplingParams(max_tokens=5000))
    assert err.value.status == 400
    assert len(fake.requests) == 1


async def test_update_weights_from_disk_then_flush(engine, fake, tmp_path):
    engine._weights_dir = tmp_path / "w"
    weights = {"model.norm.weight": torch.arange(4.0), "lm_head.weight": torch.ones(2, 3)}
    await asyncio.to_thread(engine.update_weights, weights)
    assert [p for p, _ in fake.requests] == ["/update_weights_from_disk", "/flush_cache"]
    model_path = fake.requests[0][1]["model_path"]
    assert model_path == str(tmp_path / "w")
    saved = load_file(f"{model_path}/model.safetensors")
    assert torch.equal(saved["model.norm.weight"], torch.arange(4.0))
    assert torch.equal(saved["lm_head.weight"], torch.ones(2, 3))
    # The model's config travels with the weights: SGLang loads a model directory.
    assert json.loads((tmp_path / "w" / "config.json").read_text())["model_type"] == "llama"
    fake.update_ok = False
    with pytest.raises(ServerError, match="shape mismatch"):
        await asyncio.to_thread(engine.update_weights, weights)


async def test_update_weights_names_a_non_tensor_value_before_asking_the_server(engine, fake, tmp_path):
    # Regression: AttributeError ('numpy.ndarray' object has no attribute 'detach') from save_weights.
    import numpy as np

    engine._weights_dir = tmp_path / "w"
    weights = {"model.norm.weight": torch.arange(4.0), "lm_head.weight": np.ones((2, 3))}
    with pytest.raises(TypeError) as err:
        await asyncio.to_thread(engine.update_weights, weights)
    assert str(err.value) == "update_weights: 'lm_head.weight' is a ndarray, not a torch.Tensor"
    assert fake.requests == [] and not (tmp_path / "w").exists()


async def test_remote_model_uses_the_servers_finish_reason(fake):
    eng = make_engine("sglang", "some-remote-model", base_url=fake.url)
    assert eng.tokenizer is None and eng.eos_token_ids == frozenset()
    out = await eng.generate([1], SamplingParams(max_tokens=50))
    assert out.finish_reason == "stop" and out.token_ids[-1] == EOS
    assert out.text == "ignored"  # no local tokenizer: the server's text
    await eng.close()


async def test_malformed_answers_are_clear_errors(engine):
    with pytest.raises(ServerError, match="meta_info"):
        engine.parse_response({"text": "x"}, SamplingParams())
    with pytest.raises(ServerError, match="different ids"):
        engine.parse_response(
            {"output_ids": [5], "meta_info": {"output_token_logprobs": [[-1.0, 6, None]]}}, SamplingParams()
        )
    with pytest.raises(ServerError, match="neither"):
        engine.parse_response({"meta_info": {}}, SamplingParams())


async def test_connection_refused_is_a_server_error():
    eng = SGLangServerEngine("some-remote-model", "http://127.0.0.1:9", retries=1, timeout_s=2)
    eng.client.backoff_s = 0.01
    with pytest.raises(ServerError, match="after 2 attempts"):
        await eng.generate([1], SamplingParams(max_tokens=2))
    await eng.close()


async def test_stop_strings_are_sent_and_their_ids_kept(engine, fake, tokenizer):
    fake.tokenizer = tokenizer
    # '<','search','>','a','</','search','>.' then a second search: the 7th id (">.", 19369)
    # completes "</search>" mid-token and is kept, with its logprob.
    first = tokenizer.encode("<search>a</search>.", add_special_tokens=False)
    fake.script = [*first, *tokenizer.encode("<search>b</search>", add_special_tokens=False), EOS]
    assert first == [44, 7916, 46, 81, 9617, 7916, 19369]
    out = await engine.generate([1], SamplingParams(max_tokens=50, stop=["</search>", "</answer>"]))
    sampling = fake.requests[-1][1]["sampling_params"]
    assert sampling["stop"] == ["</search>", "</answer>"] and sampling["no_stop_trim"] is True
    assert out.token_ids == first
    assert out.logprobs == [-0.5, -1.0, -1.5, -2.0, -2.5, -3.0, -3.5]
    assert (out.finish_reason, out.stop_reason) == ("stop", "</search>")
    assert out.text == "<search>a</search>."  # the stop string is content: kept, the whole last id
    assert out.info["server_finish_reason"] == {"type": "stop", "matched": "</search>"}
    # A request without stop strings sends none and runs to EOS, named as the stop reason.
    out = await engine.generate([1], SamplingParams(max_tokens=50))
    assert "stop" not in fake.requests[-1][1]["sampling_params"]
    assert out.token_ids == fake.script and out.stop_reason == EOS


async def test_remote_model_takes_the_stop_string_the_server_names(fake, tokenizer):
    fake.tokenizer = tokenizer
    fake.script = [*tokenizer.encode("<answer>x</answer> more", add_special_tokens=False), EOS]
    eng = make_engine("sglang", "some-remote-model", base_url=fake.url)  # no local tokenizer / EOS ids
    out = await eng.generate([1], SamplingParams(max_tokens=50, stop=("</answer>",)))
    assert (out.finish_reason, out.stop_reason) == ("stop", "</answer>")
    assert out.token_ids == tokenizer.encode("<answer>x</answer>", add_special_tokens=False)
    await eng.close()
