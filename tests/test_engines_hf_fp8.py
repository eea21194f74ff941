"""FP8 weights in the hf engine's fused decode step (trainer/engines/hf_fp8.py, hf_fused.py).

Runs refuse FP8 on a CPU (``fp8_unsupported``); these tests call the FP8 functions, the fused step and
the engine on the CPU directly, where ``torch._scaled_mm`` computes the same function slowly: the
engine tests bypass the refusal by patching ``chatgym.trainer.models.cuda.fp8_unsupported`` (the
refusal itself is tested below, unpatched). The GPU run is tests/test_fp8_gpu.py.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from test_engines_hf_fused import decode_sequence, full_forward_logits, tiny
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from chatgym.trainer.chat.tokenizer import get_tokenizer
from chatgym.trainer.engines import SamplingParams
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.engines.hf_fp8 import (
    FP8_MAX,
    GEMMS,
    UNSCALED,
    Fp8Linear,
    dequantize,
    fp8_matmul,
    quantize_into,
    quantize_rows,
    quantize_rowwise,
)
from chatgym.trainer.engines.hf_static import StaticSlots

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def check_bound(weight: torch.Tensor) -> float:
    """Assert the module docstring's bounds for one weight (N, K); returns its largest row relative error.

    Per element ``|W − dq(Q)| <= 2^-4 |W| + 2^-10 s_n`` (half an e4m3 spacing: 2^-4 relative for normal
    values, 2^-10 · s absolute for subnormals), with 1e-6 relative slack for the fp32 division by s.
    Per row ``‖W_n − dq(Q_n)‖ <= 2^-4 ‖W_n‖ + 2^-10 s_n sqrt(K)`` (the triangle inequality).
    """
    weight = weight.detach()
    q, s = quantize_rowwise(weight)
    w = weight.float()
    err = (w - dequantize(q, s)).abs()
    scale = s.view(-1, 1)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (1, w.shape[0])
    assert bool((err <= 2**-4 * w.abs() * (1 + 1e-6) + 2**-10 * scale + 1e-30).all())
    # The largest value of each row lands on 448 exactly (its scale is amax / 448).
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((w.shape[0],), FP8_MAX))
    row_err, row_norm = err.norm(dim=1), w.norm(dim=1)
    bound = 2**-4 * row_norm + 2**-10 * scale.view(-1) * math.sqrt(w.shape[1])
    assert bool((row_err <= bound * (1 + 1e-6)).all())
    return float((row_err / row_norm).max())


def test_quantize_dequantize_error_bound_per_layer_random_weights():
    model = tiny(LlamaConfig, seed=5)
    for i, layer in enumerate(model.model.layers):
        for name in PROJECTIONS:
            module = getattr(layer.self_attn, name, None) or getattr(layer.mlp, name)
            assert check_bound(module.weight) < 2**-4, (i, name)
    check_bound(model.lm_head.weight)


def test_quantize_dequantize_error_bound_per_layer_smollm2_weights():
    from chatgym.trainer.models.packaged import load_model

    try:
        model = load_model("smollm2", dtype="bfloat16", device="cpu")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    worst = 0.0
    for layer in model.model.layers[:4]:  # 4 of 30 layers: the CPU suite's budget
        for name in PROJECTIONS:
            module = getattr(layer.self_attn, name, None) or getattr(layer.mlp, name)
            worst = max(worst, check_bound(module.weight))
    # Measured: 0.030 at most on these layers (e4m3's mean relative error is ~2^-5).
    assert worst < 2**-4


def test_quantization_edge_values_by_hand():
    # Row 0: amax 448 -> scale 1: 448, 1.0, 0.5 are e4m3 values; 17 lies halfway between 16 and 18
    # (spacing 2 in [16, 32)) and rounds to even mantissa: 16; 2^-9 is the smallest subnormal.
    # Row 1: all zeros: scale clamped to 1e-12, values 0 (never NaN).
    w = torch.tensor([[448.0, 1.0, 0.5, 17.0, 2.0**-9], [0.0, 0.0, 0.0, 0.0, 0.0]])
    q, s = quantize_rowwise(w)
    assert q.float().tolist() == [[448.0, 1.0, 0.5, 16.0, 2.0**-9], [0.0, 0.0, 0.0, 0.0, 0.0]]
    assert s.tolist() == [[1.0, pytest.approx(1e-12)]]
    # quantize_into keeps the buffers (a captured graph reads them).
    ptrs = q.data_ptr(), s.data_ptr()
    quantize_into(w * 2, q, s)
    assert (q.data_ptr(), s.data_ptr()) == ptrs and s[0, 0].item() == 2.0


def test_fp8_matmul_is_the_dequantized_product():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 64, generator=gen), torch.randn(32, 64, generator=gen)
    q, s = quantize_rowwise(w)
    xq, a = quantize_rows(x)
    expected = (xq.float() * a) @ dequantize(q, s).t()
    torch.testing.assert_close(fp8_matmul(x, q, s, torch.float32), expected, atol=1e-4, rtol=1e-5)


CPU_GEMMS = tuple(g for g in GEMMS if g != "cutlass")  # vLLM's CUTLASS kernel: CUDA only (tests/test_fp8_gpu.py)


@pytest.mark.parametrize("gemm", CPU_GEMMS)
def test_each_fp8_gemm_is_the_dequantized_product(gemm):
    """rowwise, unit and unit_fast (unscaled, scales applied after) compute one product (on the CPU the
    fast accumulation is the same float32 one; on a GPU: tests/test_fp8_gpu.py)."""
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(6, 64, generator=gen), torch.randn(48, 64, generator=gen)
    linear = Fp8Linear([w[:16], w[16:]], gemm)
    xq, a = quantize_rows(x)
    expected = (xq.float() * a) @ dequantize(*quantize_rowwise(w)).t()
    torch.testing.assert_close(linear.mm(xq, a, torch.float32), expected, atol=1e-4, rtol=1e-5)
    out, pa, ps = linear.project(xq, a, torch.float32)
    assert (pa is None, ps is None) == ((gemm not in UNSCALED),) * 2
    if gemm in UNSCALED:  # the raw product of the e4m3 codes, by hand: no scale in it yet
        torch.testing.assert_close(out, xq.float() @ linear.weight.float().t(), atol=1e-3, rtol=1e-5)


def test_an_unknown_fp8_gemm_is_refused():
    with pytest.raises(ValueError, match=r"fp8 gemm must be one of \('rowwise', 'unit', 'cutlass', 'unit_fast'\), got 'fast'"):
        Fp8Linear([torch.randn(16, 16)], "fast")


@pytest.mark.parametrize("gemm", CPU_GEMMS)
def test_a_bias_is_refused_by_a_gemm_that_cannot_add_it(gemm):
    """Only the cutlass GEMM adds the q/k/v bias in its epilogue; the others would drop it silently."""
    linear = Fp8Linear([torch.randn(16, 16)], gemm)
    assert not linear.takes_bias and Fp8Linear([torch.randn(16, 16)], "cutlass").takes_bias
    xq, a = quantize_rows(torch.randn(2, 16))
    with pytest.raises(ValueError, match=rf"^fp8 gemm '{gemm}' takes no bias \(only 'cutlass' adds it in the GEMM\)$"):
        linear.project(xq, a, torch.float32, torch.zeros(16))


def test_the_cutlass_gemm_is_refused_where_vllm_is_not_installed(monkeypatch):
    import importlib.util

    from chatgym.trainer.engines import hf_fp8

    monkeypatch.setenv("CHATGYM_FP8_GEMM", "cutlass")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ValueError, match=r"^CHATGYM_FP8_GEMM=cutlass runs vLLM's CUTLASS kernel, and vllm is not installed here$"):
        hf_fp8.default_gemm(True)
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert hf_fp8.default_gemm(True) == "cutlass"  # vllm (the CPU build) is installed in this suite's venv


def test_the_unscaled_product_overflows_float16_at_the_7b_size_and_is_refused_for_it(monkeypatch):
    """The reason: at K = 3,584 (Qwen2.5-7B's hidden size) the unit GEMM's product of e4m3 codes passes
    float16's 65,504 (inf), while the row-wise product is the dequantized one."""
    from chatgym.trainer.engines import hf_fp8

    generator = torch.Generator().manual_seed(0)
    w, x = torch.randn(64, 3584, generator=generator) * 0.02, torch.randn(4, 3584, generator=generator)
    (q, s), (xq, a) = quantize_rowwise(w), quantize_rows(x)
    assert bool(hf_fp8.scaled_mm(xq, a, q, s, torch.float16, "unit").isinf().any())
    exact = (xq.double() * a.double()) @ (q.double() * s.double().view(-1, 1)).t()
    rowwise = hf_fp8.scaled_mm(xq, a, q, s, torch.float16, "rowwise")
    assert bool(rowwise.isfinite().all())
    assert ((rowwise.double() - exact).abs() <= 2**-11 * exact.abs() + 1e-4).all()  # one fp16 rounding
    for gemm in UNSCALED:
        with pytest.raises(ValueError, match=rf"^fp8 gemm='{gemm}' with a float16 model: .* overflows float16"):
            hf_fp8.check_gemm_dtype(gemm, torch.float16)
        hf_fp8.check_gemm_dtype(gemm, torch.bfloat16)
    for gemm in set(GEMMS) - set(UNSCALED):
        hf_fp8.check_gemm_dtype(gemm, torch.float16)
    # The default with compiled pieces: "unit" for bf16 (and a dtype not known yet), "rowwise" for fp16.
    monkeypatch.delenv("CHATGYM_FP8_GEMM", raising=False)
    assert [hf_fp8.default_gemm(True, d) for d in (None, torch.bfloat16, torch.float16)] == ["unit", "unit", "rowwise"]
    # Regression (fresh-user walk): a dtype's name ("float16", as configs write it) was taken as not float16
    assert hf_fp8.default_gemm(True, "float16") == "rowwise" and hf_fp8.default_gemm(True, "auto") == "unit"
    with pytest.raises(ValueError, match=r"^fp8 gemm='unit' with a float16 model"):
        hf_fp8.check_gemm_dtype("unit", "float16")
    monkeypatch.setenv("CHATGYM_FP8_GEMM", "unit_fast")
    with pytest.raises(ValueError, match=r"^CHATGYM_FP8_GEMM='unit_fast' with a float16 model"):
        hf_fp8.default_gemm(True, torch.float16)


def test_a_float16_model_gets_the_rowwise_fp8_gemm_and_an_unscaled_one_is_refused(monkeypatch):
    from chatgym.trainer.engines.hf_fused import FusedDecoder

    monkeypatch.delenv("CHATGYM_FP8_GEMM", raising=False)
    model = tiny(LlamaConfig).half()
    # torch.compile wraps the pieces lazily: nothing compiles before a step runs
    assert FusedDecoder(model, fp8=True, compile_elementwise=True).fp8_gemm == "rowwise"
    assert FusedDecoder(tiny(LlamaConfig).bfloat16(), fp8=True, compile_elementwise=True).fp8_gemm == "unit"
    with pytest.raises(ValueError, match=r"^fp8 gemm='unit' with a float16 model"):
        FusedDecoder(model, fp8=True, fp8_gemm="unit")
    assert FusedDecoder(model, fp8_gemm="unit").fp8_gemm == "unit"  # no FP8 weights: nothing to refuse
    # Regression (fresh-user walk): the variable failed a float16 step without FP8 weights too
    monkeypatch.setenv("CHATGYM_FP8_GEMM", "unit")
    assert FusedDecoder(model, compile_elementwise=True).fp8_gemm == "unit"
    with pytest.raises(ValueError, match=r"^CHATGYM_FP8_GEMM='unit' with a float16 model"):
        FusedDecoder(model, fp8=True)


def test_an_unscaled_fp8_gemm_with_float16_is_refused_at_start_and_at_config_load(monkeypatch, fp8_allowed):
    """Regression (fresh-user walk): CHATGYM_FP8_GEMM=unit with a float16 model was refused only as the
    worker built the fused step, so every episode failed and the run went on to exit 0."""
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.config.run import EngineConfig
    from chatgym.trainer.engines import check_engine_options, check_options

    monkeypatch.setenv("CHATGYM_FP8_GEMM", "unit")
    fp8 = {"quantization": "fp8", "decode": "static"}
    with pytest.raises(ConfigError, match=r"^CHATGYM_FP8_GEMM='unit' with a float16 model: .* overflows float16"):
        check_options(EngineConfig(backend="hf", dtype="float16", options=fp8))
    check_options(EngineConfig(backend="hf", dtype="bfloat16", options=fp8))
    check_options(EngineConfig(backend="hf", dtype="float16", options={"decode": "static"}))  # no FP8 weights
    check_engine_options("hf", fp8, "--engine-arg")  # the dtype not known: nothing to refuse yet
    # Regression (fresh-user walk): engine.options' dtype is the one the engine gets (build_engine: the
    # options win over engine.dtype); the check read engine.dtype
    with pytest.raises(ConfigError, match=r"^CHATGYM_FP8_GEMM='unit' with a float16 model"):
        check_options(EngineConfig(backend="hf", dtype="bfloat16", options={**fp8, "dtype": "float16"}))
    check_options(EngineConfig(backend="hf", dtype="float16", options={**fp8, "dtype": "bfloat16"}))
    check_options(EngineConfig(backend="hf", dtype="auto", options=fp8))  # auto: bf16 or fp32
    with pytest.raises(ValueError, match=r"^CHATGYM_FP8_GEMM='unit' with a float16 model"):
        TransformersEngine(tiny(LlamaConfig).half(), decode="static", quantization="fp8")
    assert TransformersEngine(tiny(LlamaConfig).half(), decode="static").fp8 is False


def test_the_fp8_step_adds_the_down_projection_in_the_next_norms_kernel(monkeypatch):
    """On FP8 weights the residual add after each down projection is folded into the next layer's
    add_norm_quant (and the last one added before the final norm): per layer one add_norm_quant after o,
    one before q/k/v from the second layer on, and a single add a pass (the last layer's)."""
    import dataclasses

    from chatgym.trainer.engines import hf_elementwise

    model = tiny(LlamaConfig)
    slots = StaticSlots(model, 4, 96, use_graphs=False, fp8=True, fp8_gemm="rowwise")
    calls = {"add": 0, "add_norm_quant": 0, "norm_quant": 0}

    def counted(name):
        fn = getattr(hf_elementwise.EAGER, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    slots.fused.ops = dataclasses.replace(slots.fused.ops, **{n: counted(n) for n in calls})
    slots.fused._prefill_ops = slots.fused.ops
    layers = len(model.model.layers)
    with torch.inference_mode():
        slots.admit([[1, 5, 9, 200, 3], [7, 8]], 0)
    assert calls == {"add": 1, "add_norm_quant": 2 * layers - 1, "norm_quant": 1}


@pytest.mark.parametrize("gemm", ["rowwise", "unit"])
def test_the_fp8_fused_step_computes_the_dequantized_model_with_each_gemm(gemm):
    # Qwen2: the q/k/v bias is added after the (unscaled, for unit) q/k/v product.
    model = tiny(Qwen2Config, tie_word_embeddings=False)
    slots = StaticSlots(model, 4, 96, use_graphs=False, fp8=True, fp8_gemm=gemm)
    assert {layer.fp8[0].gemm for layer in slots.fused.layers} == {gemm}
    reference = fake_quant_reference(model)
    for rows in decode_sequence(slots, [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40))], steps=5).values():
        for ids, logits in rows:
            assert (logits - full_forward_logits(reference, ids)).abs().max().item() < 1e-4


def fake_quant_reference(model, fp8_lm_head=False):
    """``model`` with every projection computing on dequantized weights and per-row quantize/dequantized
    inputs, in the model's own layers (fp32): what the FP8 fused step computes, written independently."""
    ref = copy.deepcopy(model)

    def hook(_module, args):
        xq, a = quantize_rows(args[0].reshape(-1, args[0].shape[-1]))
        return ((xq.float() * a).view(args[0].shape).to(args[0].dtype),)

    modules = [getattr(layer.self_attn, n, None) or getattr(layer.mlp, n) for layer in ref.model.layers for n in PROJECTIONS]
    if fp8_lm_head:
        modules.append(ref.lm_head)
    with torch.no_grad():
        for module in modules:
            module.weight.copy_(dequantize(*quantize_rowwise(module.weight)))
            module.register_forward_pre_hook(hook)
    return ref


@pytest.mark.parametrize("config_class", [LlamaConfig, Qwen2Config, Qwen3Config], ids=["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("lm_head", [False, True])
def test_the_fp8_fused_step_computes_the_dequantized_model(config_class, lm_head):
    # fp32 model: the FP8 step and the fake-quantized model's own layers differ by summation order only.
    # Qwen2 checks the q/k/v bias added after the FP8 matmul, every model the residual adds.
    model = tiny(config_class, tie_word_embeddings=False)
    slots = StaticSlots(model, 4, 96, use_graphs=False, fp8=True, fp8_lm_head=lm_head)
    assert slots.fused is not None and slots.fused.fp8 and (slots.fused.lm_head_fp8 is not None) == lm_head
    reference = fake_quant_reference(model, fp8_lm_head=lm_head)
    seen = decode_sequence(slots, [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40))], steps=5)
    for rows in seen.values():
        for ids, logits in rows:
            assert (logits - full_forward_logits(reference, ids)).abs().max().item() < 1e-4


def _bf16_smollm2():
    from chatgym.trainer.models.packaged import load_model

    try:
        return load_model("smollm2", dtype="bfloat16", device="cpu")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))


def test_fp8_step_logits_against_the_bf16_step_smollm2():
    """SmolLM2's real weights, bf16: the FP8 step's next-token log-softmax against the bf16 fused step's
    over 4 greedy steps of 3 prompts (one leaving after 3). Measured on this CPU: max |Δ logprob| of the
    bf16 step's argmax token 0.53, mean over the 9 positions 0.16, the argmax agreeing at 8 of 9 (a
    135M model's activations have outlier channels that per-row e4m3 scales round coarsely); asserted
    with about 2.5x room."""
    model = _bf16_smollm2()
    prompts = [[1, 504, 3458, 282, 5765, 314], [1, 21045, 30, 2683], [1, 2683, 284, 1343, 429, 253, 1102]]
    bf16 = decode_sequence(StaticSlots(model, 3, 64, use_graphs=False), prompts, steps=4)
    fp8 = decode_sequence(StaticSlots(model, 3, 64, use_graphs=False, fp8=True), prompts, steps=4)
    diffs, agree, total = [], 0, 0
    for i in bf16:
        for (ids_b, lb), (ids_f, lf) in zip(bf16[i], fp8[i], strict=True):
            if ids_b != ids_f:  # the greedy paths parted: the rest compares different prefixes
                break
            pb, pf = lb.log_softmax(-1), lf.log_softmax(-1)
            top = int(pb.argmax())
            diffs.append(abs(float(pb[top] - pf[top])))
            agree += int(pf.argmax()) == top
            total += 1
    print(f"fp8 vs bf16: max |dlogprob| {max(diffs):.4f}, mean {sum(diffs) / len(diffs):.4f}, argmax {agree}/{total}")
    assert total >= 6 and max(diffs) < 1.3 and sum(diffs) / len(diffs) < 0.4 and agree >= total - 2


@pytest.fixture
def fp8_allowed(monkeypatch):
    """Bypass the refusal on this CPU (the FP8 functions run here, slowly)."""
    monkeypatch.setattr("chatgym.trainer.models.cuda.fp8_unsupported", lambda device=None: None)


async def _greedy(engine, prompts, n=5):
    params = SamplingParams(max_tokens=n, temperature=0)
    return [await engine.generate(p, params) for p in prompts]


async def test_update_weights_requantizes_to_a_fresh_fp8_engines_outputs(fp8_allowed):
    """After ``update_weights`` the FP8 buffers and the outputs are exactly those of an engine built on
    the new weights: same ids, same logprobs, bit for bit; the re-quantization ran inside
    ``update_weights`` (what ``timing/sync_s`` times), in place, without a rebuild."""
    tokenizer = get_tokenizer("smollm2")
    old, new = tiny(LlamaConfig, vocab_size=49152, seed=3), tiny(LlamaConfig, vocab_size=49152, seed=4)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    engine = TransformersEngine(old, tokenizer, decode="static", max_model_len=64, quantization="fp8", fp8_lm_head=True)
    fresh = TransformersEngine(copy.deepcopy(new), tokenizer, decode="static", max_model_len=64, quantization="fp8",
                               fp8_lm_head=True)
    try:
        before = await _greedy(engine, prompts)
        fused = engine._slots.fused
        buffers = [(lin.weight.data_ptr(), lin.scale.data_ptr()) for layer in fused.layers for lin in layer.fp8]
        engine.update_weights(new.state_dict())
        assert fused.refreshes == 1  # re-quantized by update_weights itself, before any request
        after = await _greedy(engine, prompts)
        expected = await _greedy(fresh, prompts)
    finally:
        await engine.close()
        await fresh.close()
    assert engine._slots.fused is fused and engine._slots.rebuilds == 0 and fused.refreshes == 1
    assert [(lin.weight.data_ptr(), lin.scale.data_ptr()) for layer in fused.layers for lin in layer.fp8] == buffers
    for mine, theirs in zip(fused.layers, fresh._slots.fused.layers, strict=True):
        for a, b in zip(mine.fp8, theirs.fp8, strict=True):
            assert torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8)) and torch.equal(a.scale, b.scale)
    assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    assert [c.logprobs for c in after] == [c.logprobs for c in expected]
    assert [c.token_ids for c in after] != [c.token_ids for c in before]  # the update changed something


def test_set_weights_times_the_requantization(fp8_allowed):
    """``LocalRollout.set_weights`` (``timing/sync_s``) returns after the FP8 weights were re-quantized."""
    from chatgym.trainer.rollout.source import LocalRollout

    model, other = tiny(LlamaConfig, seed=3), tiny(LlamaConfig, seed=4)
    engine = TransformersEngine(model, decode="static", max_model_len=64, quantization="fp8")
    engine._slots = StaticSlots(model, 2, 64, use_graphs=False, fp8=True)  # as the worker makes it
    source = LocalRollout(engine, collector=None)
    q0 = engine._slots.fused.layers[0].fp8[0].weight.clone()
    seconds = source.set_weights(other.state_dict().items(), version=1)
    assert seconds > 0 and engine._slots.fused.refreshes == 1
    assert not torch.equal(engine._slots.fused.layers[0].fp8[0].weight.view(torch.uint8), q0.view(torch.uint8))


# ------------------------------------------------------------------------------------------ refusals


def test_the_engine_refuses_fp8_on_this_cpu():
    with pytest.raises(ValueError, match=r"^quantization 'fp8' is refused: "):
        TransformersEngine(tiny(LlamaConfig), decode="static", quantization="fp8")
    with pytest.raises(ValueError, match=r"quantization must be None or 'fp8', got 'int4'"):
        TransformersEngine(tiny(LlamaConfig), quantization="int4")


def test_the_engine_reads_fp8_in_any_case_as_the_config_check_does(fp8_allowed):
    # Regression: "FP8" passed the config-load check (is_fp8 reads any case) and was then refused by
    # the engine, after the models had loaded.
    assert TransformersEngine(tiny(LlamaConfig), decode="static", quantization="FP8").fp8 is True


def test_fp8_needs_the_fused_static_step(fp8_allowed):
    with pytest.raises(ValueError, match="runs in the fused static decode step"):
        TransformersEngine(tiny(LlamaConfig), decode="dynamic", quantization="fp8")
    with pytest.raises(ValueError, match="runs in the fused static decode step"):
        TransformersEngine(tiny(LlamaConfig), decode="static", fused_step=False, quantization="fp8")


def test_config_load_refuses_fp8_naming_the_field():
    from chatgym.trainer.config.run import ConfigError, load_config

    for backend in ("hf", "vllm"):
        with pytest.raises(ConfigError, match=r"engine.options.quantization: 'fp8' is refused: .*8\.9"):
            load_config(None, [f"engine.backend={backend}", "engine.options.quantization=fp8"])
    # Regression: "FP8" (vLLM takes it) got past the refusal and crashed inside vLLM's kernels.
    with pytest.raises(ConfigError, match=r"engine.options.quantization: 'FP8' is refused: .*8\.9"):
        load_config(None, ["engine.backend=vllm", "engine.options.quantization=FP8"])
    # Regression (fresh-user walk): vLLM's FP8 methods not starting with "fp8" got past the refusal and
    # failed after the model loaded (mxfp8: an empty "Reasons:", fbgemm_fp8: a multi-line error).
    for method in ("mxfp8", "fbgemm_fp8"):
        with pytest.raises(ConfigError, match=rf"engine.options.quantization: '{method}' is refused: .*8\.9"):
            load_config(None, ["engine.backend=vllm", f"engine.options.quantization={method}"])
    # Ray: the engine is built (and refuses) on the worker, whose GPU the driver may not have; a
    # worker given no GPU is refused here.
    ray = ["engine.backend=hf", "engine.options.quantization=fp8", "trainer.backend=ray"]
    cfg = load_config(None, [*ray, "trainer.ray.worker_num_gpus=1"])
    assert cfg.engine.options["quantization"] == "fp8"
    with pytest.raises(ConfigError, match=r"trainer.ray.worker_num_gpus is 0, so the rollout workers run on CPU"):
        load_config(None, ray)


def test_config_load_refuses_a_quantization_the_backend_does_not_have():
    """Regression (fresh-user walk): 'int4' was taken at config load and refused by vLLM (or the hf engine)
    only after the model had loaded."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines import check_engine_options

    with pytest.raises(ConfigError) as err:
        check_engine_options("vllm", {"quantization": "int4"}, "engine.options")
    assert str(err.value) == (f"engine.options: quantization must be one of vLLM's methods {list(QUANTIZATION_METHODS)}, "
                              "got 'int4'")
    for bad in ("int4", "awq"):
        with pytest.raises(ConfigError) as err:
            check_engine_options("hf", {"quantization": bad}, "engine.options")
        assert str(err.value) == f"engine.options: quantization must be None or 'fp8' on the hf engine, got {bad!r}"
    for good in ("awq", "fp8_per_channel", None):  # vLLM's method names (its own check then rules on case)
        check_engine_options("vllm", {"quantization": good}, "engine.options")
    check_engine_options("hf", {"quantization": None}, "engine.options")


def test_train_cli_refuses_fp8_in_one_line(tmp_path, capsys):
    from chatgym.trainer.train_cli import main

    out = tmp_path / "never"
    assert main(["engine.backend=hf", "engine.options.quantization=fp8", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chatgym train: engine.options.quantization: 'fp8' is refused: ") and err.count("\n") == 1
    assert not out.exists()


def test_the_vllm_engine_refuses_fp8_before_vllm_starts():
    from chatgym.trainer.engines.vllm_inproc import VLLMEngine

    with pytest.raises(ValueError, match=r"^quantization 'fp8' is refused: "):
        VLLMEngine("smollm2", quantization="fp8")
