"""The FP8 step's row quantization with its residual add and RMSNorm in one Triton kernel
(trainer/engines/hf_norm_quant.py), on the CPU in Triton's interpreter against the eager pieces
(:mod:`chatgym.trainer.engines.hf_elementwise`'s ``add_norm_quant`` / ``norm_quant`` and
``hf_fp8.quantize_rows``, unrolled to the values before the e4m3 cast): in float32, where the
interpreter's casts truncate (module doc of tests/test_engines_hf_silu_quant.py). ``-m gpu``: bf16
inputs and e4m3 outputs on CUDA against the eager pieces."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_helpers import run_interpreted

from chatgym.trainer.engines import hf_elementwise, hf_fp8, hf_norm_quant

INTERPRETED_TESTS = 8  # the tests whose names hold "interpreted" (6 parametrized + 2)


def test_the_kernel_tests_pass_in_tritons_interpreter():
    run_interpreted(__file__, INTERPRETED_TESTS)


def unrolled(y):
    """``quantize_rows``' scales and its values before the e4m3 cast."""
    y = y.float()
    scale = (y.abs().amax(dim=1, keepdim=True) / hf_fp8.FP8_MAX).clamp_min(1e-12)
    return (y / scale).clamp(-hf_fp8.FP8_MAX, hf_fp8.FP8_MAX), scale


def inputs(rows, width, dtype, device="cpu"):
    g = torch.Generator(device=device).manual_seed(rows * 13 + width)
    hidden = (2 * torch.randn(rows, width, generator=g, device=device)).to(dtype)
    out = torch.randn(rows, width, generator=g, device=device).to(dtype)
    weight = (torch.rand(width, generator=g, device=device) + 0.5).to(dtype)
    a = torch.rand(rows, 1, generator=g, device=device) + 0.5
    s = torch.rand(1, width, generator=g, device=device) * 0.1
    return hidden, out, weight, a, s


@pytest.mark.parametrize("width,scaled", [(96, False), (96, True), (3584, True), (3584, False), (1000, True),
                                          (4097, True)])
def test_interpreted_add_norm_quant_gives_the_eager_residual_scales_and_values(interpreted, width, scaled):
    hidden, out, weight, a, s = inputs(3, width, torch.float32)
    a, s = (a, s) if scaled else (None, None)
    hidden[1], out[1] = 0, 0  # an all-zero row: the floor scale, zeros out
    want_hidden, _, _ = hf_elementwise.add_norm_quant(hidden, out, weight, 1e-6, a, s)
    want, want_scale = unrolled(F.rms_norm(want_hidden, (width,), weight, 1e-6))
    got_hidden, got, got_scale = hf_norm_quant.add_norm_quant(hidden, out, weight, 1e-6, a, s, out_dtype=torch.float32)
    assert got.shape == (3, width) and got_scale.shape == (3, 1)
    assert torch.equal(got_hidden, want_hidden)  # one float32 multiply-add, rounded once either way
    assert got_scale[1].item() == torch.tensor(1e-12).item() and not got[1].any()
    # the mean of squares summed in another order: float32's last bits of the norm
    torch.testing.assert_close(got_scale, want_scale, rtol=2e-6, atol=0)
    torch.testing.assert_close(got, want, rtol=4e-6, atol=2e-4)


def test_interpreted_norm_quant_and_quant_give_the_eager_scales_and_values(interpreted):
    hidden, _, weight, _, _ = inputs(4, 700, torch.float32)
    want, want_scale = unrolled(F.rms_norm(hidden, (700,), weight, 1e-5))
    got, got_scale = hf_norm_quant.norm_quant(hidden, weight, 1e-5, out_dtype=torch.float32)
    torch.testing.assert_close(got_scale, want_scale, rtol=2e-6, atol=0)
    torch.testing.assert_close(got, want, rtol=4e-6, atol=2e-4)
    want, want_scale = unrolled(hidden)
    got, got_scale = hf_norm_quant.quant(hidden, out_dtype=torch.float32)
    assert torch.equal(got_scale, want_scale)  # a max and one correctly rounded division
    torch.testing.assert_close(got, want, rtol=2e-7, atol=0)  # tl.fdiv: ~2 ulp


def test_interpreted_quant_keeps_nan_where_the_eager_piece_has_it(interpreted):
    x = torch.ones(2, 8)
    x[0, 1] = float("nan")
    x[1, 2] = float("inf")
    got, _ = hf_norm_quant.quant(x, out_dtype=torch.float32)
    assert got[0, 1].isnan() and got[1, 2].isnan()  # inf / inf: NaN, as the eager piece


def test_bad_inputs_are_refused():
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match=r"^add_norm_quant: the unit GEMM's scales come together \(a and s\)$"):
        hf_norm_quant.add_norm_quant(x, x, torch.ones(8), 1e-6, a=torch.ones(2, 1))
    with pytest.raises(ValueError, match=r"^add_norm_quant: out \(2, 4\) torch.float32 and hidden \(2, 8\) torch.float32 differ$"):
        hf_norm_quant.add_norm_quant(x, torch.zeros(2, 4), torch.ones(8), 1e-6)
    # Regression (second walk): an out of another dtype gave a residual in hidden's dtype, eager's in out's
    with pytest.raises(ValueError, match=r"^add_norm_quant: out \(2, 8\) torch.bfloat16 and hidden \(2, 8\) torch.float32 differ$"):
        hf_norm_quant.add_norm_quant(x, torch.zeros(2, 8, dtype=torch.bfloat16), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match=r"^add_norm_quant: the scales must be float32, got a torch.bfloat16 and s torch.float32$"):
        hf_norm_quant.add_norm_quant(x, x, torch.ones(8), 1e-6, torch.ones(2, 1, dtype=torch.bfloat16), torch.ones(1, 8))
    with pytest.raises(ValueError, match=r"dense last dimension, got \(8, 2\)$"):
        hf_norm_quant.quant(x.t())
    with pytest.raises(ValueError, match=r"^row quantization: rows of 16385 columns; the kernel takes 1 to 16384$"):
        hf_norm_quant.quant(torch.zeros(1, 16385))
    with pytest.raises(ValueError, match=r"^row quantization: rows of 0 columns; the kernel takes 1 to 16384$"):
        hf_norm_quant.quant(torch.zeros(2, 0))
    assert hf_norm_quant.fits(16384) and not hf_norm_quant.fits(16385) and not hf_norm_quant.fits(0)


def test_scales_weights_and_outputs_the_kernel_would_misread_are_refused():
    """Regression (fresh-user walk): a non-dense ``a`` or ``s`` (the kernel indexes ``a + r``, ``s + c``)
    gave silently wrong residuals, and scales or a weight of other sizes read out of bounds."""
    x, w = torch.zeros(4, 8), torch.ones(8)
    a, s = torch.ones(4, 1), torch.ones(1, 8)
    with pytest.raises(ValueError, match=r"^add_norm_quant: a must be dense \(4, 1\), got \(4, 1\) with strides \(2, 1\)$"):
        hf_norm_quant.add_norm_quant(x, x, w, 1e-6, torch.rand(4, 2)[:, :1], s)
    with pytest.raises(ValueError, match=r"^add_norm_quant: a must be dense \(4, 1\), got \(1, 1\)"):
        hf_norm_quant.add_norm_quant(x, x, w, 1e-6, torch.ones(1, 1), s)
    with pytest.raises(ValueError, match=r"^add_norm_quant: s must be dense \(1, 8\), got \(1, 8\) with strides \(1, 2\)$"):
        hf_norm_quant.add_norm_quant(x, x, w, 1e-6, a, torch.rand(8, 2)[:, :1].t())
    with pytest.raises(ValueError, match=r"^add_norm_quant: s must be dense \(1, 8\), got \(1, 4\)"):
        hf_norm_quant.add_norm_quant(x, x, w, 1e-6, a, torch.ones(1, 4))
    with pytest.raises(ValueError, match=r"^row quantization: the norm's weight must be dense \(8,\), got \(4,\)$"):
        hf_norm_quant.norm_quant(x, torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match=r"^add_norm_quant: out's last dimension must be dense, got strides \(1, 2\)$"):
        hf_norm_quant.add_norm_quant(torch.zeros(2, 8), torch.randn(8, 2).t(), torch.ones(8), 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,width", [(64, 3584), (256, 3584), (3, 576)])
def test_the_e4m3_outputs_on_cuda_are_the_eager_pieces(rows, width):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    hidden, out, weight, a, s = inputs(rows, width, torch.bfloat16, "cuda")
    want_hidden, want_q, want_a = hf_elementwise.add_norm_quant(hidden, out, weight, 1e-6, a, s)
    got_hidden, got_q, got_a = hf_norm_quant.add_norm_quant(hidden, out, weight, 1e-6, a, s)
    assert torch.equal(got_hidden, want_hidden)
    torch.testing.assert_close(got_a, want_a, rtol=2e-6, atol=0)
    # e4m3 rounds to 2^-4 relative: a float32 difference at a rounding boundary moves one step
    diff = (got_q.float() - want_q.float()).abs() / want_q.float().abs().clamp_min(2.0**-6)
    assert diff.max().item() <= 2.0**-3 and (diff > 0).float().mean().item() < 0.01
    want_q, want_a = hf_fp8.quantize_rows(got_hidden)
    got_q, got_a = hf_norm_quant.quant(got_hidden)
    # CUDA's eager amax / 448 multiplies by the reciprocal (an H100, 2026-12-07: not equal): one ulp
    torch.testing.assert_close(got_a, want_a, rtol=2.0**-23, atol=0)
    diff = (got_q.float() - want_q.float()).abs() / want_q.float().abs().clamp_min(2.0**-6)
    assert diff.max().item() <= 2.0**-3 and (diff > 0).float().mean().item() < 0.01
