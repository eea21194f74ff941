"""Engine-independent rules (finish reason, prompt checks, weights on disk), the factory, the OpenAI
chat mapping, and the HTTP client's input checks."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from chatgym.trainer.engines import ENGINES, SamplingParams, engine_class, make_engine
from chatgym.trainer.engines.common import (
    check_prompt,
    completion_text,
    eos_token_ids,
    judge_finish,
    save_weights,
    server_finish,
    stop_ids,
)
from chatgym.trainer.engines.http import JSONClient, ServerError
from chatgym.trainer.engines.openai_chat import OpenAIChatEngine


def test_finish_reason_is_judged_on_the_completion_only():
    stop = stop_ids({2}, SamplingParams(stop_token_ids=(7,)))
    assert stop == {2, 7}
    assert judge_finish([5, 6, 2], stop) == "stop"
    assert judge_finish([5, 7], stop) == "stop"
    assert judge_finish([2, 5], stop) == "length"  # an EOS earlier than the end does not count
    assert judge_finish([], stop) == "length"


def test_server_finish_falls_back_to_the_servers_reason():
    assert server_finish([5, 2], frozenset({2}), True, "length") == "stop"  # ids win when EOS is known
    assert server_finish([5], frozenset(), False, {"type": "stop", "matched": 9}) == "stop"
    assert server_finish([5], frozenset(), False, "length") == "length"
    assert server_finish([5], frozenset(), False, {"type": "abort"}) == "abort"


def test_eos_ids_from_generation_config_first():
    class Cfg:
        def __init__(self, eos):
            self.eos_token_id = eos

    assert eos_token_ids(Cfg([2, 0]), Cfg(5)) == {0, 2}
    assert eos_token_ids(Cfg(None), Cfg(5)) == {5}
    assert eos_token_ids(None, None, Cfg(3)) == {3}
    assert eos_token_ids() == frozenset()


def test_check_prompt():
    assert check_prompt((1, 2, 3)) == [1, 2, 3]
    with pytest.raises(ValueError, match="empty"):
        check_prompt([])
    with pytest.raises(TypeError, match="list of token ids"):
        check_prompt("hello")
    # Regression (fresh-user walk): int() read 1.7 as 1, '12' as 12 and True as 1.
    for bad, shown in ((1.7, "float 1.7"), ("12", "str '12'"), (True, "bool True")):
        with pytest.raises(TypeError) as err:
            check_prompt([3, bad])
        assert str(err.value) == f"prompt_ids must hold ints (token ids), got {shown}"
    assert check_prompt([np.int64(4), 5, np.int32(6)]) == [4, 5, 6]  # NumPy's ints are ints
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        check_prompt([3, 10], vocab_size=10)
    with pytest.raises(ValueError, match="max_model_len is 3"):
        check_prompt([1, 2, 3], max_model_len=3)


def test_completion_text_drops_only_the_final_stop_id():
    class Tok:
        def decode(self, ids, skip_special_tokens):
            assert skip_special_tokens is False
            return "|".join(map(str, ids))

    assert completion_text(Tok(), [4, 2, 5, 2], "stop") == "4|2|5"
    assert completion_text(Tok(), [4, 2], "length") == "4|2"
    assert completion_text(None, [4], "stop") == ""


def test_save_weights_writes_tied_tensors_atomically(tmp_path):
    shared = torch.arange(6.0).reshape(2, 3)
    save_weights({"a.weight": shared, "b.weight": shared}, tmp_path)  # tied: safetensors needs copies
    loaded = load_file(tmp_path / "model.safetensors")
    assert torch.equal(loaded["a.weight"], shared) and torch.equal(loaded["b.weight"], shared)
    save_weights(iter([("a.weight", torch.zeros(1))]), tmp_path)
    assert set(load_file(tmp_path / "model.safetensors")) == {"a.weight"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]  # no temp file left


def test_save_weights_names_a_value_that_is_not_a_tensor_and_writes_nothing(tmp_path):
    # Regression: a numpy value was AttributeError ('numpy.ndarray' object has no attribute 'detach'),
    # a list value the same, naming no weight, after the directory and config had been written.
    import numpy as np

    out = tmp_path / "w"
    with pytest.raises(TypeError) as err:
        save_weights({"a.weight": torch.zeros(2), "b.weight": np.zeros(2)}, out)
    assert str(err.value) == "update_weights: 'b.weight' is a ndarray, not a torch.Tensor"
    with pytest.raises(TypeError) as err:
        save_weights(iter([("a.weight", torch.zeros(2)), ("b.weight", [0.0, 0.0])]), out)
    assert str(err.value) == "update_weights: 'b.weight' is a list, not a torch.Tensor"
    assert not out.exists()


def test_factory_names():
    assert set(ENGINES) == {"vllm", "vllm-server", "sglang", "hf", "openai"}
    assert engine_class("hf").__name__ == "TransformersEngine"
    assert engine_class("sglang").__name__ == "SGLangServerEngine"
    assert engine_class("vllm-server").__name__ == "VLLMServerEngine"
    assert engine_class("openai").__name__ == "OpenAIChatEngine"
    with pytest.raises(ValueError, match="choose one of"):
        make_engine("tgi")


def test_openai_chat_maps_tool_calls_and_refuses_token_ids(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    chat = OpenAIChatEngine("gpt-test")
    assert chat.client.base_url == "http://127.0.0.1:1/v1" and chat.client.api_key == "k"
    answer = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"a": 1}'},
                        },
                        {"type": "function", "function": {"name": "echo", "arguments": {"x": "é"}}},
                    ],
                }
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5},
    }
    assert chat.parse_response(answer) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
            {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": '{"x": "é"}'}},
        ],
    }
    assert chat.usage == {"prompt_tokens": 12, "completion_tokens": 5}
    for calls in (["add"], {"id": "c1"}):  # fresh user: an AttributeError ('str' ... 'get') before
        bad = {"choices": [{"message": {"role": "assistant", "content": "", "tool_calls": calls}}]}
        with pytest.raises(ServerError, match="tool_calls is not a list of objects"):
            chat.parse_response(bad)
    body = chat.request_body([{"role": "user", "content": "hi"}], None, SamplingParams(max_tokens=3, seed=4))
    assert body == {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "temperature": 1.0,
        "top_p": 1.0,
        "seed": 4,
    }
    with pytest.raises(NotImplementedError, match="token ids"):
        asyncio.run(chat.generate([1, 2], SamplingParams()))
    with pytest.raises(NotImplementedError, match="weights"):
        chat.update_weights({})
    with pytest.raises(ValueError, match="model"):
        OpenAIChatEngine("")


def test_json_client_checks_its_url():
    with pytest.raises(ValueError, match="base_url"):
        JSONClient("127.0.0.1:8000")
    assert JSONClient("http://h:1/").base_url == "http://h:1"


def test_check_server_passes_a_server_and_names_one_that_is_not_the_api():
    # The start-up check of chatgym rollout / eval / train (their tests: no server listening).
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines.http import check_server

    class Models(BaseHTTPRequestHandler):
        def do_GET(self):
            found = self.path == "/v1/models"
            body = b'{"data": [{"id": "m"}]}' if found else b"not here"
            self.send_response(200 if found else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        check_server("vllm-server", {"base_url": url}, "--engine-arg", "--engine")
        check_server("hf", {"base_url": "http://127.0.0.1:1"}, "--engine-arg", "--engine")  # not a server engine
        check_server("openai", {"base_url": f"{url}/v1"}, "--engine-arg", "--engine")  # GET /v1/models
        with pytest.raises(ConfigError) as err:  # 404: no API there (fresh-user walk: a root without /v1)
            check_server("openai", {"base_url": f"{url}/api"}, "--engine-arg", "--engine")
        assert str(err.value) == f"--engine-arg base_url: GET {url}/api/models answered HTTP 404: not here"
        with pytest.raises(ConfigError) as err:
            check_server("sglang", {"base_url": f"{url}/api"}, "engine.options", "engine.backend")
        assert str(err.value) == f"engine.options.base_url: GET {url}/api/v1/models answered HTTP 404: not here"
        with pytest.raises(ConfigError) as err:
            check_server("vllm-server", {"base_url": "127.0.0.1:8000"}, "--engine-arg", "--engine")
        assert str(err.value) == (
            "--engine-arg base_url: base_url must start with http:// or https://, got '127.0.0.1:8000'"
        )
    finally:
        server.shutdown()
        server.server_close()


def test_openai_chat_stop_strings_in_client_and_server_mode():
    stop = ("</search>", "</answer>")
    params = SamplingParams(max_tokens=30, temperature=0, stop=stop)
    msgs = [{"role": "user", "content": "q"}]

    def answer(content, **choice):
        return {"choices": [{"message": {"role": "assistant", "content": content}, **choice}]}

    # client (default): no `stop` sent (OpenAI would drop the matched string and not name it); the
    # reply is cut after the earliest-ending stop string, which is kept.
    client = OpenAIChatEngine("gpt-test", "http://127.0.0.1:1/v1", "k")
    assert "stop" not in client.request_body(msgs, None, params)
    two = "<search>a</search>\n<search>b</search><answer>c</answer>"
    assert client.parse_response(answer(two, finish_reason="stop"), stop)["content"] == "<search>a</search>"
    assert client.parse_response(answer(two), ())["content"] == two  # no stop strings: untouched
    # server: `stop` is sent and the string the server names is put back (vLLM: stop_reason,
    # SGLang: matched_stop); a server naming neither cannot be read exactly.
    server = OpenAIChatEngine("gpt-test", "http://127.0.0.1:1/v1", "k", stop_mode="server")
    assert server.request_body(msgs, None, params)["stop"] == ["</search>", "</answer>"]
    vllm_like = answer("<search>a", finish_reason="stop", stop_reason="</search>")
    assert server.parse_response(vllm_like, stop)["content"] == "<search>a</search>"
    sglang_like = answer("<answer>c", finish_reason="stop", matched_stop="</answer>")
    assert server.parse_response(sglang_like, stop)["content"] == "<answer>c</answer>"
    eos = answer("done", finish_reason="stop", stop_reason=None)
    assert server.parse_response(eos, stop)["content"] == "done"
    with pytest.raises(ServerError, match="stop_mode='client'"):
        server.parse_response(answer("<search>a", finish_reason="stop"), stop)
    with pytest.raises(ValueError, match="stop_mode"):
        OpenAIChatEngine("gpt-test", "http://127.0.0.1:1/v1", "k", stop_mode="both")


def test_the_pad_id_is_the_first_token_of_the_model_among_the_candidates():
    from types import SimpleNamespace

    from chatgym.trainer.engines.common import choose_pad_id, embedding_rows

    tok = SimpleNamespace(pad_token_id=7)
    # Declared pad id, else the smallest EOS id, else the tokenizer's pad id, else 0; each only inside [0, 100).
    assert choose_pad_id(3, {9, 5}, tok, 100) == 3
    assert choose_pad_id(None, {9, 5}, tok, 100) == 5
    assert choose_pad_id(-1, {9, 5}, tok, 100) == 5
    assert choose_pad_id(100, {-1, 150, 9}, tok, 100) == 9
    assert choose_pad_id(None, {-1, 100}, tok, 100) == 7
    assert choose_pad_id(None, set(), SimpleNamespace(pad_token_id=100), 100) == 0
    assert choose_pad_id(True, set(), None, 100) == 0  # a bool is not an id
    # The embedding's rows bound the ids when the config says more.
    emb = torch.nn.Embedding(64, 4)
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=80), get_input_embeddings=lambda: emb)
    assert embedding_rows(model) == 64
    assert embedding_rows(SimpleNamespace(config=SimpleNamespace(vocab_size=80))) == 80


def test_copy_weights_in_place_keeps_the_order_given_and_checks_a_sequence_first():
    """A list / state dict goes in same-dtype multi-tensor runs, split at each cast so the order given
    holds; it is checked whole first, so a bad pair copies nothing. A generator is read pair by pair
    (a producer may reuse one buffer), the pairs before a bad one copied."""
    import torch

    from chatgym.trainer.engines import common

    def fresh():
        return torch.nn.Sequential(torch.nn.Linear(4, 4, bias=True), torch.nn.Linear(4, 4, bias=False))

    model = fresh()
    ramp = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    common.copy_weights_in_place(
        model, {"0.weight": ramp, "0.bias": torch.full((4,), -1.5), "1.weight": (ramp / 4).to(torch.bfloat16)}
    )
    assert torch.equal(model[0].weight, ramp) and torch.equal(model[0].bias, torch.full((4,), -1.5))
    assert torch.equal(model[1].weight, ramp / 4)  # k/4 is exact in bf16
    # The same weight twice, the second a cast: the later value wins (a run is flushed before a cast).
    common.copy_weights_in_place(model, [("1.weight", torch.ones(4, 4)), ("1.weight", torch.full((4, 4), 2.0, dtype=torch.bfloat16))])
    assert torch.equal(model[1].weight, torch.full((4, 4), 2.0))
    before = {n: p.clone() for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match=r"'0.bias' has shape \(3,\)"):
        common.copy_weights_in_place(model, [("0.weight", torch.zeros(4, 4)), ("0.bias", torch.zeros(3))])
    with pytest.raises(KeyError, match="no weight named 'nope'"):
        common.copy_weights_in_place(model, [("0.weight", torch.zeros(4, 4)), ("nope", torch.zeros(1))])
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # nothing copied

    scratch = torch.empty(4, 4)

    def reused():  # one buffer refilled between pairs
        yield "0.weight", scratch.fill_(1.0)
        yield "1.weight", scratch.fill_(2.0)
        yield "nope", scratch

    with pytest.raises(KeyError, match="no weight named 'nope'"):
        common.copy_weights_in_place(model, reused())
    assert torch.equal(model[0].weight, torch.ones(4, 4)) and torch.equal(model[1].weight, torch.full((4, 4), 2.0))


def test_copy_weights_in_place_names_what_is_not_a_weight_and_copies_nothing():
    """Regression: a numpy value in a state dict passed the whole-input check (it has a shape) and
    failed in copy_ after the weights before it were copied; a list value, a bare tensor or a 3-tuple
    gave AttributeError / unpacking errors that named no weight."""
    import numpy as np
    import torch

    from chatgym.trainer.engines import common

    model = torch.nn.Linear(4, 4)
    before = {n: p.clone() for n, p in model.named_parameters()}
    with pytest.raises(TypeError, match=r"'bias' is a ndarray, not a torch.Tensor"):
        common.copy_weights_in_place(model, {"weight": torch.ones(4, 4), "bias": np.ones(4)})
    with pytest.raises(TypeError, match=r"'bias' is a list, not a torch.Tensor"):
        common.copy_weights_in_place(model, {"weight": torch.ones(4, 4), "bias": [1.0] * 4})
    with pytest.raises(TypeError, match=r"each weight must be a \(name, tensor\) pair, got tuple"):
        common.copy_weights_in_place(model, [("weight", torch.ones(4, 4)), ("bias", torch.ones(4), 1)])
    with pytest.raises(TypeError, match=r"weights must be a state dict or an iterable of \(name, tensor\), got Tensor"):
        common.copy_weights_in_place(model, torch.ones(4, 4))
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # nothing copied
    common.copy_weights_in_place(model, {"weight": torch.ones(4, 4)}.items())  # an items() view: checked whole too
    assert torch.equal(model.weight, torch.ones(4, 4))
