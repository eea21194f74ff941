"""The FP8 step's ``silu(gate) * up`` quantized per row in two Triton kernels
(trainer/engines/hf_silu_quant.py), run on the CPU in Triton's interpreter against the eager piece
(:func:`chatgym.trainer.engines.hf_elementwise.silu_mul_quant`, which is ``hf_fp8.quantize_rows`` of
``silu(gate) * up``): the row scales and the values before the e4m3 rounding, for rows of one block, of
several with a partial last one, the "unit" GEMM's scales applied or not. In float32 only: the
interpreter's casts truncate (to bf16, 1.0 + 2^-8 + 2^-10 becomes 1.0; to e4m3, 31.02 becomes 16) where
CUDA rounds to nearest. ``-m gpu``: bf16 inputs and the e4m3 outputs on CUDA."""

from __future__ import annotations

import pytest
import torch
from triton_helpers import run_interpreted

from chatgym.trainer.engines import hf_elementwise, hf_fp8, hf_silu_quant

INTERPRETED_TESTS = 14  # the tests whose names hold "interpreted" (12 + 2 parametrized)


def test_the_kernel_tests_pass_in_tritons_interpreter():
    run_interpreted(__file__, INTERPRETED_TESTS)


def eager(gate_up, a=None, s=None):
    """The eager piece's row scales and its values before the e4m3 cast (``quantize_rows`` unrolled)."""
    y = hf_elementwise.silu_mul(hf_elementwise.dequant(gate_up, a, s)).float()
    scale = (y.abs().amax(dim=1, keepdim=True) / hf_fp8.FP8_MAX).clamp_min(1e-12)
    return (y / scale).clamp(-hf_fp8.FP8_MAX, hf_fp8.FP8_MAX), scale


def inputs(rows, inner, dtype, scaled, device="cpu"):
    g = torch.Generator(device=device).manual_seed(rows * 7 + inner)
    gate_up = (3 * torch.randn(rows, 2 * inner, generator=g, device=device)).to(dtype)
    if not scaled:
        return gate_up, None, None
    a = torch.rand(rows, 1, generator=g, device=device) + 0.5
    s = torch.rand(1, 2 * inner, generator=g, device=device) * 0.1
    return gate_up, a, s


@pytest.mark.parametrize("one_pass", [True, False])
@pytest.mark.parametrize("inner,scaled", [(96, False), (96, True), (2500, False), (2500, True), (4096, True),
                                          (4097, False)])
def test_interpreted_kernels_give_the_eager_scales_and_values(interpreted, inner, scaled, one_pass):
    """One pass: 96 = 64 + a tail of 32, 2500 = 2048 + 452 of 512, 4096 with no tail, 4097 = 4096 + 1 of 1."""
    gate_up, a, s = inputs(3, inner, torch.float32, scaled)
    gate_up[1] = 0  # an all-zero row: the floor scale, zeros out
    want, want_scale = eager(gate_up, a, s)
    got, got_scale = hf_silu_quant.silu_mul_quant(gate_up, a, s, out_dtype=torch.float32, one_pass=one_pass)
    assert got.shape == (3, inner) and got_scale.shape == (3, 1)
    assert got_scale[1].item() == torch.tensor(1e-12).item() and not got[1].any()  # float32's 1e-12
    # exp may differ from the CPU's in float32's last bits; values reach 448
    torch.testing.assert_close(got_scale, want_scale, rtol=2e-7, atol=0)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-4)


@pytest.mark.parametrize("one_pass", [True, False])
def test_interpreted_kernels_keep_nan_where_the_eager_piece_has_it(interpreted, one_pass):
    """Regression (fresh-user walk): an infinite gate gave -448 where the eager piece gives NaN (the
    clamp dropped the NaN of inf / inf), hiding it from the sampler's nan/inf check."""
    gate_up = torch.ones(2, 8)
    gate_up[0, 1] = float("inf")
    gate_up[1, 2] = float("nan")
    want, _ = eager(gate_up)
    got, _ = hf_silu_quant.silu_mul_quant(gate_up, out_dtype=torch.float32, one_pass=one_pass)
    assert torch.isnan(want[0, 1]) and torch.isnan(got[0, 1]) and torch.isnan(got[1, 2])


def test_unpaired_scales_and_bad_shapes_are_refused():
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="come together"):
        hf_silu_quant.silu_mul_quant(x, torch.ones(2, 1))
    with pytest.raises(ValueError, match="dense"):
        hf_silu_quant.silu_mul_quant(torch.zeros(8, 2).t())
    for bad in (torch.zeros(2, 7), torch.zeros(8)):  # an odd size would drop its last column
        with pytest.raises(ValueError, match=r"must be \(M, 2 \* I\)"):
            hf_silu_quant.silu_mul_quant(bad)
    with pytest.raises(ValueError, match=r"^silu_mul_quant: one pass takes rows of at most 32768 outputs, got 32769$"):
        hf_silu_quant.silu_mul_quant(torch.zeros(1, 2 * 32769), one_pass=True)
    assert hf_silu_quant.one_pass_fits(32768) and not hf_silu_quant.one_pass_fits(32769)
    assert not hf_silu_quant.one_pass_pays(4096, 18944, "cpu")  # off CUDA: the two kernels
    # Regression (fresh-user walk): no outputs returned uninitialised scales; scales the kernels would
    # misread (they index a + r, s + c) gave silently wrong values
    with pytest.raises(ValueError, match=r"^silu_mul_quant: gate_up must be \(M, 2 \* I\) with I >= 1, got shape \(2, 0\)$"):
        hf_silu_quant.silu_mul_quant(torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r"^silu_mul_quant: a must be dense \(4, 1\), got \(4, 1\) with strides \(2, 1\)$"):
        hf_silu_quant.silu_mul_quant(torch.zeros(4, 8), torch.rand(4, 2)[:, :1], torch.ones(1, 8))
    with pytest.raises(ValueError, match=r"^silu_mul_quant: s must be dense \(1, 8\), got \(1, 4\)"):
        hf_silu_quant.silu_mul_quant(torch.zeros(4, 8), torch.ones(4, 1), torch.ones(1, 4))


@pytest.mark.gpu
def test_one_pass_pays_from_as_many_rows_as_multiprocessors():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert hf_silu_quant.one_pass_pays(sms, 18944, "cuda") and not hf_silu_quant.one_pass_pays(sms - 1, 18944, "cuda")
    assert not hf_silu_quant.one_pass_pays(sms, 32769, "cuda:0")


@pytest.mark.gpu
@pytest.mark.parametrize("one_pass", [True, False])
@pytest.mark.parametrize("rows,inner,scaled", [(64, 18944, True), (256, 18944, True), (7, 1536, False)])
def test_the_e4m3_outputs_on_cuda_are_the_eager_pieces(rows, inner, scaled, one_pass):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    gate_up, a, s = inputs(rows, inner, torch.bfloat16, scaled, device="cuda")
    want_x, want_a = hf_elementwise.silu_mul_quant(gate_up, a, s)
    got_x, got_a = hf_silu_quant.silu_mul_quant(gate_up, a, s, one_pass=one_pass)
    assert got_x.dtype == torch.float8_e4m3fn and got_x.shape == want_x.shape
    torch.testing.assert_close(got_a, want_a, rtol=2**-7, atol=0)
    assert (got_x.view(torch.uint8) == want_x.view(torch.uint8)).float().mean().item() > 0.99
    dequant = got_x.float() * got_a
    torch.testing.assert_close(dequant, want_x.float() * want_a, rtol=2**-3, atol=2**-9 * float(want_a.max()))
