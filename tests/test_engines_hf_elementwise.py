"""The fused step's element-wise pieces through ``torch.compile`` (trainer/engines/hf_elementwise.py):
each compiled piece computes its eager piece's function at several sizes (one compilation, dynamic
shapes), a fused step built on them gives the eager fused step's logits (bf16 weights and FP8), the
engine takes ``fused_step: compiled`` and refuses other strings, and on CUDA the compiled kernels are
captured in the step's graphs."""

from __future__ import annotations

import pytest
import torch
from test_engines_hf_fused import decode_sequence, full_forward_logits, tiny
from transformers import LlamaConfig, Qwen2Config

from chatgym.trainer.chat.tokenizer import get_tokenizer
from chatgym.trainer.engines import SamplingParams
from chatgym.trainer.engines import hf_elementwise as ew
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.engines.hf_static import StaticSlots

PROMPTS = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40))]


@pytest.mark.parametrize("rows", [3, 17])
def test_each_compiled_piece_computes_the_eager_one(rows):
    """fp32 inputs: the compiled pieces may fuse but compute the same values (float rounding apart);
    FP8 codes may differ by one e4m3 step where a value sits on a rounding boundary, so the quantized
    pieces are compared dequantized, at e4m3's relative step (2^-3) of the row's largest value."""
    gen = torch.Generator().manual_seed(rows)
    heads, d, hidden, inter = 6, 16, 64, 96
    qk, cos, sin = (torch.randn(rows, n, d, generator=gen) for n in (heads, 1, 1))
    gate_up, x, out = torch.randn(rows, 2 * inter, generator=gen), *torch.randn(2, rows, hidden, generator=gen)
    weight = 1 + 0.5 * torch.randn(hidden, generator=gen)
    comp = ew.compiled()
    torch.testing.assert_close(comp.rope(qk, cos, sin), ew.rope(qk, cos, sin), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(comp.silu_mul(gate_up), ew.silu_mul(gate_up), atol=1e-5, rtol=1e-5)
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight  # RMSNorm by its definition
    torch.testing.assert_close(comp.norm(x, weight, 1e-6), rms, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ew.norm(x, weight, 1e-6), rms, atol=1e-5, rtol=1e-5)

    def dequant(xq, a):
        return xq.float() * a

    def close_fp8(got, want):
        want_x = dequant(*want)
        torch.testing.assert_close(dequant(*got), want_x, atol=float(want_x.abs().max()) / 8, rtol=0)
        torch.testing.assert_close(got[1], want[1], atol=1e-7, rtol=1e-5)  # the scales themselves

    close_fp8(comp.quant(x), ew.EAGER.quant(x))
    close_fp8(comp.norm_quant(x, weight, 1e-6), ew.norm_quant(x, weight, 1e-6))
    close_fp8(comp.silu_mul_quant(gate_up), ew.silu_mul_quant(gate_up))
    h_c, *q_c = comp.add_norm_quant(x, out, weight, 1e-6)
    h_e, *q_e = ew.add_norm_quant(x, out, weight, 1e-6)
    torch.testing.assert_close(h_c, h_e, atol=0, rtol=0)  # an add, exactly
    close_fp8(q_c, q_e)


def test_the_eager_quant_pieces_are_the_fp8_module_quantization():
    """Without compilation, norm_quant is quantize_rows(rms_norm(x)) exactly (the FP8 step's old path)."""
    from chatgym.trainer.engines.hf_fp8 import quantize_rows

    x, w = torch.randn(5, 32), torch.rand(32) + 0.5
    want = quantize_rows(torch.nn.functional.rms_norm(x, (32,), w, 1e-5))
    got = ew.norm_quant(x, w, 1e-5)
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("config_class", [LlamaConfig, Qwen2Config], ids=["llama", "qwen2"])
def test_the_compiled_fused_step_gives_the_full_forward_logits(config_class):
    model = tiny(config_class)
    slots = StaticSlots(model, 4, 96, use_graphs=False, fused="compiled")
    assert slots.fused is not None and slots.fused.ops is ew.compiled()
    # the eager prefill takes aten's RMSNorm (one kernel either way, no compiled call's host cost)
    assert slots.fused._prefill_ops.norm is ew.norm and slots.fused._prefill_ops.rope is ew.compiled().rope
    seen = decode_sequence(slots, PROMPTS, steps=6)
    for rows in seen.values():
        for ids, logits in rows:
            assert (logits - full_forward_logits(model, ids)).abs().max().item() < 2e-5


def test_the_compiled_fp8_step_follows_the_eager_fp8_step():
    """FP8 weights (CPU numerics): the same greedy ids, logits within a few e4m3 rounding steps of the
    activations (the eager step rounds the normed activations to the model dtype before quantizing;
    the compiled one does not, in fp32 here only the quantization's rounding differs)."""
    model = tiny(LlamaConfig, tie_word_embeddings=False)
    eager = decode_sequence(StaticSlots(model, 4, 96, use_graphs=False, fp8=True), PROMPTS, steps=5)
    comp = decode_sequence(StaticSlots(model, 4, 96, use_graphs=False, fp8=True, fused="compiled"), PROMPTS, steps=5)
    for i in eager:
        for (ids_e, le), (ids_c, lc) in zip(eager[i], comp[i], strict=True):
            assert ids_e == ids_c
            assert (le - lc).abs().max().item() < 0.05 * le.abs().max().item()


@pytest.mark.parametrize("gemm", ["rowwise", "unit"])
def test_the_compiled_fp8_step_with_each_gemm_follows_the_eager_one(gemm):
    """The "unit" GEMM's scales applied inside the compiled pieces after it (the residual adds, the
    gated activation, the q/k/v bias) give the eager step's ids and logits, as rowwise does above."""
    model = tiny(Qwen2Config, tie_word_embeddings=False)
    eager = decode_sequence(StaticSlots(model, 4, 96, use_graphs=False, fp8=True, fp8_gemm=gemm), PROMPTS, steps=5)
    comp = decode_sequence(StaticSlots(model, 4, 96, use_graphs=False, fp8=True, fused="compiled", fp8_gemm=gemm),
                           PROMPTS, steps=5)
    for i in eager:
        for (ids_e, le), (ids_c, lc) in zip(eager[i], comp[i], strict=True):
            assert ids_e == ids_c
            assert (le - lc).abs().max().item() < 0.05 * le.abs().max().item()


def test_compiled_fp8_steps_take_the_unit_gemm_and_eager_ones_rowwise(monkeypatch):
    model = tiny(LlamaConfig, tie_word_embeddings=False)
    monkeypatch.delenv("CHATGYM_FP8_GEMM", raising=False)
    for fused, gemm in ((True, "rowwise"), ("compiled", "unit")):
        assert StaticSlots(model, 2, 32, use_graphs=False, fp8=True, fused=fused).fused.layers[0].fp8[2].gemm == gemm
    monkeypatch.setenv("CHATGYM_FP8_GEMM", "rowwise")  # a benchmark's override
    assert StaticSlots(model, 2, 32, use_graphs=False, fp8=True, fused="compiled").fused.fp8_gemm == "rowwise"


def test_the_dequantizing_pieces_scale_by_hand():
    raw, a, s = torch.tensor([[2.0, -4.0]]), torch.tensor([[0.5]]), torch.tensor([[3.0, 0.25]])
    assert ew.dequant(raw, a, s, torch.tensor([1.0, 1.0])).tolist() == [[4.0, 0.5]]
    assert ew.add(torch.tensor([[1.0, 1.0]]), raw, a, s).tolist() == [[4.0, 0.5]]
    assert ew.dequant(raw).tolist() == raw.tolist() and ew.add(raw, raw).tolist() == [[4.0, -8.0]]


async def test_the_engine_takes_fused_step_compiled_and_refuses_other_strings():
    model, tokenizer = tiny(LlamaConfig, vocab_size=49152), get_tokenizer("smollm2")
    params = SamplingParams(max_tokens=5, temperature=0)
    outs = []
    for fused_step in (True, "compiled"):
        engine = TransformersEngine(model, tokenizer, decode="static", max_model_len=64, fused_step=fused_step)
        try:
            outs.append((await engine.generate([1, 2, 3, 4], params)).token_ids)
            assert engine._slots.fused.ops is (ew.compiled() if fused_step == "compiled" else ew.EAGER)
        finally:
            await engine.close()
    assert outs[0] == outs[1]
    with pytest.raises(ValueError, match="fused_step must be true, false or 'compiled', got 'yes'"):
        TransformersEngine(model, tokenizer, decode="static", fused_step="yes")
    # Regression (fresh-user walk): on the dynamic path "compiled" was accepted and never ran.
    for decode in ("dynamic", "auto"):  # auto is the dynamic path on this CPU
        with pytest.raises(ValueError, match=r"^fused_step 'compiled' needs decode 'static' \(this engine decodes 'dynamic'\)$"):
            TransformersEngine(model, tokenizer, decode=decode, fused_step="compiled")


@pytest.mark.parametrize(
    ("decode", "options", "message"),
    [
        ("static", {"fused_step": 1}, "fused_step must be true, false or 'compiled', got 1"),  # 1 == True in Python
        ("auto", {"fused_step": "Compiled"}, "fused_step must be true, false or 'compiled', got 'Compiled'"),
        ("auto", {"fused_step": None}, "fused_step must be true, false or 'compiled', got None"),
        ("dynamic", {"fused_step": "compiled"}, "fused_step 'compiled' needs decode 'static' (this engine decodes 'dynamic')"),
        ("dynamic", {"async_scheduling": True}, "async_scheduling needs decode 'static' (this engine decodes 'dynamic')"),
        ("static", {"fp8": True, "fused_step": False}, "quantization 'fp8' runs in the fused static decode step"),
        # Regressions (fresh-user walk): a misspelt decode was refused only after the models loaded, and
        # async_scheduling: maybe ran as true (bool("maybe")).
        ("statik", {}, "decode must be 'auto', 'static' or 'dynamic', got 'statik'"),
        ("static", {"async_scheduling": "maybe"}, "async_scheduling must be true or false, got 'maybe'"),
    ],
)
def test_check_options_refuses_what_no_path_takes(decode, options, message):
    from chatgym.trainer.engines.hf_options import check_options

    with pytest.raises(ValueError) as err:
        check_options(decode, **options)
    assert str(err.value).startswith(message)


def test_check_options_returns_fused_step_and_leaves_auto_to_the_engine():
    from chatgym.trainer.engines.hf_options import check_options

    assert check_options("static", fused_step="compiled") == "compiled"
    assert check_options("auto", fused_step="compiled", async_scheduling=True, fp8=True) == "compiled"
    assert check_options("dynamic", fused_step=False) is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fp8", [False, True], ids=["fp32", "fp8"])
def test_compiled_pieces_are_captured_in_the_cuda_graphs(fp8):
    """On CUDA the compiled step's graphs capture (no failure); fp32 weights (TF32 off): its logits are
    the full forward's within 1e-4; FP8 weights: the eager FP8 step's ids, logits as in the CPU test."""
    if fp8 and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability >= 8.9")
    model = tiny(LlamaConfig, device="cuda", tie_word_embeddings=False)
    slots = StaticSlots(model, 4, 96, fp8=fp8, fused="compiled")
    comp = decode_sequence(slots, PROMPTS, steps=6)
    assert slots.graphs_captured >= 2 and not slots.capture_failures
    eager = decode_sequence(StaticSlots(model, 4, 96, fp8=True), PROMPTS, steps=6) if fp8 else None
    for i, rows in comp.items():
        for j, (ids, logits) in enumerate(rows):
            if fp8:
                ids_e, le = eager[i][j]
                assert ids == ids_e and (logits - le).abs().max().item() < 0.05 * le.abs().max().item()
            else:
                assert (logits - full_forward_logits(model, ids)).abs().max().item() < 1e-4
