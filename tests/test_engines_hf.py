"""TransformersEngine on the real SmolLM2 (fp32, CPU): ids, logprobs, finish reasons, batching, seeds,
weight updates. Reference values come from an independent full forward pass of the same model."""

from __future__ import annotations

import asyncio

import pytest
import torch

from chatgym.trainer.engines import SamplingParams, hf_sampling
from chatgym.trainer.engines.common import first_stop_cut
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.models.random_init import random_model

GREEDY = SamplingParams(max_tokens=8, temperature=0)
LOGPROB_ATOL = 1e-4  # fp32: padded/cached decoding vs one unpadded forward differ by float rounding (~1e-5)


@pytest.fixture(scope="module")
def engine():
    eng = TransformersEngine("smollm2", dtype="float32", device="cpu")
    yield eng
    asyncio.run(eng.close())


def chat_ids(engine, question: str) -> list[int]:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def reference(model, prompt: list[int], completion: list[int]) -> tuple[list[int], torch.Tensor]:
    """Argmax ids and log-softmax(raw logits) of the completion under one full, unpadded forward pass."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion], device=device)).logits[0].float().cpu()
    steps = logits[len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(steps, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]
    return steps.argmax(-1).tolist(), logprobs


def logit_shortfall(model, prompt: list[int], completion: list[int]) -> list[float]:
    """Per completion token: how far its logit falls below the largest one under one full fp32-read
    forward pass (0 where it is the argmax). A greedy engine in bf16 may take a token whose shortfall
    is within bf16's rounding of the logits instead of the argmax: a near-tie, not a wrong id."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion], device=device)).logits[0].float().cpu()
    steps = logits[len(prompt) - 1 : -1]
    return (steps.max(-1).values - steps.gather(1, torch.tensor(completion)[:, None])[:, 0]).tolist()


async def test_greedy_ids_and_logprobs_match_a_full_forward_pass(engine):
    prompt = chat_ids(engine, "What is 2+2?")
    out = await engine.generate(prompt, GREEDY)
    argmax, logprobs = reference(engine.model, prompt, out.token_ids)
    assert out.token_ids == argmax
    assert len(out.logprobs) == len(out.token_ids)
    assert torch.allclose(torch.tensor(out.logprobs), logprobs, atol=LOGPROB_ATOL)
    # SmolLM2 answers this one in 7 tokens ending with <|im_end|> (id 2); the text leaves the EOS out.
    assert out.token_ids == [504, 2988, 314, 216, 36, 30, 2]
    assert out.finish_reason == "stop"
    assert out.text == "The answer is 4."
    assert out.info["prompt_tokens"] == len(prompt)


async def test_concurrent_requests_are_batched_and_match_single_runs(engine):
    questions = ["What is 2+2?", "Name a color.", "Say hi", "Count to three."]
    prompts = [chat_ids(engine, q) for q in questions]  # different lengths: left padding is exercised
    assert len({len(p) for p in prompts}) > 1
    singles = [await engine.generate(p, GREEDY) for p in prompts]
    before = engine.batches_run
    batched = await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
    assert engine.batches_run == before + 1  # all four in one batch
    for one, many in zip(singles, batched, strict=True):
        assert many.token_ids == one.token_ids
        assert many.finish_reason == one.finish_reason
        assert torch.allclose(torch.tensor(many.logprobs), torch.tensor(one.logprobs), atol=LOGPROB_ATOL)


async def test_finish_reason_length_and_stop_ids(engine):
    prompt = chat_ids(engine, "Say hi")
    full = await engine.generate(prompt, SamplingParams(max_tokens=6, temperature=0))
    assert full.finish_reason == "length" and len(full.token_ids) == 6
    # A stop id ends generation right after it is sampled, and is kept.
    stop_at = full.token_ids[2]
    assert stop_at not in full.token_ids[:2]
    stopped = await engine.generate(
        prompt, SamplingParams(max_tokens=6, temperature=0, stop_token_ids=(stop_at,))
    )
    assert stopped.token_ids == full.token_ids[:3]
    assert stopped.finish_reason == "stop"
    assert len(stopped.logprobs) == 3


async def test_stop_strings_end_the_row_on_the_completing_token(engine):
    # Greedy "The answer is 4.<|im_end|>" = ['The', ' answer', ' is', ' ', '4', '.', EOS] (ids above).
    prompt = chat_ids(engine, "What is 2+2?")
    greedy = dict(max_tokens=8, temperature=0)
    full, mid, first, later = await asyncio.gather(  # one batch: rows with and without stop strings
        engine.generate(prompt, SamplingParams(**greedy)),
        engine.generate(prompt, SamplingParams(**greedy, stop=["answ"])),
        engine.generate(prompt, SamplingParams(**greedy, stop=[" is 4", "answer is"])),
        engine.generate(prompt, SamplingParams(**greedy, stop=[" is 4"])),
    )
    assert full.token_ids == [504, 2988, 314, 216, 36, 30, 2] and full.stop_reason == 2
    # "answ" ends inside ' answer': that token is kept whole, and the text runs to its end.
    assert (mid.token_ids, mid.finish_reason, mid.stop_reason) == ([504, 2988], "stop", "answ")
    assert mid.text == "The answer"
    # "answer is" (completed by ' is') ends before " is 4" (completed by '4'): it wins.
    assert (first.token_ids, first.stop_reason, first.text) == (
        [504, 2988, 314],
        "answer is",
        "The answer is",
    )
    assert (later.token_ids, later.stop_reason, later.text) == (
        [504, 2988, 314, 216, 36],
        " is 4",
        "The answer is 4",
    )
    for out in (mid, first, later):  # the kept ids are the greedy run's, logprobs aligned 1:1
        n = len(out.token_ids)
        assert first_stop_cut(engine.tokenizer, full.token_ids, out.stop_reason) is not None
        assert len(out.logprobs) == n
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(full.logprobs[:n]), atol=LOGPROB_ATOL)
    # Independent: the rule applied to the full greedy run cuts at the same places.
    assert first_stop_cut(engine.tokenizer, full.token_ids, ["answ"]) == (2, "answ")
    assert first_stop_cut(engine.tokenizer, full.token_ids, [" is 4", "answer is"]) == (3, "answer is")
    no_tok = TransformersEngine(engine.model)  # no tokenizer: stop strings cannot be matched
    with pytest.raises(ValueError, match="tokenizer"):
        await no_tok.generate(prompt, SamplingParams(**greedy, stop=["x"]))


async def test_collector_sends_env_stop_strings_to_the_real_engine(engine):
    # A real model through the collector: the env's stop string ends each turn on the token that
    # completes it; the turn is the model's own greedy run cut there (checked against a free run).
    from rollout_helpers import OkEnv

    from chatgym.trainer.rollout import Collector, RolloutConfig

    class StopEnv(OkEnv):
        stop_strings = (" is 4",)

    col = Collector(engine, engine.tokenizer, RolloutConfig(max_tokens=6, temperature=0))
    [traj] = await col.collect(lambda: StopEnv(max_turns=2), [{"task_id": "t", "question": "What is 2+2?"}])
    assert traj.error is None and traj.finish_reasons[0] == "stop"
    prompt = traj.token_ids[: traj.prompt_len]
    free = await engine.generate(prompt, SamplingParams(max_tokens=6, temperature=0))
    assert free.token_ids == [504, 2988, 314, 216, 36, 30]  # "The answer is 4." without stops
    turn1 = traj.token_ids[traj.prompt_len : traj.prompt_len + 5]
    assert turn1 == [504, 2988, 314, 216, 36] and traj.stop_reasons[0] == " is 4"
    # No EOS was sampled: the template's whole turn suffix (<|im_end|> "\n") closes the turn.
    assert traj.token_ids[traj.prompt_len + 5 : traj.prompt_len + 7] == [2, 198]
    assert traj.loss_mask[traj.prompt_len : traj.prompt_len + 7] == [1] * 5 + [0, 0]
    lps = torch.tensor(traj.engine_logprobs[traj.prompt_len : traj.prompt_len + 5])
    assert torch.allclose(lps, torch.tensor(free.logprobs[:5]), atol=LOGPROB_ATOL)
    assert traj.messages[1] == {"role": "assistant", "content": "The answer is 4"}
    # Turn 2 obeys the same rule: its ids hold no stop string before their last id.
    start = traj.info["turns"][1]["start"]
    turn2 = traj.token_ids[start:]
    cut2 = first_stop_cut(engine.tokenizer, turn2, [" is 4"])
    assert cut2 in (None, (len(turn2), " is 4"))
    assert traj.stop_reasons[1] == (" is 4" if cut2 else 2 if turn2[-1] == 2 else None)


async def test_truncated_completion_is_length_even_when_the_prompt_has_eos(engine):
    prompt = chat_ids(engine, "Say hi")
    assert 2 in prompt  # every <|im_end|> of the template is the EOS id
    out = await engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0))
    assert out.finish_reason == "length"
    assert 2 not in out.token_ids


async def test_max_model_len_caps_the_completion(engine):
    prompt = chat_ids(engine, "Say hi")
    small = TransformersEngine(engine.model, engine.tokenizer, max_model_len=len(prompt) + 3)
    out = await small.generate(prompt, SamplingParams(max_tokens=50, temperature=0))
    assert len(out.token_ids) == 3 and out.finish_reason == "length"
    with pytest.raises(ValueError, match="max_model_len"):
        await small.generate([*prompt, 1, 2, 3], GREEDY)
    await small.close()


async def test_seed_is_honoured_and_top_k_1_is_greedy(engine):
    prompt = chat_ids(engine, "Tell me a story.")
    sample = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    a, b, c = await asyncio.gather(
        engine.generate(prompt, sample),
        engine.generate(prompt, sample),
        engine.generate(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=6)),
    )
    assert a.token_ids == b.token_ids  # same seed, same batch position-independent draws
    assert a.token_ids != c.token_ids
    # Sampled ids still get the model's raw (temperature-1) logprobs.
    _, logprobs = reference(engine.model, prompt, a.token_ids)
    assert torch.allclose(torch.tensor(a.logprobs), logprobs, atol=LOGPROB_ATOL)
    # top-k 1 and a tiny top-p each leave only the argmax, so sampling reduces to greedy.
    greedy = await engine.generate(prompt, GREEDY)
    for params in (
        SamplingParams(max_tokens=8, temperature=1.5, top_k=1, seed=1),
        SamplingParams(max_tokens=8, temperature=1.5, top_p=1e-6, seed=1),
    ):
        assert (await engine.generate(prompt, params)).token_ids == greedy.token_ids


def draw(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The engine's sampler (:func:`hf_sampling.sample`) on every row of ``logits`` with ``params``,
    all rows drawing from one generator."""
    generator = torch.Generator().manual_seed(0)
    rows = len(logits)
    plan = hf_sampling.build_plan([params] * rows, [generator] * rows, generator, logits.shape[-1], "cpu")
    ids, invalid = hf_sampling.sample(logits, plan)
    assert not invalid.any()
    return ids


def test_sampling_filters_keep_exactly_the_documented_sets():
    # p = [0.5, 0.3, 0.15, 0.05]. top_p=0.7 keeps the smallest prefix reaching 0.7: {0, 1}
    # (0.5 < 0.7, 0.5 + 0.3 >= 0.7); top_k=3 keeps {0, 1, 2}; both at once keep {0, 1}.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    cases = {
        SamplingParams(top_p=0.7): ({0, 1}, 0.5 / 0.8),
        SamplingParams(top_k=3): ({0, 1, 2}, 0.5 / 0.95),
        SamplingParams(top_k=3, top_p=0.7): ({0, 1}, 0.5 / 0.8),
        SamplingParams(): ({0, 1, 2, 3}, 0.5),
    }
    for params, (kept, p0) in cases.items():
        drawn = draw(logits, params)
        assert set(drawn.tolist()) == kept
        # 4000 draws: the share of id 0 is within 4 standard errors (≤ 0.032) of the renormalised p.
        assert abs((drawn == 0).float().mean().item() - p0) < 0.032
    # Temperature 0.5 squares-and-renormalises p: p0 = 0.25 / (0.25 + 0.09 + 0.0225 + 0.0025) = 0.6849.
    drawn = draw(logits, SamplingParams(temperature=0.5))
    assert abs((drawn == 0).float().mean().item() - 0.6849) < 0.03


async def test_logprobs_can_be_left_out(engine):
    out = await engine.generate(
        chat_ids(engine, "Say hi"), SamplingParams(max_tokens=2, temperature=0, logprobs=False)
    )
    assert out.logprobs == [] and len(out.token_ids) == 2


async def test_bad_prompts_are_clear_errors(engine):
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], GREEDY)
    with pytest.raises(TypeError, match="list of token ids"):
        await engine.generate("hello", GREEDY)
    with pytest.raises(ValueError, match="outside"):
        await engine.generate([1, 49152], GREEDY)
    with pytest.raises(TypeError, match="SamplingParams"):
        await engine.generate([1, 2], {"max_tokens": 3})


async def test_update_weights_makes_the_engine_match_the_trainer_model(engine):
    # Two small random models of SmolLM2's architecture: the engine starts from seed 0, the "trainer"
    # holds seed 1. After update_weights the engine's logprobs must be the trainer's.
    policy = random_model("smollm2", num_hidden_layers=2, seed=0)
    trainer = random_model("smollm2", num_hidden_layers=2, seed=1)
    eng = TransformersEngine(policy, engine.tokenizer)
    prompt = chat_ids(engine, "Say hi")
    before = await eng.generate(prompt, GREEDY)
    eng.update_weights(trainer.state_dict())
    after = await eng.generate(prompt, GREEDY)
    argmax, logprobs = reference(trainer, prompt, after.token_ids)
    assert after.token_ids == argmax
    assert torch.allclose(torch.tensor(after.logprobs), logprobs, atol=LOGPROB_ATOL)
    assert after.token_ids != before.token_ids
    # An iterator of (name, tensor) works too, and so does a subset; bad names/shapes are refused.
    eng.update_weights(iter([("model.norm.weight", torch.full((576,), 2.0))]))
    assert torch.equal(eng.model.model.norm.weight, torch.full((576,), 2.0))
    with pytest.raises(KeyError, match="no_such"):
        eng.update_weights({"no_such.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        eng.update_weights({"model.norm.weight": torch.zeros(3)})
    with pytest.raises(TypeError, match="weights"):
        eng.update_weights(42)
    await eng.close()


def test_engine_survives_a_new_event_loop(engine):
    prompt = chat_ids(engine, "Say hi")
    first = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0)))
    second = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0)))
    assert first.token_ids == second.token_ids


async def test_cancelled_request_does_not_break_the_batcher(engine):
    prompt = chat_ids(engine, "Say hi")
    task = asyncio.ensure_future(engine.generate(prompt, SamplingParams(max_tokens=4, temperature=0)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    out = await engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0))
    assert len(out.token_ids) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_cuda_bf16_greedy_ids_are_the_fp32_models_up_to_rounding(engine):
    prompt = chat_ids(engine, "What is 2+2?")
    gpu = TransformersEngine("smollm2", dtype="bfloat16", device="cuda")
    out = await gpu.generate(prompt, GREEDY)
    # Each GPU id is the fp32 model's greedy choice after the GPU's own prefix, up to bf16 rounding.
    # The GPU takes t over the fp32 argmax a only if bf16(t) >= bf16(a), so t's shortfall is at most
    # twice the largest bf16 logit error: SmolLM2's bf16 logits were up to 0.98 from fp32 (H200, 24
    # decode steps), and this prompt's fp32 top-2 gaps at the first 4 tokens are 0.466, 2.86, 0.575 and
    # 0.082 (' ' 19.747 vs ':' 19.665 after "The answer is"): near-ties that bf16 may break either way.
    assert max(logit_shortfall(engine.model, prompt, out.token_ids[:4])) < 2.0
    _, logprobs = reference(gpu.model, prompt, out.token_ids)
    assert torch.allclose(torch.tensor(out.logprobs), logprobs, atol=0.1)  # bf16 rounding
    await gpu.close()


def smollm2_shaped_config(num_hidden_layers: int = 30):
    """SmolLM2-135M's architecture written out (no files needed), for random-weight GPU checks."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_cuda_bf16_random_model_batched_greedy_logprobs_and_update():
    policy = random_model(smollm2_shaped_config(), dtype="bfloat16", device="cuda", seed=0)
    eng = TransformersEngine(policy, None, max_batch_size=64)
    assert eng.device.type == "cuda"
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, 49152, (int(n),), generator=gen).tolist()
        for n in torch.randint(5, 40, (16,), generator=gen)
    ]
    params = SamplingParams(max_tokens=16, temperature=0)
    outs = await asyncio.gather(*(eng.generate(p, params) for p in prompts))
    assert eng.batches_run == 1
    for prompt, out in zip(prompts, outs, strict=True):
        _, logprobs = reference(policy, prompt, out.token_ids)
        # bf16: the engine's fused kernels and one unpadded forward round differently (random weights
        # of this shape: logits up to 0.031 apart on an H200), and random weights give flat
        # distributions, so a greedy id may be a near-tie rather than the reference's argmax: its
        # shortfall is at most twice that error.
        assert max(logit_shortfall(policy, prompt, out.token_ids[:4])) < 0.1
        assert torch.allclose(torch.tensor(out.logprobs[:4]), logprobs[:4], atol=0.05)
    trainer = random_model(smollm2_shaped_config(), dtype="float32", device="cpu", seed=1)
    eng.update_weights(trainer.state_dict())
    after = await eng.generate(prompts[0], SamplingParams(max_tokens=4, temperature=0))
    trainer_bf16 = trainer.to(device="cuda", dtype=torch.bfloat16)
    argmax, logprobs = reference(trainer_bf16, prompts[0], after.token_ids)
    assert after.token_ids[:2] == argmax[:2]
    assert torch.allclose(torch.tensor(after.logprobs[:2]), logprobs[:2], atol=0.05)
    await eng.close()


# ---- the pad id and EOS ids must be tokens of the model ---------------------------------------------

TINY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def padless():
    """A tiny random model of SmolLM2's vocabulary (49,152 ids) whose generation config has no pad id."""
    m = random_model("smollm2", seed=3, **TINY)
    m.eval()
    m.generation_config.pad_token_id = None
    return m


def test_eos_ids_outside_the_vocabulary_are_refused_at_construction(padless):
    # eos_token_ids=[-1] on a model without a pad id used to pad with min(eos) = -1: an IndexError
    # on the first batched prefill on CPU, a device-side assert that kills the CUDA context on a GPU.
    with pytest.raises(ValueError) as info:
        TransformersEngine(padless, None, eos_token_ids=[-1])
    assert str(info.value) == (
        "eos_token_ids has ids outside the model's vocabulary [0, 49152): [-1] "
        "(ids the model can never sample; [] means none)"
    )
    with pytest.raises(ValueError, match=r"outside the model's vocabulary \[0, 49152\): \[49152, 70000\]"):
        TransformersEngine(padless, None, eos_token_ids=[2, 70000, 49152])
    with pytest.raises(TypeError, match="eos_token_ids must be token ids"):
        TransformersEngine(padless, None, eos_token_ids="2")
    with pytest.raises(TypeError, match=r"got \[2.0\]"):
        TransformersEngine(padless, None, eos_token_ids=[2.0])
    # The largest id is fine, and one int is read as one id.
    assert TransformersEngine(padless, None, eos_token_ids=[49151]).eos_token_ids == {49151}
    assert TransformersEngine(padless, None, eos_token_ids=7).eos_token_ids == {7}


async def test_a_model_without_a_pad_id_pads_with_its_smallest_eos_id(padless, monkeypatch):
    from chatgym.trainer.engines import hf_batch
    from chatgym.trainer.engines.hf_static import StaticSlots

    seen = []
    prefill, admit = hf_batch.prefill, StaticSlots.admit
    monkeypatch.setattr(hf_batch, "prefill", lambda m, p, pad_id: seen.append(pad_id) or prefill(m, p, pad_id))
    monkeypatch.setattr(StaticSlots, "admit", lambda s, p, pad_id: seen.append(pad_id) or admit(s, p, pad_id))
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40))]  # different lengths: padding is used
    params = SamplingParams(max_tokens=4, temperature=0)
    for decode in ("dynamic", "static"):
        seen.clear()
        eng = TransformersEngine(padless, None, eos_token_ids=[9, 5], decode=decode, max_model_len=64)
        try:
            assert eng.pad_token_id == 5
            outs = await asyncio.gather(*(eng.generate(p, params) for p in prompts))
        finally:
            await eng.close()
        assert seen and set(seen) == {5}, decode
        for prompt, out in zip(prompts, outs, strict=True):
            assert out.token_ids == reference(padless, prompt, out.token_ids)[0][: len(out.token_ids)]
    # The model's own EOS ids (SmolLM2: 2) when none are passed; no EOS ids and no tokenizer: 0.
    assert TransformersEngine(padless, None).pad_token_id == 2
    assert TransformersEngine(padless, None, eos_token_ids=[]).pad_token_id == 0


def test_a_declared_pad_id_outside_the_vocabulary_is_replaced(padless, monkeypatch):
    # LLaMA-1 configs declare pad_token_id -1: the engine pads with a real token instead.
    monkeypatch.setattr(padless.generation_config, "pad_token_id", -1)
    assert TransformersEngine(padless, None).pad_token_id == 2
    monkeypatch.setattr(padless.generation_config, "pad_token_id", 49152)
    assert TransformersEngine(padless, None, eos_token_ids=[40, 30]).pad_token_id == 30
    monkeypatch.setattr(padless.generation_config, "pad_token_id", 17)
    assert TransformersEngine(padless, None, eos_token_ids=[40, 30]).pad_token_id == 17


async def test_stop_ids_outside_the_vocabulary_are_refused(padless):
    with pytest.raises(ValueError, match=r"SamplingParams.stop_token_ids must be token ids \(ints >= 0\), got \[-1\]"):
        SamplingParams(stop_token_ids=(5, -1))
    eng = TransformersEngine(padless, None)
    try:
        with pytest.raises(ValueError, match=r"stop_token_ids has ids outside the model's vocabulary \[0, 49152\): \[49152\]"):
            await eng.generate([1, 2, 3], SamplingParams(max_tokens=2, stop_token_ids=(49152,)))
        out = await eng.generate([1, 2, 3], SamplingParams(max_tokens=2, stop_token_ids=(49151,)))
        assert len(out.token_ids) >= 1
    finally:
        await eng.close()


async def test_a_temperature_below_greedy_below_takes_the_argmax(engine):
    """Regression: temperature 1e-40 (> 0, so it sampled) divided the logits to inf and the draw failed on
    NaN; below GREEDY_BELOW (vLLM's _SAMPLING_EPS, 1e-5) a row is greedy: the argmax ids of a temperature
    0 row ("The answer is 4." and EOS, the ids above), with the same raw logprobs."""
    prompt = chat_ids(engine, "What is 2+2?")
    tiny, zero = await asyncio.gather(engine.generate(prompt, SamplingParams(max_tokens=8, temperature=1e-40)),
                                      engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0)))
    assert tiny.token_ids == zero.token_ids == [504, 2988, 314, 216, 36, 30, 2]
    assert tiny.logprobs == pytest.approx(zero.logprobs, abs=LOGPROB_ATOL)
    assert SamplingParams(temperature=0.99e-5).greedy and not SamplingParams(temperature=1e-5).greedy
