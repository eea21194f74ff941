"""The FP8 unit GEMM's split-K Triton kernel (trainer/engines/hf_split_k.py): in Triton's interpreter on the
CPU against the float64 product of the same e4m3 codes, and against the kernel's own slices added in slice
order (the fixed order the last program sums in, so the same bits every run); its launches; ``-m gpu``
against ``torch._scaled_mm`` at the Qwen2.5-7B shape, and inside a CUDA-graph capture."""

from __future__ import annotations

import pytest
import torch
from triton_helpers import run_interpreted

from chatgym.trainer.engines import hf_fp8, hf_split_k
from chatgym.trainer.engines.hf_split_k import Launch

INTERPRETED_TESTS = 9  # the tests whose names hold "interpreted" (4 + 2 parametrized, 3)


def test_the_kernel_tests_pass_in_tritons_interpreter():
    run_interpreted(__file__, INTERPRETED_TESTS)


def codes(m, n, k, device="cpu", seed=0):
    """e4m3 activations ``(m, k)`` and weights ``(n, k)``, quantized from normal draws."""
    g = torch.Generator(device=device).manual_seed(seed)
    xq, _ = hf_fp8.quantize_rows(torch.randn(m, k, generator=g, device=device))
    q, _ = hf_fp8.quantize_rowwise(torch.randn(n, k, generator=g, device=device))
    return xq, q


# rows not a multiple of BM, outputs not of BN, K not of BK (a ragged last slice), one slice and several
LAUNCHES = [(5, 48, 96, Launch(16, 16, 32, 3, 4, 2)), (33, 40, 160, Launch(32, 32, 32, 2, 4, 2)),
            (16, 32, 64, Launch(16, 32, 32, 1, 4, 2)), (20, 64, 112, Launch(16, 32, 32, 4, 4, 2))]


@pytest.mark.parametrize("m,n,k,chosen", LAUNCHES)
def test_interpreted_kernel_is_the_product_and_its_slices_added_in_order(interpreted, m, n, k, chosen):
    xq, q = codes(m, n, k)
    got = hf_split_k.mm(xq, q, torch.float32, chosen)
    exact = xq.double() @ q.double().t()
    bound = k * 2.0**-24 * (xq.double().abs() @ q.double().abs().t())  # float32 sums' error
    assert got.shape == (m, n) and ((got.double() - exact).abs() <= bound).all()
    # the slices as the kernel cuts them (per_split inner columns each), each as a one-slice call
    steps = -(-k // chosen.bk)
    per = -(-steps // min(chosen.split, steps)) * chosen.bk
    one = Launch(chosen.bm, chosen.bn, chosen.bk, 1, chosen.warps, chosen.stages)
    parts = [hf_split_k.mm(xq[:, lo:lo + per], q[:, lo:lo + per], torch.float32, one) for lo in range(0, k, per)]
    total = torch.zeros(m, n)
    for part in parts:
        total = total + part
    assert torch.equal(got, total)  # bit for bit: the slice order, not the order the programs finished in
    assert torch.equal(hf_split_k.mm(xq, q, torch.float32, chosen), got)


@pytest.mark.parametrize("chosen", [Launch(16, 16, 32, 1, 4, 2), Launch(16, 16, 32, 3, 4, 2)])
def test_interpreted_scales_multiply_the_float32_sum_before_its_rounding(interpreted, chosen):
    """``split_k_rowwise``'s epilogue: ``(sum · a) · s`` in float32, then one rounding: bit for bit the unscaled
    float32 product times the scales in that order, rows and outputs past a tile's edge included."""
    xq, q = codes(21, 40, 96, seed=5)
    g = torch.Generator().manual_seed(6)
    a, s = torch.rand(21, 1, generator=g) + 0.5, torch.rand(1, 40, generator=g) / 100
    got = hf_split_k.mm(xq, q, torch.float32, chosen, hf_split_k.Workspace(), a, s)
    assert torch.equal(got, hf_split_k.mm(xq, q, torch.float32, chosen, hf_split_k.Workspace()) * a * s)
    with pytest.raises(ValueError, match=r"^split_k: the row scales a and the channel scales s come together$"):
        hf_split_k.mm(xq, q, torch.float32, chosen, None, a)


def test_interpreted_counters_return_to_zero_and_the_workspace_is_reused(interpreted):
    """A call leaves every tile counter at zero (the next call counts from it), a smaller call keeps the
    larger workspace, a larger one grows it and keeps the one it outgrew (a captured graph writes there)."""
    xq, q = codes(20, 64, 128)
    space = hf_split_k.Workspace()
    hf_split_k.mm(xq, q, torch.float32, Launch(16, 16, 32, 4, 4, 2), space)
    workspace, counters = space.partials, space.counters
    assert workspace.numel() == 4 * 20 * 64 and not counters.any()
    small = hf_split_k.mm(xq[:3, :64], q[:16, :64], torch.float32, Launch(16, 16, 32, 2, 4, 2), space)
    assert space.partials is workspace and not counters.any()
    assert torch.equal(small.double(), xq[:3, :64].double() @ q[:16, :64].double().t())  # exact: 64 products
    hf_split_k.mm(codes(40, 64, 128)[0], q, torch.float32, Launch(16, 16, 32, 4, 4, 2), space)  # grows it
    assert space.partials.numel() == 4 * 40 * 64 and space.counters is counters and space.outgrown == [workspace]


def test_interpreted_sizes_of_zero_bad_scales_and_dtypes(interpreted):
    """Regression (fresh-user walk): K or N of 0 divided by zero before the launch; the kernel now declines
    them (cuBLASLt's GEMM gives the empty or zero product). Scales of the wrong size were read past their
    end, an integer output truncated: refused."""
    xq, q = codes(4, 8, 64)
    empty = torch.zeros(4, 0).to(torch.float8_e4m3fn)
    assert hf_split_k.mm(empty, torch.zeros(8, 0).to(torch.float8_e4m3fn), torch.float32) is None
    assert hf_split_k.mm(xq, q[:0], torch.float32) is None
    with pytest.raises(ValueError, match=r"^split_k: the scales must be dense float32, a of 4 rows and s of 8 "
                                         r"columns, got a torch.float32 \(1, 1\) and s torch.float32 \(1, 8\)$"):
        hf_split_k.mm(xq, q, torch.float32, None, None, torch.ones(1, 1), torch.ones(1, 8))
    with pytest.raises(ValueError, match=r"^split_k: the scales must be dense float32"):
        hf_split_k.mm(xq, q, torch.float32, None, None, torch.ones(4, 1, dtype=torch.float16), torch.ones(1, 8))
    with pytest.raises(ValueError, match=r"^split_k: out_dtype must be bfloat16, float16 or float32, got torch.int32$"):
        hf_split_k.mm(xq, q, torch.int32)


def test_interpreted_kernel_rounds_its_sum_once_to_the_output_dtype(interpreted):
    """float16 output: the float32 sum rounded once (the interpreter's cast to fp16 rounds to nearest);
    e4m3 codes of normal draws, not scaled to 448, so the sums stay in fp16's range."""
    g = torch.Generator().manual_seed(3)
    xq, q = (torch.randn(rows, 64, generator=g).to(torch.float8_e4m3fn) for rows in (8, 32))
    got = hf_split_k.mm(xq, q, torch.float16, Launch(16, 16, 32, 2, 4, 2))
    want = hf_split_k.mm(xq, q, torch.float32, Launch(16, 16, 32, 2, 4, 2)).half()
    assert got.dtype == torch.float16 and torch.equal(got, want)


def test_default_launches_at_the_7b_shape():
    """All rows up to 256 in a tile, 128 outputs, and slices of K while the grid fits the 132
    multiprocessors: down (K 18,944: 148 steps) 28 tiles x 4 slices, q/k/v 36 x 3, gate/up 296 tiles: no
    split; 64 rows a tile of 64."""
    assert hf_split_k.default_launch(256, 3584, 18944) == Launch(256, 128, 128, 4, 8, 4)
    assert hf_split_k.default_launch(256, 3584, 3584) == Launch(256, 128, 128, 4, 8, 4)  # 28 steps, 4 slices of 7
    assert hf_split_k.default_launch(256, 4608, 3584) == Launch(256, 128, 128, 3, 8, 4)
    assert hf_split_k.default_launch(256, 37888, 3584) == Launch(256, 128, 128, 1, 8, 4)
    assert hf_split_k.default_launch(64, 3584, 18944) == Launch(64, 128, 128, 4, 4, 5)
    assert hf_split_k.default_launch(3, 3584, 64) == Launch(64, 128, 128, 1, 4, 5)  # 1 step: no slices


def test_the_launch_table_from_the_environment(monkeypatch):
    hf_split_k.launch_table.cache_clear()
    monkeypatch.setenv("CHATGYM_FP8_SPLIT_K_CONFIG", '{"256,3584,18944": [128, 128, 128, 2, 8, 3], "64,3584,3584": "cublas"}')
    try:
        assert hf_split_k.launch(256, 3584, 18944) == Launch(128, 128, 128, 2, 8, 3)
        assert hf_split_k.launch(64, 3584, 3584) is None
        assert hf_split_k.launch(64, 3584, 18944) == hf_split_k.default_launch(64, 3584, 18944)
        assert hf_split_k.launch(257, 3584, 18944) is None  # more rows than a decode step's: cuBLASLt
        # Regression (fresh-user walk): a bool taken as an int, sizes of 0 or below, a key given twice (the
        # last was kept)
        for bad in ('[1, 2]', '{"256,3584": [128, 128, 128, 2, 8, 3]}', '{"1,2,3": [128, 128, 128, 2, 8]}', "nope",
                    '{"1,2,3": [128, 128, 128, 2, 8, true]}', '{"0,2,3": "cublas"}', '{"-1,2,3": "cublas"}',
                    '{"1,2,3": "cublas", "1,2,3": [128, 128, 128, 2, 8, 3]}'):
            hf_split_k.launch_table.cache_clear()
            monkeypatch.setenv("CHATGYM_FP8_SPLIT_K_CONFIG", bad)
            with pytest.raises(ValueError, match=r"^CHATGYM_FP8_SPLIT_K_CONFIG must be a JSON object of"):
                hf_split_k.launch(1, 2, 3)
        hf_split_k.launch_table.cache_clear()
        monkeypatch.setenv("CHATGYM_FP8_SPLIT_K_CONFIG", '{"1,2,3": "CUBLAS"}')  # in any case, as CHATGYM_FP8_GEMM
        assert hf_split_k.launch(1, 2, 3) is None
        hf_split_k.launch_table.cache_clear()
        monkeypatch.setenv("CHATGYM_FP8_SPLIT_K_CONFIG", '{"1,2,3": [128, 96, 128, 2, 8, 3]}')
        with pytest.raises(ValueError, match=r"^CHATGYM_FP8_SPLIT_K_CONFIG 1,2,3: Launch\(bm=128, bn=96, .* must have"):
            hf_split_k.launch(1, 2, 3)
    finally:
        hf_split_k.launch_table.cache_clear()


def test_on_the_cpu_without_the_interpreter_torchs_scaled_mm_runs_it():
    """No Triton driver on the CPU: the kernel declines and ``scaled_mm`` runs the unit GEMM
    (``torch._scaled_mm``'s CPU kernel)."""
    if hf_split_k.os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter's process runs the kernel")
    xq, q = codes(4, 32, 64)
    assert hf_split_k.mm(xq, q, torch.float32) is None
    assert torch.equal(hf_fp8.scaled_mm(xq, None, q, None, torch.float32, "split_k"),
                       hf_fp8.scaled_mm(xq, None, q, None, torch.float32, "unit"))
    a, s = torch.rand(4, 1) + 0.5, torch.rand(1, 32)
    assert torch.equal(hf_fp8.scaled_mm(xq, a, q, s, torch.float32, "split_k_rowwise"),
                       hf_fp8.scaled_mm(xq, a, q, s, torch.float32, "rowwise"))
    with pytest.raises(ValueError, match=r"^split_k_rowwise: a must be dense \(4, 1\), got \(1, 4\)"):
        hf_fp8.scaled_mm(xq, a.t(), q, s, torch.float32, "split_k_rowwise")
    # Regression (fresh-user walk): no scales gave "'NoneType' object has no attribute 'dtype'"
    with pytest.raises(ValueError, match=r"^split_k_rowwise: needs the row scales a and the channel scales s, "
                                         r"got a NoneType and s NoneType$"):
        hf_fp8.scaled_mm(xq, None, q, None, torch.float32, "split_k_rowwise")


@pytest.mark.gpu
def test_split_k_at_the_7b_down_projection_against_cublas_and_float64():
    """256 rows x K 18,944 (Qwen2.5-7B's down projection) at the default launch (4 slices): within bf16's
    rounding of the float64 product (as the unit GEMM, 2^-8 of the largest product), the same bits on
    every call of 50, and within 2^-8 of cuBLASLt's unit GEMM; 64 rows too."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for m in (256, 64):
        xq, q = codes(m, 3584, 18944, device="cuda")
        exact = xq.double() @ q.double().t()
        size = exact.abs().max().item()
        got = hf_split_k.mm(xq, q, torch.bfloat16)
        unit = hf_fp8.scaled_mm(xq, None, q, None, torch.bfloat16, "unit")
        assert (got.double() - exact).abs().max().item() < 2**-8 * size
        assert (got.double() - unit.double()).abs().max().item() < 2**-8 * size
        # a tile summed before all its slices were written would differ now and then: 50 calls
        assert all(torch.equal(hf_split_k.mm(xq, q, torch.bfloat16), got) for _ in range(50))


@pytest.mark.gpu
def test_split_k_in_a_captured_graph():
    """A size first seen inside a capture: the kernel declines (no workspace may be made there) and
    ``scaled_mm`` runs cuBLASLt's unit GEMM; once made outside, the captured kernel replays the eager
    call's bits."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    space = hf_split_k.Workspace()
    xq, q = codes(256, 3584, 3584, device="cuda", seed=1)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        assert hf_split_k.mm(xq, q, torch.bfloat16, workspace=space) is None
        first = hf_fp8.scaled_mm(xq, None, q, None, torch.bfloat16, "split_k", workspace=space)
    graph.replay()
    assert torch.equal(first, hf_fp8.scaled_mm(xq, None, q, None, torch.bfloat16, "unit"))
    with torch.cuda.stream(stream):
        eager = hf_split_k.mm(xq, q, torch.bfloat16, workspace=space)  # makes the workspace
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = hf_split_k.mm(xq, q, torch.bfloat16, workspace=space)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_a_bad_launch_table_is_refused_at_config_load(monkeypatch):
    """CHATGYM_FP8_SPLIT_K_CONFIG is read as the first GEMM runs, in the engine's worker: the config-load
    option check reads it first wherever there is a fused step, and names it."""
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines import check_engine_options

    hf_split_k.launch_table.cache_clear()
    monkeypatch.setenv("CHATGYM_FP8_SPLIT_K_CONFIG", '{"256,3584,18944": [256, 128, 128, 4, 8]}')
    try:
        with pytest.raises(ConfigError, match=r"^CHATGYM_FP8_SPLIT_K_CONFIG must be a JSON object of"):
            check_engine_options("hf", {"quantization": "fp8", "decode": "static"}, "engine.options")
        check_engine_options("hf", {"decode": "static", "fused_step": False}, "engine.options")  # no fused step
    finally:
        hf_split_k.launch_table.cache_clear()
