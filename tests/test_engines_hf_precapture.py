"""``precapture``: the static path captures, as requests join, every graph their decode can need
(trainer/engines/hf_static.py ``StaticSlots.precapture``), so no capture stalls a rollout mid-run.

CPU: the bucket lists against hand values, and a real engine run (the static step eager, a small random
Llama in fp32) whose every decode step falls in the plan captured before it. CUDA: the plan is captured
at the joins and nothing after, and the ids are the lazily capturing engine's."""

from __future__ import annotations

import asyncio

import pytest
import torch
from test_engines_hf_static import TINY

from chatgym.trainer.chat.tokenizer import get_tokenizer
from chatgym.trainer.config.loader import ConfigError
from chatgym.trainer.config.run import EngineConfig
from chatgym.trainer.engines import SamplingParams, check_options
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.engines.hf_options import check_options as check_hf_options
from chatgym.trainer.engines.hf_static import StaticSlots, buckets
from chatgym.trainer.models.random_init import random_model

# Prompts of 5, 2, 29, 3 and 29 tokens; the last joins 30 ms late and is the longest (29 + 150 = 179).
PROMPTS = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40)), [300, 301, 302], list(range(50, 79))]
PARAMS = [SamplingParams(max_tokens=m, temperature=t, seed=60 + i)
          for i, (m, t) in enumerate(zip([5, 9, 60, 7, 150], [0.0, 1.0, 1.0, 0.0, 1.0], strict=True))]


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smollm2")


@pytest.fixture(scope="module")
def model():
    return random_model("smollm2", seed=3, **TINY).eval()


def test_buckets_are_every_size_a_step_is_captured_at():
    assert buckets(64, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets(48, 48) == [1, 2, 4, 8, 16, 32, 48]  # the last cut to the cap
    assert buckets(8, 3) == [1, 2, 4]  # up to 3 rows: buckets 1, 2 and 4
    assert buckets(200, 89, 64) == [64, 128]
    assert buckets(200, 179, 64) == [64, 128, 200]
    assert buckets(200, 10, 64) == [64]  # the floor
    assert buckets(32, 10, 64) == [32]  # a cap under the floor


def test_the_plan_is_each_row_bucket_by_each_column_bucket(model):
    slots = StaticSlots(model, 8, 200, use_graphs=False)
    assert slots.capture_plan(89) == [(1, 64), (2, 64), (4, 64), (8, 64), (1, 128), (2, 128), (4, 128), (8, 128)]
    assert slots.capture_plan(500) == slots.capture_plan(200)  # rows never hold more than max_len
    assert slots.precapture(89) == 0 and slots.graphs_captured == 0  # no graphs on the CPU


async def run(engine: TransformersEngine) -> list[list[int]]:
    async def late(i: int):
        await asyncio.sleep(0.03 if i == 4 else 0.0)
        return await engine.generate(PROMPTS[i], PARAMS[i])

    try:
        return [o.token_ids for o in await asyncio.gather(*(late(i) for i in range(len(PROMPTS))))]
    finally:
        await engine.close()


@pytest.mark.parametrize("precapture", [True, False])
async def test_every_decode_step_falls_in_the_plan_captured_before_it(model, tokenizer, precapture):
    engine = TransformersEngine(model, tokenizer, decode="static", max_model_len=200, max_batch_size=8,
                                eos_token_ids=[], precapture=precapture)
    slots = engine._slots = StaticSlots(model, 8, 200, use_graphs=False)
    events: list[tuple] = []
    forward, plan = slots._forward, slots.precapture

    def recording_forward(n, width):
        events.append(("step", n, width))
        return forward(n, width)

    def recording_precapture(longest):
        events.append(("precapture", longest))
        return plan(longest)

    slots._forward, slots.precapture = recording_forward, recording_precapture
    ids = await run(engine)
    assert [len(i) for i in ids] == [5, 9, 60, 7, 150]
    longests = [e[1] for e in events if e[0] == "precapture"]
    if not precapture:
        assert longests == []
        return
    # Each call takes the longest prompt + max_tokens of the requests joining then (these, or the
    # first four together: 29 + 60), and the late request's 179 is seen.
    assert set(longests) <= {10, 11, 89, 179} and max(longests) == 179
    covered: set[tuple[int, int]] = set()
    for event in events:
        if event[0] == "precapture":
            covered |= set(slots.capture_plan(event[1]))
        else:
            assert event[1:] in covered, (event, sorted(covered))


def test_precapture_is_refused_where_it_cannot_run(model, tokenizer):
    for bad in (1, "true", None):
        with pytest.raises(ValueError, match=r"^precapture must be true or false, got "):
            TransformersEngine(model, tokenizer, decode="static", precapture=bad)
    with pytest.raises(ValueError, match=r"^precapture needs decode 'static' \(this engine decodes 'dynamic'\)$"):
        TransformersEngine(model, tokenizer, decode="dynamic", precapture=True)
    assert check_hf_options("static", precapture=True) is True  # the fused step kept as given
    with pytest.raises(ConfigError, match=r"^engine\.options: precapture must be true or false, got 'yes'"):
        check_options(EngineConfig(backend="hf", options={"decode": "static", "precapture": "yes"}))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_cuda_precapture_captures_the_plan_at_the_joins_and_gives_the_lazy_engines_ids(tokenizer):
    # The late request's join captures the 200-column graphs while the other rows decode: their
    # warm-up and capture write keys/values those rows' own next steps overwrite, so no id changes.
    cuda_model = random_model("smollm2", device="cuda", seed=3, **TINY).eval()
    outs, graphs = {}, {}
    for precapture in (False, True):
        engine = TransformersEngine(cuda_model, tokenizer, decode="static", max_model_len=200, max_batch_size=8,
                                    eos_token_ids=[], precapture=precapture)
        outs[precapture] = await run(engine)
        first = engine._slots.graphs_captured
        assert engine._slots.capture_failures == {}
        assert await run(engine) == outs[precapture]
        # A second run may meet a bucket the lazy engine has not captured (when the late request
        # joins depends on timing); the precapturing engine already holds every graph of its plan.
        graphs[precapture] = (first, engine._slots.graphs_captured)
    assert outs[True] == outs[False]
    plan = len(engine._slots.capture_plan(179))
    assert plan == 12 and graphs[True] == (12, 12) and graphs[False][0] <= graphs[False][1] <= 12
