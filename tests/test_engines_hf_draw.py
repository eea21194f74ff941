"""The ``sampler: philox`` kernel (trainer/engines/hf_draw.py), run on the CPU in Triton's interpreter.

The reference is written here independently: Philox-4x32-10 in NumPy from Random123's definition,
checked on its published known-answer vectors, then the Gumbel-max draw and the raw logprob over the
same logits. The kernel's ids must be the reference's exactly (the interpreter computes with NumPy's
float32, as the reference does), its logprobs ``log_softmax``'s, and a weight-free check counts draws
against the distribution. An engine with the sampler gives each seeded row the reference's ids from a
forward pass's logits, whatever rows run beside it. On CUDA, tests/test_fp8_gpu.py-style GPU checks
are in ``test_the_philox_sampler_on_cuda_draws_the_distribution`` (``-m gpu``)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from test_engines_hf_fused import full_forward_logits, tiny
from transformers import LlamaConfig
from triton_helpers import run_interpreted

from chatgym.trainer.engines import SamplingParams, hf_draw, hf_options
from chatgym.trainer.engines.hf import TransformersEngine

M32 = np.uint64(0xFFFFFFFF)
LOG2E = 1.4426950408889634
INTERPRETED_TESTS = 8  # the tests whose names hold "interpreted" (4 + 2 + 2 parametrized)


def philox(key: int, ctr: list, rounds: int = 10) -> list[np.ndarray]:
    """Philox-4x32 (Random123's ``philox4x32_R``): counter words ``ctr`` (scalars or arrays), 64-bit key."""
    c = [np.asarray(x, dtype=np.uint64) & M32 for x in ctr]
    key = np.asarray(key, dtype=np.uint64)  # a scalar, or an array of keys broadcast with the counter
    k0, k1 = key & M32, (key >> np.uint64(32)) & M32
    for _ in range(rounds):
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & M32, p0 & M32]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
    return c


def uniform(word: np.ndarray) -> np.ndarray:
    """Philox output words as float32 in [0, 1), as Triton's ``uint_to_uniform_float``."""
    signed = word.astype(np.uint32).view(np.int32).astype(np.int64)
    return np.where(signed < 0, -signed - 1, signed).astype(np.float32) * np.float32(4.6566127342e-10)


def reference_id(logits: np.ndarray, seed: int, count: int, temperature: float) -> int:
    """The id the kernel must draw: Gumbel-max over Philox uniforms (hf_draw's module doc)."""
    x = np.asarray(logits, dtype=np.float32)
    if temperature == 0:
        return int(np.argmax(x))
    v = np.arange(x.size)
    words = philox(seed % (1 << 63), [v // 4, count & 0xFFFFFFFF, count >> 32, 0])  # entry v: word v % 4
    u = uniform(np.choose(v % 4, words))
    with np.errstate(divide="ignore"):  # in base 2, as the kernel: the same argmax up to rounding
        score = x * (np.float32(1.0 / temperature) * np.float32(LOG2E)) - np.log2(-np.log2(u))
    return int(np.argmax(score))


def test_the_kernel_tests_pass_in_tritons_interpreter():
    run_interpreted(__file__, INTERPRETED_TESTS)


def test_the_numpy_philox_gives_random123s_known_answers():
    # Random123's kat_vectors for philox4x32 with 10 rounds: zeros, all ones, and the digits of pi.
    assert [int(v) for v in philox(0, [0, 0, 0, 0])] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert [int(v) for v in philox(2**64 - 1, [0xFFFFFFFF] * 4)] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    pi = philox(0x299F31D0A4093822, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344])
    assert [int(v) for v in pi] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@pytest.mark.parametrize(("dtype", "chunk"), [(torch.float32, hf_draw.CHUNK), (torch.bfloat16, hf_draw.CHUNK),
                                               (torch.float32, 1024), (torch.bfloat16, 1024)])
def test_interpreted_kernel_draws_the_reference_ids_and_raw_logprobs(interpreted, dtype, chunk):
    """4,999 entries: a last Philox call's four words only partly used; with ``chunk`` 1024, five chunks
    (the last of 903), one row's first chunk all -inf (its part of the log-sum-exp is 0, not nan)."""
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(5, 4999, generator=gen)).to(dtype)
    logits[1, :1024] = float("-inf")
    seeds, counts, temps = [7, 2**40 + 5, 123, -3, 2**63 + 9], [0, 5, 2**33, 1, 40], [1.0, 0.7, 0.0, 1.3, 1.0]
    plan = hf_draw.build_plan(seeds, counts, temps, "cpu")
    ids, packed = hf_draw.draw(logits, plan, chunk)
    want = [reference_id(logits[r].float().numpy(), seeds[r], counts[r], temps[r]) for r in range(5)]
    assert ids.tolist() == want and packed[:5].tolist() == want
    lp = torch.log_softmax(logits.float(), -1)[torch.arange(5), ids]
    torch.testing.assert_close(packed[5:10], lp.double(), atol=2e-6, rtol=0)
    assert packed[10:].tolist() == [0.0] * 5
    assert plan.counts.tolist() == [c + 1 for c in counts]  # the next draw is the next token's
    assert plan.seeds.tolist()[3:] == [2**63 - 3, 9]  # seeds modulo 2**63


@pytest.mark.parametrize("chunk", [hf_draw.CHUNK, 64])
def test_interpreted_invalid_rows_are_flagged_only_where_they_sample(interpreted, chunk):
    logits = torch.zeros(4, 300)
    logits[0, 17] = float("nan")
    logits[1, 293] = float("inf")  # in the last of five chunks of 64
    logits[2, 5] = float("nan")  # greedy: not flagged, as the default sampler flags sampled rows only
    logits[3] = float("-inf")  # no distribution at all
    _, packed = hf_draw.draw(logits, hf_draw.build_plan([1, 2, 3, 4], [0] * 4, [1.0, 1.0, 0.0, 1.0], "cpu"), chunk)
    assert packed[8:].tolist() == [1.0, 1.0, 0.0, 1.0]


def test_a_plan_of_other_rows_and_logits_not_2d_are_refused():
    """Regression (fresh-user walk): 3 rows of logits with a 1-row plan ran, reading seeds, counts and
    temperatures past the plan's end and writing its counts past it."""
    plan = hf_draw.build_plan([1], [0], [1.0], "cpu")
    with pytest.raises(ValueError, match=r"^draw: the plan's seeds has 1 rows, the logits 3$"):
        hf_draw.draw(torch.zeros(3, 8), plan)
    short = hf_draw.PhiloxPlan(plan.seeds, torch.zeros(2, dtype=torch.int64), plan.inv_temps)
    with pytest.raises(ValueError, match=r"^draw: the plan's counts has 2 rows, the logits 1$"):
        hf_draw.draw(torch.zeros(1, 8), short)
    with pytest.raises(ValueError, match=r"^draw: logits must be floats \(rows, vocab >= 1\), got \(8,\) torch.float32$"):
        hf_draw.draw(torch.zeros(8), plan)
    with pytest.raises(ValueError, match=r"^draw: logits must be floats \(rows, vocab >= 1\), got \(1, 0\)"):
        hf_draw.draw(torch.zeros(1, 0), plan)
    with pytest.raises(ValueError, match=r"^draw: logits must be floats \(rows, vocab >= 1\), got \(1, 8\) torch.int32$"):
        hf_draw.draw(torch.zeros(1, 8, dtype=torch.int32), plan)


def test_a_temperature_below_greedy_below_is_a_greedy_row_of_the_plan():
    """Regression: 1 / 1e-40 is inf in float32 (the kernel's scores inf and NaN); below GREEDY_BELOW (1e-5)
    the row is greedy (0), at it 1e5."""
    plan = hf_draw.build_plan([1, 2, 3, 4], [0] * 4, [1e-40, 0.0, 1e-5, 0.5], "cpu")
    assert plan.inv_temps.tolist() == [0.0, 0.0, torch.tensor(1e5).item(), 2.0]


def test_a_chunk_that_is_not_a_power_of_two_is_refused():
    plan = hf_draw.build_plan([1], [0], [1.0], "cpu")
    with pytest.raises(ValueError, match=r"^chunk must be a power of two >= 64, got 1000$"):
        hf_draw.draw(torch.zeros(1, 8), plan, 1000)
    with pytest.raises(ValueError, match=r"^chunk must be a power of two >= 64, got 32$"):
        hf_draw.draw(torch.zeros(1, 8), plan, 32)


def test_the_reference_draws_follow_the_tempered_distribution():
    """20,000 rows (seeds 0..19,999) of one 4-token distribution, one draw each, by the reference (which
    the kernel equals, above: the four tokens' uniforms are one Philox call's four words): the frequencies are within 4 standard errors of softmax(x / T) (p = 0.1
    .. 0.4 at T = 1; p^2 renormalised at T = 0.5)."""
    p, n = np.array([0.1, 0.2, 0.3, 0.4]), 20000
    u = uniform(np.stack(philox(np.arange(n, dtype=np.uint64), [0, 0, 0, 0]), axis=1))  # one call's four words
    for temperature, want in ((1.0, p), (0.5, p**2 / (p**2).sum())):
        with np.errstate(divide="ignore"):  # the kernel's score, in base 2
            ids = np.argmax(np.log(p).astype(np.float32) * np.float32(LOG2E / temperature) - np.log2(-np.log2(u)), axis=1)
        freq = np.bincount(ids, minlength=4) / n
        assert (np.abs(freq - want) <= 4 * np.sqrt(want * (1 - want) / n)).all(), (temperature, freq)


async def _generate(engine, prompts, params):
    return await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)))


@pytest.mark.parametrize("decode", ["static", "dynamic"])
def test_interpreted_engine_with_the_sampler_draws_the_reference_ids_beside_any_rows(interpreted, decode):
    """Seeded rows at temperature 1 (and one greedy): each id is the reference's draw from the full
    forward pass's logits at that point, its logprob the forward pass's, and a row alone draws what it
    drew beside others (the key is the row's seed and token index only)."""
    model = tiny(LlamaConfig, vocab_size=700)
    engine = TransformersEngine(model, device="cpu", decode=decode, max_batch_size=4, eos_token_ids=[])
    engine.sampler = "philox"  # the engine refuses it without CUDA; the interpreter runs it here
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40))]
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=11), SamplingParams(max_tokens=4, temperature=0.0),
              SamplingParams(max_tokens=5, temperature=0.8, seed=2**40)]
    together = asyncio.run(_generate(engine, prompts, params))
    for prompt, sp, got in zip(prompts, params, together, strict=True):
        for k, token in enumerate(got.token_ids):
            logits = full_forward_logits(model, prompt + got.token_ids[:k])
            assert token == reference_id(logits.numpy(), sp.seed or 0, k, sp.temperature)
            assert abs(got.logprobs[k] - float(torch.log_softmax(logits, -1)[token])) < 1e-4
    alone = asyncio.run(_generate(engine, prompts[2:], params[2:]))
    assert alone[0].token_ids == together[2].token_ids


def test_the_sampler_is_refused_without_cuda_and_named_when_unknown():
    with pytest.raises(ValueError, match="sampler 'philox' is a Triton kernel: it needs a CUDA GPU"):
        TransformersEngine(tiny(LlamaConfig), device="cpu", sampler="philox")
    with pytest.raises(ValueError, match=r"sampler must be one of \('generators', 'philox'\), got 'fast'"):
        hf_options.check_options("static", sampler="fast")


def test_a_bad_fp8_gemm_override_is_refused_before_any_model_loads(monkeypatch):
    """CHATGYM_FP8_GEMM is read where the fused step is built, on the engine's first generation, FP8 or
    not: the config-load option check reads it first whenever there is a fused step (the engine's
    constructor checks it too, after its model loads). Regression (fresh-user walk): without FP8 it was
    refused only as the worker built the step."""
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines import check_engine_options

    monkeypatch.setenv("CHATGYM_FP8_GEMM", "bogus")
    # Second walk: the message names the variable alone, not engine.options (an option the user did not set).
    with pytest.raises(ConfigError, match=r"^CHATGYM_FP8_GEMM must be one of \('rowwise', 'unit', 'cutlass', 'unit_fast'\), got 'bogus'$"):
        check_engine_options("hf", {"quantization": "fp8", "decode": "static"}, "engine.options")
    with pytest.raises(ConfigError, match=r"^CHATGYM_FP8_GEMM must be one of"):
        check_engine_options("hf", {"decode": "static"}, "engine.options")
    check_engine_options("hf", {"decode": "static", "fused_step": False}, "engine.options")  # no fused step
    monkeypatch.setenv("CHATGYM_FP8_GEMM", "unit")
    check_engine_options("hf", {"quantization": "fp8", "decode": "static"}, "engine.options")
    # Regression (noticed in stop 64): the variable was case-sensitive where quantization is not
    from chatgym.trainer.engines import hf_fp8

    monkeypatch.setenv("CHATGYM_FP8_GEMM", " Unit_Fast ")
    assert hf_fp8.default_gemm(True) == "unit_fast"
    monkeypatch.setenv("CHATGYM_FP8_GEMM", "")
    assert (hf_fp8.default_gemm(True), hf_fp8.default_gemm(False)) == ("unit", "rowwise")


def test_config_load_refuses_the_philox_sampler_on_a_machine_without_cuda(monkeypatch):
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines import check_engine_options

    monkeypatch.setattr("chatgym.trainer.engines.auto.has_cuda", lambda: False)
    with pytest.raises(ConfigError, match=r"^engine.options: sampler 'philox' is a Triton kernel"):
        check_engine_options("hf", {"sampler": "philox", "decode": "static"}, "engine.options")
    monkeypatch.setattr("chatgym.trainer.engines.auto.has_cuda", lambda: True)
    check_engine_options("hf", {"sampler": "philox", "decode": "static"}, "engine.options")


@pytest.mark.gpu
def test_the_philox_sampler_on_cuda_draws_the_distribution():
    """The compiled kernel on a GPU: the distribution check above, and the same ids as the interpreter's
    reference for all but near-ties (the GPU's log is not NumPy's)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], device="cuda")
    n = 20000
    ids, packed = hf_draw.draw(p.log().expand(n, 4).contiguous(), hf_draw.build_plan(range(n), [0] * n, [1.0] * n, "cuda"))
    freq = torch.bincount(ids, minlength=4).double().cpu() / n
    assert ((freq - p.double().cpu()).abs() <= 4 * (p.cpu() * (1 - p.cpu()) / n).sqrt()).all(), freq
    logits = 3 * torch.randn(64, 49152, device="cuda")
    seeds = list(range(64))
    ids, packed = hf_draw.draw(logits, hf_draw.build_plan(seeds, [3] * 64, [1.0] * 64, "cuda"))
    want = [reference_id(logits[r].cpu().numpy(), seeds[r], 3, 1.0) for r in range(64)]
    assert sum(a == b for a, b in zip(ids.tolist(), want, strict=True)) >= 62
    lp = torch.log_softmax(logits, -1).gather(1, ids[:, None])[:, 0]
    torch.testing.assert_close(packed[64:128].float(), lp, atol=1e-4, rtol=0)
