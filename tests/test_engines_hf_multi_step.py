"""``multi_step``: the static path decodes N steps per read-back of the sampled ids
(trainer/engines/hf.py ``_take_tokens``). Every row's ids are the ones single steps give — greedy rows
the model's own continuation, seeded rows their generator's draws — whether it stops mid-run (EOS,
stop string, budget), is cut by ``max_model_len``, or joins later; the host waits once per N steps.
CPU, a small random Llama in fp32 (the static step runs eagerly)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from test_engines_hf_static import ATOL, TINY, greedy_reference

from chatgym.trainer.chat.tokenizer import get_tokenizer
from chatgym.trainer.engines import SamplingParams, hf_sampling
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.models.random_init import random_model

PROMPTS = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40)), [300, 301, 302], [9, 9, 9]]
# Budgets 5, 9, 60 (cut at 64 - 29 = 35 columns), 7, 13; greedy, seeded at temperature 1, and one
# request that joins 30 ms late (after several multi-step runs of the others).
PARAMS = [SamplingParams(max_tokens=m, temperature=t, seed=40 + i)
          for i, (m, t) in enumerate(zip([5, 9, 60, 7, 13], [0.0, 1.0, 1.0, 0.0, 1.0], strict=True))]


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smollm2")


@pytest.fixture(scope="module")
def model():
    return random_model("smollm2", seed=3, **TINY).eval()


async def run(model, tokenizer, multi_step: int, async_scheduling: bool = False, stop_eos: bool = False):
    engine = TransformersEngine(model, tokenizer, decode="static", max_model_len=64, multi_step=multi_step,
                                async_scheduling=async_scheduling, eos_token_ids=None if stop_eos else [])

    async def late(i: int):
        await asyncio.sleep(0.03 if i == 4 else 0.0)
        return await engine.generate(PROMPTS[i], PARAMS[i])

    try:
        return list(await asyncio.gather(*(late(i) for i in range(len(PROMPTS)))))
    finally:
        await engine.close()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("multi_step", [3, 8])
async def test_multi_step_gives_the_ids_of_single_steps(model, tokenizer, multi_step, async_scheduling):
    single = await run(model, tokenizer, 1)
    multi = await run(model, tokenizer, multi_step, async_scheduling)
    assert [len(o.token_ids) for o in multi] == [5, 9, 35, 7, 13]
    assert multi[2].finish_reason == "length"
    for a, b in zip(multi, single, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < ATOL
    for i in (0, 3):  # the greedy rows: the model's own continuations
        assert multi[i].token_ids == greedy_reference(model, PROMPTS[i], PARAMS[i].max_tokens)[0]


async def test_a_stop_string_mid_run_ends_the_row_where_single_steps_end_it(model, tokenizer):
    # Greedy from one prompt: take the text of its 3rd..4th ids as a stop string; with 8 steps a
    # read-back the row still ends on the id that completes it, and the ids after it are dropped.
    prompt = [1, 5, 9, 200, 3]
    ids = greedy_reference(model, prompt, 12)[0]
    stop = tokenizer.decode(ids[2:4])
    params = SamplingParams(max_tokens=12, temperature=0, stop=[stop])
    outs = []
    for multi_step in (1, 8):
        engine = TransformersEngine(model, tokenizer, decode="static", max_model_len=64, eos_token_ids=[],
                                    multi_step=multi_step)
        try:
            outs.append(await engine.generate(prompt, params))
        finally:
            await engine.close()
    assert outs[0].token_ids == outs[1].token_ids and outs[1].finish_reason == "stop"
    assert stop in tokenizer.decode(outs[1].token_ids) and len(outs[1].token_ids) <= 4


async def test_the_host_reads_back_once_per_multi_step_run(model, tokenizer, monkeypatch):
    # One request of 12 tokens, 4 steps a read-back: 3 read-backs (ids 1-4 from the prefill's logits
    # and three decodes, then 5-8, then 9-12), against 12 with single steps; 11 decodes either way.
    reads = []
    start = hf_sampling.start_to_host
    monkeypatch.setattr(hf_sampling, "start_to_host", lambda *a: (reads.append(a[2]), start(*a))[1])
    for multi_step, want in ((1, 12), (4, 3)):
        reads.clear()
        engine = TransformersEngine(model, tokenizer, decode="static", max_model_len=64, eos_token_ids=[],
                                    multi_step=multi_step)
        try:
            out = await engine.generate([7, 8], SamplingParams(max_tokens=12, temperature=0))
        finally:
            await engine.close()
        assert len(out.token_ids) == 12 and len(reads) == want and engine.decode_steps == 11
        assert [len(r) for r in reads] == [multi_step] * want  # one triple of ids/logprobs/flags a step


def test_multi_step_is_refused_where_it_cannot_run(model, tokenizer):
    for bad in (0, -1, 2.0, True, "4"):
        with pytest.raises(ValueError, match=r"^multi_step must be an int >= 1, got "):
            TransformersEngine(model, tokenizer, decode="static", multi_step=bad)
    with pytest.raises(ValueError, match=r"^multi_step 4 needs decode 'static' \(this engine decodes 'dynamic'\)$"):
        TransformersEngine(model, tokenizer, decode="dynamic", multi_step=4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_cuda_multi_step_with_graphs_and_philox_gives_the_ids_of_single_steps(tokenizer):
    # The captured step, the philox sampler (ids keyed by seed and token count) and async scheduling:
    # four steps a read-back give single steps' ids; greedy rows are the model's own continuations.
    cuda_model = random_model("smollm2", device="cuda", seed=3, **TINY).eval()
    prompts = PROMPTS[:4]
    params = [SamplingParams(max_tokens=m, temperature=t, seed=50 + i)
              for i, (m, t) in enumerate(zip([5, 20, 60, 7], [0.0, 1.0, 1.0, 0.0], strict=True))]
    outs = {}
    for multi_step in (1, 4):
        engine = TransformersEngine(cuda_model, tokenizer, decode="static", max_model_len=64, eos_token_ids=[],
                                    async_scheduling=True, sampler="philox", multi_step=multi_step)
        try:
            outs[multi_step] = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)))
        finally:
            await engine.close()
    assert [len(o.token_ids) for o in outs[4]] == [5, 20, 35, 7]
    assert [o.token_ids for o in outs[4]] == [o.token_ids for o in outs[1]]
    for i in (0, 3):
        assert outs[4][i].token_ids == greedy_reference(cuda_model, prompts[i], params[i].max_tokens)[0]
