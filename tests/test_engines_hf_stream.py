"""The hf engine's own CUDA stream (trainer/engines/hf_stream.py): the worker issues on a stream of the
highest priority, not the default one a learner uses, and still orders itself after work the caller
queued on the default stream (a model trained in place) and before ``update_weights``' copies."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from test_engines_hf_static import TINY, greedy_reference

from chatgym.trainer.chat.tokenizer import get_tokenizer
from chatgym.trainer.engines import SamplingParams
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.models.random_init import random_model

PROMPTS = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40))]
GREEDY = SamplingParams(max_tokens=12, temperature=0)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


async def _ids(engine: TransformersEngine) -> list[list[int]]:
    return [o.token_ids for o in await asyncio.gather(*(engine.generate(p, GREEDY) for p in PROMPTS))]


async def test_off_cuda_the_worker_keeps_no_stream():
    model = random_model("smollm2", seed=3, **TINY).eval()
    engine = TransformersEngine(model, get_tokenizer("smollm2"), max_model_len=128)
    try:
        assert await _ids(engine) == [greedy_reference(model, p, 12)[0] for p in PROMPTS]
        assert engine._stream is None
    finally:
        await engine.close()


async def test_a_request_sent_while_the_engine_closes_is_answered_or_cancelled_never_left_waiting():
    """Regression (second fresh-user walk, ~1 round in 30): a request queued after the stopping worker
    had cancelled its inbox, while its thread was still alive, waited for a worker nobody started."""
    model = random_model("smollm2", seed=3, **TINY).eval()
    engine = TransformersEngine(model, get_tokenizer("smollm2"), max_model_len=128, batch_window_s=0)
    params = SamplingParams(max_tokens=2, temperature=0)
    want = greedy_reference(model, PROMPTS[1], 2)[0]
    try:
        for _ in range(60):
            first = asyncio.ensure_future(engine.generate(PROMPTS[1], params))
            await asyncio.sleep(0)
            closing = asyncio.ensure_future(engine.close())
            await asyncio.sleep(0)
            late = asyncio.ensure_future(engine.generate(PROMPTS[1], params))
            await asyncio.wait_for(closing, 5)
            for request in (first, late):  # cancelled by the close, or decoded: never pending
                done, _ = await asyncio.wait({request}, timeout=5)
                assert done, "a request was left waiting"
                assert request.cancelled() or request.result().token_ids == want
    finally:
        await engine.close()


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
async def test_the_worker_decodes_on_its_own_highest_priority_stream_beside_default_stream_work(async_scheduling):
    model = random_model("smollm2", device="cuda", seed=3, **TINY).eval()
    engine = TransformersEngine(model, get_tokenizer("smollm2"), decode="static", max_model_len=128,
                                async_scheduling=async_scheduling)
    expected = [greedy_reference(model, p, 12)[0] for p in PROMPTS]
    stop = threading.Event()

    def busy() -> None:  # a learner's kernels on the default stream, issued the whole time
        a = torch.randn(4096, 4096, device="cuda")
        while not stop.is_set():
            a = torch.tanh(a @ a * 1e-3)
        torch.cuda.synchronize()

    learner = threading.Thread(target=busy)
    learner.start()
    try:
        assert await _ids(engine) == expected
        assert await _ids(engine) == expected
    finally:
        stop.set()
        learner.join()
        await engine.close()
    stream = engine._stream
    assert stream is not None and stream != torch.cuda.default_stream()
    assert stream.priority == torch.cuda.Stream(priority=-(1 << 10)).priority < 0


@pytest.mark.gpu
@cuda
async def test_a_batch_starts_after_the_weights_the_caller_wrote_in_place_on_the_default_stream():
    """The race this order prevents: the caller's in-place write queued behind ~0.1 s of default-stream
    work; a worker on its own stream that did not wait would decode with the old weights."""
    model = random_model("smollm2", device="cuda", seed=3, **TINY).eval()
    other = random_model("smollm2", device="cuda", seed=4, **TINY).eval()
    engine = TransformersEngine(model, get_tokenizer("smollm2"), decode="static", max_model_len=128)
    try:
        await _ids(engine)  # captured graphs, the worker and its stream exist
        a = torch.randn(4096, 4096, device="cuda")
        for _ in range(40):  # queued first: the copies below wait behind it on the default stream
            a = torch.tanh(a @ a * 1e-3)
        with torch.no_grad():
            for mine, new in zip(model.parameters(), other.parameters(), strict=True):
                mine.copy_(new)
        assert await _ids(engine) == [greedy_reference(other, p, 12)[0] for p in PROMPTS]
    finally:
        await engine.close()


@pytest.mark.gpu
@cuda
async def test_a_worker_started_after_close_decodes_what_the_first_one_did():
    """close() ends the worker while an async_scheduling step it queued may still run; the next worker's
    stream waits for the old one before its prefill writes the same KV slots (not run on a GPU yet)."""
    model = random_model("smollm2", device="cuda", seed=3, **TINY).eval()
    engine = TransformersEngine(model, get_tokenizer("smollm2"), decode="static", max_model_len=128,
                                async_scheduling=True)
    expected = [greedy_reference(model, p, 12)[0] for p in PROMPTS]
    for _ in range(3):
        try:
            assert await _ids(engine) == expected
        finally:
            await engine.close()
