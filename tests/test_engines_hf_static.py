"""Static-slot decoding (trainer/engines/hf_static.py): rows join and leave a preallocated KV cache,
and every row's ids and logprobs are the ones a full forward pass of the same weights gives.

CPU tests run the slot step eagerly on a small random Llama (fp32); the CUDA test checks the captured
graphs give the eager step's ids, are reused across sizes in a bucket and survive weight updates."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from chatgym.trainer.chat.tokenizer import get_tokenizer
from chatgym.trainer.engines import SamplingParams, hf_sampling
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.engines.hf_static import StaticSlots, supports
from chatgym.trainer.models.random_init import random_model

TINY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)
ATOL = 1e-5  # fp32: the slot cache changes only the order of float sums


@pytest.fixture(scope="module")
def model():
    m = random_model("smollm2", seed=3, **TINY)
    m.eval()
    return m


def greedy_reference(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """n greedy tokens by full forward passes (no cache), with their raw logprobs."""
    ids, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids], device=model.device)).logits[0, -1].float()
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    return ids[len(prompt) :], logprobs


def test_rows_join_and_leave_and_match_full_forward_passes(model):
    prompts = {"a": [1, 5, 9, 200, 3], "b": [7, 8], "c": list(range(11, 40))}
    slots = StaticSlots(model, max_rows=4, max_len=96, use_graphs=False)
    got: dict[str, list[int]] = {k: [] for k in prompts}
    lps: dict[str, list[float]] = {k: [] for k in prompts}

    def take(names, logits):
        logits = logits.float()
        tokens = logits.argmax(-1)
        for r, name in enumerate(names):
            got[name].append(int(tokens[r]))
            lps[name].append(float(torch.log_softmax(logits[r], -1)[tokens[r]]))
        return tokens

    with torch.inference_mode():
        running = ["a", "b"]
        tokens = take(running, slots.admit([prompts["a"], prompts["b"]], pad_id=0))
        slots.set_tokens(tokens)
        tokens = take(running, slots.decode())
        # "c" (29 tokens, wider than the others) joins after one decode step.
        joined = take(["c"], slots.admit([prompts["c"]], pad_id=0))
        running.append("c")
        slots.set_tokens(torch.cat([tokens, joined]))
        for step in range(6):
            tokens = take(running, slots.decode())
            if step == 1:  # "b" leaves: "c" moves down from slot 2 to slot 1
                slots.select([0, 2])
                tokens, running = tokens[[0, 2]], ["a", "c"]
            slots.set_tokens(tokens)
    # A row's position = prompt length + decode steps it took part in ("a": 1 + 6, "c": 6); it holds
    # one more token than that (the prefill's), the last one not yet written to the cache.
    assert slots.rows == 2 and slots.pos[:2].tolist() == [5 + 7, 29 + 6]
    assert [len(v) for v in got.values()] == [8, 4, 7]
    for name, prompt in prompts.items():
        ids, logprobs = greedy_reference(model, prompt, len(got[name]))
        assert got[name] == ids
        assert max(abs(x - y) for x, y in zip(lps[name], logprobs, strict=True)) < ATOL


def test_capacity_errors_are_clear(model):
    slots = StaticSlots(model, max_rows=2, max_len=16, use_graphs=False)
    with torch.inference_mode():
        with pytest.raises(ValueError, match="leaves no room in 16 columns"):
            slots.admit([list(range(1, 17))], pad_id=0)
        slots.admit([[1, 2], [3, 4]], pad_id=0)
        with pytest.raises(ValueError, match="1 joiners do not fit: 2 of 2 slots in use"):
            slots.admit([[5]], pad_id=0)


def test_supports_names_what_it_cannot_run(model):
    assert supports(model) == (True, "")
    gpt2 = SimpleNamespace(config=SimpleNamespace(model_type="gpt2"))
    ok, why = supports(gpt2)
    assert not ok and why == "model_type 'gpt2' is not one of ['llama', 'mistral', 'qwen2', 'qwen3']"
    window = SimpleNamespace(config=SimpleNamespace(model_type="mistral", sliding_window=4096))
    assert supports(window) == (False, "sliding-window attention")


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smollm2")


def test_engine_decode_choice(model, tokenizer):
    assert TransformersEngine(model, tokenizer).decode == "dynamic"  # auto on the CPU
    assert TransformersEngine(model, tokenizer, decode="static").decode == "static"
    with pytest.raises(ValueError, match="decode must be 'auto', 'static' or 'dynamic', got 'fast'"):
        TransformersEngine(model, tokenizer, decode="fast")
    # Regression: async_scheduling on the dynamic path was silently ignored.
    with pytest.raises(ValueError, match=r"^async_scheduling needs decode 'static' \(this engine decodes 'dynamic'\)$"):
        TransformersEngine(model, tokenizer, decode="dynamic", async_scheduling=True)


async def staggered(engine: TransformersEngine, prompts: list[list[int]]) -> list:
    async def late(i: int):
        await asyncio.sleep(0.02 * i)
        return await engine.generate(prompts[i], SamplingParams(max_tokens=6 + 3 * i, temperature=0))

    try:
        outs = list(await asyncio.gather(*(late(i) for i in range(len(prompts)))))
        outs.append(await engine.generate(prompts[0], SamplingParams(max_tokens=10, temperature=1.0, seed=5)))
        return outs
    finally:
        await engine.close()


async def test_engine_static_path_equals_dynamic_path(model, tokenizer):
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40)), [300, 301, 302]]
    static = await staggered(TransformersEngine(model, tokenizer, decode="static", max_model_len=64), prompts)
    dynamic = await staggered(TransformersEngine(model, tokenizer, decode="dynamic", max_model_len=64), prompts)
    for s, d in zip(static, dynamic, strict=True):
        assert s.token_ids == d.token_ids and s.finish_reason == d.finish_reason
        assert max(abs(x - y) for x, y in zip(s.logprobs, d.logprobs, strict=True)) < 1e-4
    # The greedy rows are the model's own greedy continuations.
    for prompt, out in zip(prompts, static[:4], strict=True):
        assert out.token_ids == greedy_reference(model, prompt, len(out.token_ids))[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
async def test_cuda_graphs_match_eager_and_survive_weight_updates(tokenizer, async_scheduling):
    model = random_model("smollm2", device="cuda", seed=3, **TINY)
    model.eval()
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40))]
    params = SamplingParams(max_tokens=12, temperature=0)

    async def run(engine):
        try:
            return [o.token_ids for o in await asyncio.gather(*(engine.generate(p, params) for p in prompts))]
        finally:
            await engine.close()

    graphs = TransformersEngine(
        model, tokenizer, decode="static", max_model_len=128, async_scheduling=async_scheduling
    )
    assert graphs.decode == "static"
    first = await run(graphs)
    captured = graphs._slots.graphs_captured
    assert 1 <= captured <= 2  # 3 rows -> bucket 4; columns 64 (prompt 29 + 12 < 64)
    eager = TransformersEngine(model, tokenizer, decode="static", max_model_len=128)
    eager._slots = StaticSlots(model, 64, 128, use_graphs=False)
    assert await run(eager) == first
    assert await run(graphs) == first and graphs._slots.graphs_captured == captured  # replayed
    other = random_model("smollm2", device="cuda", seed=4, **TINY)
    graphs.update_weights(other.state_dict())  # in place: the captured graphs read the new weights
    after = await run(graphs)
    assert after == [greedy_reference(other, p, 12)[0] for p in prompts]
    assert graphs._slots.graphs_captured == captured


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_capture_survives_cuda_calls_from_another_thread_and_a_failed_capture_runs_eagerly():
    """Regression (H200, Search-v0 tags recipe): a capture invalidated by another thread's CUDA call left
    the graph pool recording, and every later decode failed with 'already recording to mempool_id'."""
    import threading

    cuda_model = random_model("smollm2", device="cuda", seed=3, **TINY).eval()

    def run_pair(slots, steps=70):  # greedy decode from two prompts; crosses the 64-column bucket
        eager = StaticSlots(cuda_model, 8, 256, use_graphs=False)
        with torch.inference_mode():
            ids = eager.admit([[1, 5, 9, 200, 3], [7, 8]], pad_id=0).argmax(-1)
            slots.admit([[1, 5, 9, 200, 3], [7, 8]], pad_id=0)
            for _ in range(steps):
                slots.set_tokens(ids)
                eager.set_tokens(ids)
                a, b = slots.decode(), eager.decode()
                assert torch.equal(a.argmax(-1), b.argmax(-1))
                ids = b.argmax(-1)

    stop = threading.Event()

    def busy():  # what other threads may do meanwhile: pinned copies, stream queries, allocations
        while not stop.is_set():  # (not a device-wide sync: that breaks any capture; see below)
            torch.zeros(4).pin_memory().to("cuda", non_blocking=True)
            torch.cuda.current_stream().query()
            torch.empty(1 << 20, device="cuda")

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        slots = StaticSlots(cuda_model, 8, 256, use_graphs=True)
        run_pair(slots)
    finally:
        stop.set()
        thread.join()
    assert slots.capture_failures == {} and slots.graphs_captured == 2

    # A capture that fails (here a host read inside the step; another thread's torch.cuda.synchronize()
    # does the same even in thread_local mode) is logged, that bucket runs eagerly, and the next bucket
    # still captures into a fresh pool.
    broken = StaticSlots(cuda_model, 8, 256, use_graphs=True)
    forward = broken._forward

    def forward_reading_the_host(n, width):
        if width == 64:
            broken.pos.sum().item()  # a device-to-host read: not allowed while capturing
        return forward(n, width)

    broken._forward = forward_reading_the_host
    run_pair(broken)
    assert list(broken.capture_failures) == [(2, 64)] and broken.graphs_captured == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_capture_leaves_the_allocators_caches_alone():
    """Regression (H100, vs_trl_gpu.py's probe): torch.cuda.graph empties the CUDA caching allocator as
    it starts, so each new bucket captured mid-training gave the learner's cached blocks back to the
    driver and the next update allocated 5.6 GB again. A capture now frees no cached block."""
    cuda_model = random_model("smollm2", device="cuda", seed=3, **TINY).eval()
    slots = StaticSlots(cuda_model, 8, 256, use_graphs=True)
    block = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # 64 MiB, then back to the cache
    del block
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    greedy_slot_decode(slots, [[1, 5, 9, 200, 3], [7, 8]], 70)  # two captures: 64 and 128 columns
    after = torch.cuda.memory_stats()
    assert slots.graphs_captured == 2 and slots.capture_failures == {}
    assert after["num_device_free"] == before["num_device_free"]
    assert after["reserved_bytes.all.current"] >= before["reserved_bytes.all.current"]
    slots.clear()  # the graphs replayed for new prompts give the eager step's ids
    eager = StaticSlots(cuda_model, 8, 256, use_graphs=False)
    assert greedy_slot_decode(slots, [[4, 4, 2], [9]], 70) == greedy_slot_decode(eager, [[4, 4, 2], [9]], 70)


def greedy_slot_decode(slots: StaticSlots, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """``steps`` greedy tokens of each prompt through ``slots`` (admit, then set_tokens/decode)."""
    with torch.inference_mode():
        ids = slots.admit(prompts, pad_id=0).argmax(-1)
        out = [ids.tolist()]
        for _ in range(steps):
            slots.set_tokens(ids)
            ids = slots.decode().argmax(-1)
            out.append(ids.tolist())
    return [list(col) for col in zip(*out, strict=True)]


def decode_two_engines_at_once(make_slots) -> tuple[list[StaticSlots], list[list[list[int]]]]:
    """Two models' StaticSlots (``make_slots(model)``) decoding greedily in two threads released
    together, so their first captures coincide; their slots and ids."""
    import threading

    models = [random_model("smollm2", device="cuda", seed=seed, **TINY).eval() for seed in (3, 4)]
    slots = [make_slots(m) for m in models]
    prompts = [[1, 5, 9, 200, 3], [7, 8]]
    start, results, errors = threading.Barrier(2), [None, None], []

    def run(i):
        try:
            start.wait()
            results[i] = greedy_slot_decode(slots[i], prompts, 70)  # crosses the 64-column bucket
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return slots, results


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_two_engines_in_one_process_capture_at_once_and_match_eager():
    """Regression (H200, judge co-training: a policy's and a judge's hf engine in one process): both
    engines' first captures at once failed ("operation not permitted when stream is capturing",
    "Cannot register the state during capturing stage"), then a device-side assert."""
    slots, got = decode_two_engines_at_once(lambda m: StaticSlots(m, 8, 256, use_graphs=True))
    for s in slots:
        assert s.capture_failures == {} and s.graphs_captured == 2
    for s, ids in zip(slots, got, strict=True):
        eager = StaticSlots(s.model, 8, 256, use_graphs=False)
        assert ids == greedy_slot_decode(eager, [[1, 5, 9, 200, 3], [7, 8]], 70)


# ---- the step's host side: batched draws, one read-back, cheaper row moves ---------------------------


def _plan(params, seeds, shared):
    """A sampling plan over fresh generators (``seeds[r]`` None: the shared one), and the generators."""
    gens = [shared if s is None else torch.Generator().manual_seed(s) for s in seeds]
    return hf_sampling.build_plan(params, gens, shared, VOCAB, "cpu")


VOCAB = 500


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One row's sampling distribution, by the documented rules: temperature, then the top_k largest
    logits, then the smallest prefix (by rank) of those whose renormalised mass reaches top_p."""
    x = logits / torch.tensor(params.temperature)
    order = x.argsort(descending=True).tolist()
    k = params.top_k if 0 < params.top_k < len(order) else len(order)
    mass = torch.softmax(x[order[:k]], -1).tolist()
    kept, above = [], 0.0
    for token, p in zip(order[:k], mass, strict=True):
        if kept and above >= params.top_p:
            break
        kept.append(token)
        above += p
    keep = torch.zeros(len(order), dtype=torch.bool)
    keep[kept] = True
    return torch.softmax(x.masked_fill(~keep, float("-inf")), -1)


def test_batched_draws_are_the_per_row_multinomial_draws():
    # Rows: seeded at T=1, seeded at T=0.7, greedy, seeded with top-k 20 + top-p 0.9, two on the shared
    # generator. Five steps, so each generator's state must advance exactly as multinomial advances it.
    params = [SamplingParams(seed=1), SamplingParams(temperature=0.7, seed=2), SamplingParams(temperature=0),
              SamplingParams(top_k=20, top_p=0.9, seed=4), SamplingParams(), SamplingParams(temperature=1.3)]
    seeds = [11, 12, None, 14, None, None]
    logits = torch.randn(5, len(params), VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    batched = _plan(params, seeds, torch.Generator().manual_seed(99))
    # Independent reference: torch.multinomial itself, one call per seeded row on its own generator
    # and one call for the rows on the shared generator (rows 4 and 5, in row order).
    ref_gens = {r: torch.Generator().manual_seed(s) for r, s in enumerate(seeds) if s is not None}
    ref_shared = torch.Generator().manual_seed(99)
    for step in range(5):
        ids, invalid = hf_sampling.sample(logits[step], batched)
        assert invalid.tolist() == [False] * 5  # one flag per sampled row (the greedy row is not one)
        probs = [filtered_probs(logits[step, r], params[r]) for r in range(len(params))]
        for r, generator in ref_gens.items():
            assert int(ids[r]) == int(torch.multinomial(probs[r], 1, generator=generator))
        shared = torch.multinomial(torch.stack([probs[4], probs[5]]), 1, generator=ref_shared)[:, 0]
        assert ids[[4, 5]].tolist() == shared.tolist()
        assert int(ids[2]) == int(logits[step, 2].argmax())
        # top-k 20 + top-p 0.9: the drawn id is in the row's kept set.
        assert probs[3][int(ids[3])] > 0


async def test_a_nan_row_is_flagged_and_the_engine_says_so(tokenizer):
    logits = torch.zeros(3, VOCAB)
    logits[1, 7] = float("nan")
    plan = _plan([SamplingParams(seed=1)] * 3, [1, 2, 3], torch.Generator())
    _, invalid = hf_sampling.sample(logits, plan)
    assert invalid.tolist() == [False, True, False]
    # The engine: a model whose logit for id 7 is nan (its output row, tied to the input embedding
    # of id 7, which the prompt does not use) fails the request with the sampler's message.
    bad = random_model("smollm2", seed=3, **TINY)
    bad.eval()
    with torch.no_grad():
        bad.get_output_embeddings().weight[7] = float("nan")
    engine = TransformersEngine(bad, tokenizer, decode="static", max_model_len=64)
    try:
        with pytest.raises(RuntimeError, match="not a distribution"):
            await engine.generate([1, 5, 9], SamplingParams(max_tokens=3, seed=1))
        # Regression (noticed in stop 64): a greedy row was not checked: the argmax of its nan logits gave
        # an id (7, the nan's) and a nan logprob, passed on to the trainer
        with pytest.raises(RuntimeError, match=r"sampling: the next-token probabilities of 1 row\(s\) are not a distribution"):
            await engine.generate([1, 5, 9], SamplingParams(max_tokens=3, temperature=0))
    finally:
        await engine.close()


def test_one_read_back_gives_the_values_of_separate_tolist_calls():
    ids = torch.tensor([0, 49151, 123456789])
    logprobs = torch.tensor([-0.1234567, -17.5, -1e-8], dtype=torch.float32)
    got = hf_sampling.to_host(ids, logprobs, torch.tensor([False, True]))
    assert got == (ids.tolist(), logprobs.tolist(), [1])
    assert hf_sampling.to_host(ids, logprobs, None)[2] == []
    # The two-step read-back of async_scheduling gives the same lists.
    assert hf_sampling.start_to_host(hf_sampling.pack(ids, logprobs, torch.tensor([False, True])), 3)() == got
    assert hf_sampling.start_to_host(hf_sampling.pack(ids, logprobs, None), 3)() == (ids.tolist(), logprobs.tolist(), [])


def test_rows_leaving_from_the_front_move_only_what_they_wrote(model):
    # Four rows; row 0 leaves after 2 steps (rows 1..3 move down one slot), then the new row 0
    # (prompt "b") leaves after 2 more (two rows move again). Every row must still be its own greedy
    # continuation, and the freed slots' positions are reset.
    prompts = [[1, 5, 9], [7, 8, 2, 2, 2, 2, 2, 2, 2], list(range(11, 40)), [300, 301]]
    slots = StaticSlots(model, max_rows=4, max_len=96, use_graphs=False)
    got: list[list[int]] = [[] for _ in prompts]
    running = [0, 1, 2, 3]
    with torch.inference_mode():
        logits = slots.admit(prompts, pad_id=0)
        for step in range(6):
            tokens = logits.float().argmax(-1)
            for r, name in enumerate(running):
                got[name].append(int(tokens[r]))
            slots.set_tokens(tokens)
            if step in (1, 3):
                slots.select(list(range(1, len(running))))
                running = running[1:]
            logits = slots.decode()
    assert running == [2, 3] and slots.rows == 2
    assert slots.pos.tolist() == [29 + 6, 2 + 6, 0, 0]
    for name, prompt in enumerate(prompts):
        assert got[name] == greedy_reference(model, prompt, len(got[name]))[0]
    assert [len(g) for g in got] == [2, 4, 6, 6]


async def test_engine_seeded_draws_are_each_rows_own_multinomial_draws(model, tokenizer):
    # Seeded sampling at temperature 1 with staggered joins and leaves (the sampling plan is rebuilt
    # as rows come and go): each row's ids are torch.multinomial's draws from its own seeded generator
    # over a full forward pass's probabilities, and its logprobs are that pass's raw ones.
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40)), [300, 301, 302]]
    engine = TransformersEngine(model, tokenizer, decode="static", max_model_len=64, eos_token_ids=[])

    async def late(i: int):
        await asyncio.sleep(0.02 * i)
        return await engine.generate(prompts[i], SamplingParams(max_tokens=5 + 3 * i, seed=20 + i))

    try:
        outs = list(await asyncio.gather(*(late(i) for i in range(len(prompts)))))
    finally:
        await engine.close()
    assert [len(o.token_ids) for o in outs] == [5, 8, 11, 14]
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1].float()
        generator = torch.Generator().manual_seed(20 + i)
        want = [int(torch.multinomial(torch.softmax(row, -1), 1, generator=generator)) for row in logits]
        assert out.token_ids == want
        raw = torch.log_softmax(logits, -1).gather(1, torch.tensor(want)[:, None])[:, 0]
        assert max(abs(x - y) for x, y in zip(out.logprobs, raw.tolist(), strict=True)) < ATOL


async def test_async_scheduling_gives_the_ids_of_the_synchronous_loop(model, tokenizer, monkeypatch):
    # Seeded and greedy rows joining at different steps, one cut by max_model_len (29-token prompt,
    # 64 columns: its queued step must not run past the cache), one cancelled: the queued-ahead loop
    # returns the synchronous loop's ids and logprobs, and really queues ahead.
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40)), [300, 301, 302], [9, 9, 9]]
    queued_before_wait = []

    def run(async_scheduling: bool):
        engine = TransformersEngine(
            model, tokenizer, decode="static", max_model_len=64, eos_token_ids=[],
            async_scheduling=async_scheduling,
        )
        start = hf_sampling.start_to_host

        def watched(*args):
            wait = start(*args)

            def waiting():
                queued_before_wait.append(engine._ahead is not None)
                return wait()

            return waiting

        monkeypatch.setattr(hf_sampling, "start_to_host", watched)

        async def late(i: int):
            await asyncio.sleep(0.02 * i)
            params = SamplingParams(max_tokens=[5, 9, 60, 7, 40][i], temperature=[1.0, 0.0, 1.0, 1.0, 1.0][i], seed=30 + i)
            return await engine.generate(prompts[i], params)

        async def go():
            tasks = [asyncio.ensure_future(late(i)) for i in range(len(prompts))]
            await asyncio.sleep(0.1)
            tasks[4].cancel()  # cancelled while it decodes
            try:
                outs = await asyncio.gather(*tasks[:4])
            finally:
                await engine.close()
            assert engine._ahead is None
            return outs

        return go()

    sync = await run(False)
    assert not any(queued_before_wait)
    queued_before_wait.clear()
    ahead = await run(True)
    assert sum(queued_before_wait) >= 10  # most steps queued the next one before reading back
    assert [len(o.token_ids) for o in ahead] == [5, 9, 35, 7]  # row 2: 64 - 29 columns
    assert ahead[2].finish_reason == "length"
    for a, b in zip(ahead, sync, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < ATOL
