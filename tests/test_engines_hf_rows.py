"""When an idle engine starts a batch, and when finished rows leave it (trainer/engines/hf_rows.py).

An idle engine waits while a burst of requests keeps arriving, so it is prefilled in one pass; on the
static path a finished row keeps its slot until the live rows fit a smaller row bucket or a joiner
needs the slot, and the live rows' ids stay each one's own greedy continuation. CPU, a small random
Llama in fp32 (the static step runs eagerly there)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

import pytest
from test_engines_hf_static import TINY, greedy_reference

from chatgym.trainer.chat.tokenizer import get_tokenizer
from chatgym.trainer.engines import SamplingParams
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.engines.hf_rows import compacts, wait_for_burst
from chatgym.trainer.engines.hf_static import StaticSlots
from chatgym.trainer.models.random_init import random_model


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smollm2")


@pytest.fixture(scope="module")
def model():
    m = random_model("smollm2", seed=3, **TINY)
    m.eval()
    return m


def watch_slots(engine: TransformersEngine, calls: list) -> None:
    """Record every ``select`` / ``retire`` the engine's slots get, with its argument."""
    engine._slots = slots = StaticSlots(engine.model, engine.max_batch_size, engine.max_model_len, use_graphs=False)
    select, retire = slots.select, slots.retire
    slots.select = lambda keep: (calls.append(("select", list(keep))), select(keep))[1]
    slots.retire = lambda rows: (calls.append(("retire", list(rows))), retire(rows))[1]


def test_compacts_when_the_live_rows_fit_a_smaller_bucket():
    bucket = StaticSlots.row_bucket.__get__(SimpleSlots(64))
    assert [compacts(live, 8, bucket) for live in (7, 5, 4, 1, 0)] == [False, False, True, True, True]
    assert [compacts(live, 4, bucket) for live in (3, 2)] == [False, True]
    assert compacts(33, 64, bucket) is False and compacts(32, 64, bucket) is True
    assert compacts(2, 3, bucket) is True  # 3 slots run in the 4-row bucket, 2 rows fit the 2-row one


class SimpleSlots:
    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
async def test_finished_rows_ride_along_until_the_live_rows_fit_a_smaller_bucket(model, tokenizer, async_scheduling):
    # 8 rows with budgets 2..9 (no EOS): one finishes a step. Live 7, 6, 5 stay in the 8-row bucket
    # (retired in place), 4 fit the 4-row bucket (compact), 3 stay, then 2, 1 and 0 each compact. Row i
    # finishes after its (2 + i)th token.
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40)), [300, 301, 302], [9, 9, 9], [4] * 11, [60, 61], [2]]
    engine = TransformersEngine(model, tokenizer, decode="static", max_model_len=64, eos_token_ids=[],
                                async_scheduling=async_scheduling)
    calls: list = []
    watch_slots(engine, calls)
    try:
        outs = await asyncio.gather(*(
            engine.generate(p, SamplingParams(max_tokens=2 + i, temperature=0)) for i, p in enumerate(prompts)
        ))
    finally:
        await engine.close()
    assert engine.batches_run == 1  # one burst, one prefill
    assert calls[:8] == [("retire", [0]), ("retire", [1]), ("retire", [2]), ("select", [4, 5, 6, 7]),
                         ("retire", [0]), ("select", [2, 3]), ("select", [1]), ("select", [])]
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        assert out.token_ids == greedy_reference(model, prompt, 2 + i)[0]


async def test_a_joiner_takes_the_slot_after_the_live_rows(model, tokenizer):
    # Row 0 (budget 2) finishes and is retired in place (3 live rows stay in the 4-row bucket); a request
    # joining then first moves the live rows down, then fills slot 3.
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40)), [300, 301, 302]]
    joiner = [9, 9, 9]
    engine = TransformersEngine(model, tokenizer, decode="static", max_model_len=64, eos_token_ids=[])
    calls: list = []
    watch_slots(engine, calls)
    try:
        first = [asyncio.ensure_future(engine.generate(p, SamplingParams(max_tokens=2 if i == 0 else 20, temperature=0)))
                 for i, p in enumerate(prompts)]
        await first[0]
        late = await engine.generate(joiner, SamplingParams(max_tokens=3, temperature=0))
        outs = await asyncio.gather(*first)
    finally:
        await engine.close()
    assert calls[:2] == [("retire", [0]), ("select", [1, 2, 3])]
    assert late.token_ids == greedy_reference(model, joiner, 3)[0]
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        assert out.token_ids == greedy_reference(model, prompt, 2 if i == 0 else 20)[0]


async def test_a_burst_arriving_over_time_is_prefilled_in_one_pass(model, tokenizer):
    # 12 requests, one every 3 ms (36 ms in all; the fixed 5 ms window before this took them in several
    # prefills). The quiet period is generous so a loaded machine's late wake-ups do not split the burst.
    engine = TransformersEngine(model, tokenizer, decode="static", max_model_len=64, batch_quiet_s=0.5,
                                batch_window_s=30)

    async def arrive(i: int):
        await asyncio.sleep(0.003 * i)
        return await engine.generate([5 + i, 7, 9], SamplingParams(max_tokens=3, temperature=0))

    try:
        outs = await asyncio.gather(*(arrive(i) for i in range(12)))
    finally:
        await engine.close()
    assert engine.batches_run == 1 and engine.rows_run == 12
    assert [o.token_ids for o in outs] == [greedy_reference(model, [5 + i, 7, 9], 3)[0] for i in range(12)]


def produce(cond: threading.Condition, inbox: deque, n: int, gap_s: float) -> threading.Thread:
    def run():
        for i in range(n):
            time.sleep(gap_s)
            with cond:
                inbox.append(i)
                cond.notify_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def burst(inbox: deque, full: int, window_s: float, quiet_s: float, producer=None) -> int:
    cond = threading.Condition()
    with cond:
        inbox.append("first")
        thread = producer(cond) if producer else None
        wait_for_burst(cond, inbox, full, window_s, quiet_s, lambda: False)
        got = len(inbox)
    if thread:
        thread.join()
    return got


def test_wait_for_burst_returns_when_the_burst_ends_fills_or_the_window_closes():
    # The burst ends: 9 more arrive 2 ms apart, then none for the quiet period.
    inbox: deque = deque()
    assert burst(inbox, 64, 30.0, 0.5, lambda c: produce(c, inbox, 9, 0.002)) == 10
    # Full: returns as the 4th request arrives (the producer keeps going, 0.1 s apart).
    inbox = deque()
    assert burst(inbox, 4, 30.0, 5.0, lambda c: produce(c, inbox, 6, 0.1)) == 4
    # A lone request waits the quiet period, not the window.
    t0 = time.monotonic()
    assert burst(deque(), 64, 30.0, 0.05) == 1
    assert time.monotonic() - t0 < 15.0
    # The window closes while requests still arrive (every 20 ms for 2 s; the window is 0.2 s).
    inbox = deque()
    assert burst(inbox, 1000, 0.2, 5.0, lambda c: produce(c, inbox, 100, 0.02)) < 101


def test_bad_batching_settings_are_named(model, tokenizer):
    with pytest.raises(ValueError, match=r"^batch_quiet_s must be a finite number of seconds >= 0, got -0.1$"):
        TransformersEngine(model, tokenizer, batch_quiet_s=-0.1)
    with pytest.raises(ValueError, match=r"^max_batch_size must be an int >= 1, got 0$"):
        TransformersEngine(model, tokenizer, max_batch_size=0)
