"""Parts of the in-process vLLM engine that start no vLLM engine: the reload-warning log filter, the CPU
memory defaults (the engine module imports vLLM lazily), the sampling parameters and the logprob reader."""

from __future__ import annotations

import logging

from chatgym.trainer.engines.vllm_logs import RELOAD_LOGGER, QuietExpectedReloadWarnings


def test_only_expected_layers_are_silenced(caplog):
    logger = logging.getLogger(RELOAD_LOGGER + ".test")
    logger.addFilter(QuietExpectedReloadWarnings({"RotaryEmbedding", "ParallelLMHead"}))
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("%s: Failed to load weights", "RotaryEmbedding")
        logger.warning("%s: Failed to load weights", "ParallelLMHead")
        logger.warning("%s: Failed to load weights", "QKVParallelLinear")  # a real problem: kept
        logger.warning("%s: something else", "RotaryEmbedding")  # another message: kept
    assert [r.getMessage() for r in caplog.records] == [
        "QKVParallelLinear: Failed to load weights",
        "RotaryEmbedding: something else",
    ]


def test_cpu_memory_defaults_fill_only_what_is_unset():
    # Regression: on CPU vLLM's default reservation (0.92 x RAM) refused to start the README's
    # `make_engine("vllm", "smollm2")` whenever other processes held a couple of GiB.
    from chatgym.trainer.engines.vllm_cpu import cpu_memory_defaults

    assert cpu_memory_defaults(None, {}, cuda=False, environ={}) == (2, {"gpu_memory_utilization": 0.25})
    assert cpu_memory_defaults(4, {"gpu_memory_utilization": 0.5, "x": 1}, cuda=False, environ={}) == (
        4,
        {"gpu_memory_utilization": 0.5, "x": 1},
    )
    # The environment's KV cache size wins over the default.
    assert cpu_memory_defaults(None, {}, cuda=False, environ={"VLLM_CPU_KVCACHE_SPACE": "6"}) == (
        None,
        {"gpu_memory_utilization": 0.25},
    )
    assert cpu_memory_defaults(None, {}, cuda=True, environ={}) == (None, {})  # GPUs: vLLM's own defaults


def test_server_request_sends_stop_strings_and_keeps_their_ids():
    # The /v1/completions payload and answer of a vLLM server, without a server: the body asks vLLM to
    # keep the stop string (include_stop_str_in_output) and the answer's stop_reason names it.
    import pytest

    from chatgym.trainer.engines import SamplingParams
    from chatgym.trainer.engines.vllm_server import VLLMServerEngine

    try:
        engine = VLLMServerEngine("smollm2", "http://127.0.0.1:9")  # local tokenizer and EOS ids
    except ModuleNotFoundError as exc:  # the model package is a set-up step (scripts/setup.sh)
        pytest.skip(str(exc))
    params = SamplingParams(max_tokens=9, temperature=0, stop=["</search>", "</answer>"])
    body = engine.request_body([1, 2, 3], params, "smollm2")
    assert body["stop"] == ["</search>", "</answer>"] and body["include_stop_str_in_output"] is True
    assert "stop" not in engine.request_body([1], SamplingParams(max_tokens=2), "smollm2")
    ids = [44, 7916, 46, 81, 9617, 7916, 19369]  # '<','search','>','a','</','search','>.'
    answer = {
        "choices": [
            {
                "text": "<search>a</search>",  # vLLM cuts its text at the stop string's end
                "token_ids": ids,
                "finish_reason": "stop",
                "stop_reason": "</search>",
                "logprobs": {"token_logprobs": [-0.1 * (i + 1) for i in range(7)]},
            }
        ],
        "usage": {"prompt_tokens": 3},
    }
    out = engine.parse_response(answer, params)
    assert out.token_ids == ids and out.logprobs == [-0.1 * (i + 1) for i in range(7)]
    assert (out.finish_reason, out.stop_reason) == ("stop", "</search>")
    assert out.text == "<search>a</search>."  # decoded from the ids: the whole last token
    # An EOS ending names the EOS id (vLLM's own stop_reason is null then).
    answer["choices"][0].update(token_ids=[504, 2], stop_reason=None, logprobs={"token_logprobs": [-1, -2]})
    out = engine.parse_response(answer, params)
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", 2, "The")


def test_cpu_scheduler_defaults_turn_chunked_prefill_off_on_cpu_only():
    # Regression (async pipeline on the main job): vLLM 0.32 on CPU failed every episode of a step
    # with "CPU Generator does not use offset" when a seeded request's prefill was chunked.
    from chatgym.trainer.engines.vllm_cpu import cpu_scheduler_defaults

    assert cpu_scheduler_defaults({"x": 1}, 512, cuda=False) == {
        "x": 1,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 4096,
    }
    assert cpu_scheduler_defaults({}, 8192, cuda=False)["max_num_batched_tokens"] == 8192
    assert cpu_scheduler_defaults({"enable_chunked_prefill": True}, 512, cuda=False) == {"enable_chunked_prefill": True}
    assert cpu_scheduler_defaults({}, 512, cuda=True) == {}


def test_cpu_compile_env_turns_off_the_aot_cache_only_where_unset():
    # Regression: vLLM-CPU 0.32 cannot load its own AOT artifact, so every start compiled again.
    from chatgym.trainer.engines.vllm_cpu import cpu_compile_env

    assert cpu_compile_env(cuda=False, environ={}) == {"VLLM_USE_AOT_COMPILE": "0"}
    assert cpu_compile_env(cuda=False, environ={"VLLM_USE_AOT_COMPILE": "1"}) == {}  # the user's choice
    assert cpu_compile_env(cuda=True, environ={}) == {}  # GPUs: vLLM's own default


def test_only_the_requested_cast_is_silenced(caplog):
    # Regression: vLLM warned once per tensor (122 lines) when the bf16 engine loaded fp32 weights.
    import torch

    from chatgym.trainer.engines.vllm_logs import LOAD_LOGGER, QuietRequestedCast

    logger = logging.getLogger(LOAD_LOGGER + ".test")
    logger.addFilter(QuietRequestedCast("bfloat16"))
    msg = QuietRequestedCast.MESSAGE
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning(msg, "embed_tokens.weight", torch.float32, torch.bfloat16)  # asked for: dropped
        logger.warning(msg, "lm_head.weight", torch.float32, torch.float16)  # not asked for: kept
        logger.warning(msg, "norm.weight", torch.bfloat16, torch.bfloat16)  # another pair: kept
    assert [r.getMessage() for r in caplog.records] == [
        "Attempted to load weight lm_head.weight with dtype torch.float32 into parameter with dtype torch.float16",
        "Attempted to load weight norm.weight with dtype torch.bfloat16 into parameter with dtype torch.bfloat16",
    ]


def test_sampled_logprobs_reads_flat_and_per_position_logprobs():
    # vLLM's own containers (the engine asks for flat_logprobs: a few lists a request, no object a token).
    import pytest

    vllm_logprobs = pytest.importorskip("vllm.logprobs", reason="needs vLLM")
    from chatgym.trainer.engines.vllm_params import sampled_logprobs

    Logprob = vllm_logprobs.Logprob
    ids = [7, 3, 7]
    flat = vllm_logprobs.FlatLogprobs()
    for tid, lp in zip(ids, (-0.5, -1.25, -2.0), strict=True):
        flat.append({tid: Logprob(logprob=lp, rank=1, decoded_token=None)})
    assert sampled_logprobs(ids, flat) == [-0.5, -1.25, -2.0]
    per_position = [{tid: Logprob(logprob=lp, rank=1)} for tid, lp in zip(ids, (-0.5, -1.25, -2.0), strict=True)]
    assert sampled_logprobs(ids, per_position) == [-0.5, -1.25, -2.0]
    # A position with a second entry (the sampled id not ranked first): read by the sampled id.
    two = vllm_logprobs.FlatLogprobs()
    two.append({5: Logprob(logprob=-0.1, rank=1), 7: Logprob(logprob=-3.0, rank=2)})
    assert sampled_logprobs([7], two) == [-3.0]
    assert sampled_logprobs(ids, None) == []
    with pytest.raises(RuntimeError, match="logprobs for 2 positions, 3 ids"):
        sampled_logprobs(ids, per_position[:2])
    with pytest.raises(RuntimeError, match="no logprob for a sampled id"):
        sampled_logprobs([9, 3, 7], per_position)


def test_vllm_params_ask_for_flat_logprobs_only_with_logprobs():
    import pytest

    pytest.importorskip("vllm", reason="needs vLLM")
    from chatgym.trainer.engines.base import SamplingParams
    from chatgym.trainer.engines.vllm_params import to_vllm_params

    on = to_vllm_params(SamplingParams(max_tokens=4))
    assert (on.logprobs, on.flat_logprobs) == (0, True)
    off = to_vllm_params(SamplingParams(max_tokens=4, logprobs=False))
    assert (off.logprobs, off.flat_logprobs) == (None, False)
    # vLLM skips its deep copy (skip_clone) and edits the stop ids in place: each call's object and its
    # containers must be the request's own.
    p = SamplingParams(max_tokens=4, stop_token_ids=(5,), stop=("</a>",))
    a, b = to_vllm_params(p), to_vllm_params(p)
    assert a.skip_clone and b.skip_clone and a is not b
    assert a.stop_token_ids == b.stop_token_ids == [5] and a.stop_token_ids is not b.stop_token_ids
    assert a.stop is not b.stop and a._all_stop_token_ids is not b._all_stop_token_ids


def _staging_engine():
    import queue

    from chatgym.trainer.engines.vllm_inproc import VLLMEngine

    eng = VLLMEngine.__new__(VLLMEngine)  # no vLLM: only the hand-off to the engine thread
    eng._inbox, eng._staged, eng._closed = queue.SimpleQueue(), {}, False
    return eng


def test_requests_submitted_in_one_loop_iteration_reach_the_engine_thread_in_one_put():
    # The engine thread steps on what it finds at wake-up; a gathered batch put one request at a time
    # reached vLLM in parts when submitting it outlasted the interpreter's 5 ms thread switch.
    import asyncio

    eng = _staging_engine()

    async def main():
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(3)]
        for i, f in enumerate(futures):
            eng._stage(loop, ("add", f"r{i}", None, None, f, loop, None))
        assert eng._inbox.empty()  # nothing sent before the iteration ends
        await asyncio.sleep(0)
        first = eng._inbox.get_nowait()
        eng._stage(loop, ("add", "r3", None, None, loop.create_future(), loop, None))
        await asyncio.sleep(0)
        return first, eng._inbox.get_nowait()

    first, second = asyncio.run(main())
    assert first[0] == "adds" and [c[1] for c in first[1]] == ["r0", "r1", "r2"]
    assert second[0] == "adds" and [c[1] for c in second[1]] == ["r3"]
    assert eng._inbox.empty() and eng._staged == {}


def test_requests_staged_when_the_engine_closes_fail_with_its_error():
    import asyncio

    import pytest

    eng = _staging_engine()

    async def main():
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        eng._stage(loop, ("add", "r0", None, None, future, loop, None))
        eng._closed = True
        await asyncio.sleep(0)
        return future

    future = asyncio.run(main())
    with pytest.raises(RuntimeError, match="VLLMEngine is closed"):
        future.result()
    assert eng._inbox.empty()


def test_a_stop_id_outside_the_vocabulary_is_a_value_error_before_vllm_sees_it():
    # Regression (fresh-user walk): vLLM refused it with its own VLLMValidationError (no ValueError),
    # against generate's documented errors; the hf engine's check, shared.
    import asyncio

    import pytest

    from chatgym.trainer.engines.base import SamplingParams

    eng = _staging_engine()
    eng.vocab_size, eng.max_model_len, eng.vision = 100, 64, None
    with pytest.raises(ValueError, match=r"SamplingParams\.stop_token_ids.*100"):
        asyncio.run(eng.generate([1, 2], SamplingParams(max_tokens=4, stop_token_ids=(10**6,))))
    assert eng._inbox.empty() and eng._staged == {}
