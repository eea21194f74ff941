"""``benchmarks/fp8_gemm_gpu.py`` off the GPU: its sweep's launches, and bad arguments refused before CUDA is
asked for (regression, fresh-user walk: each ended in "Torch not compiled with CUDA enabled", or after the
whole sweep)."""

from __future__ import annotations

import importlib
import sys

import pytest
from test_hf_decode_bench import BENCHMARKS


@pytest.fixture
def gemm_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports decode_step_gpu and hf_decode_gpu from there
    return importlib.import_module("fp8_gemm_gpu")


@pytest.mark.parametrize("argv,message", [
    (["--rows", "0"], "--rows, --layers and --iters must be >= 1, got [0], None and 50"),
    (["--layers", "0"], "--rows, --layers and --iters must be >= 1, got [64, 256], 0 and 50"),
    (["--iters", "-1"], "--rows, --layers and --iters must be >= 1, got [64, 256], None and -1"),
    (["--write", "x.json"], "--write needs --sweep"),
    (["--sweep", "--autotune"], "--sweep times the split-K kernel's launches; --autotune belongs to the GEMMs' comparison"),
    (["--sweep", "--write", "/nonexistent/dir/x.json"], "--write: cannot write /nonexistent/dir/x.json: No such file or directory"),
])  # fmt: skip
def test_bad_arguments_are_refused_before_cuda_is_asked_for(gemm_bench, monkeypatch, capsys, argv, message):
    monkeypatch.setattr(sys, "argv", ["fp8_gemm_gpu.py", *argv])
    with pytest.raises(SystemExit):
        gemm_bench.main()
    assert capsys.readouterr().err.splitlines()[-1] == f"fp8_gemm_gpu.py: error: {message}"


def test_without_cuda_it_says_so(gemm_bench, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fp8_gemm_gpu.py", "--sweep"])
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"^fp8_gemm_gpu.py needs CUDA$"):
        gemm_bench.main()


def test_the_sweeps_launches_at_the_7b_down_projection(gemm_bench):
    """256 rows, K 18,944 (148 steps), 3,584 outputs on 132 multiprocessors: every tile of at most 2 x 256 rows,
    each slice count whose grid stays within 264 programs (split 1 always) and leaves 2 steps a slice."""
    launches = gemm_bench.sweep_launches(256, 3584, 18944, 132)
    by_tile = {}
    for c in launches:
        by_tile.setdefault((c.bm, c.bn, c.warps, c.stages), []).append(c.split)
    assert by_tile[(256, 128, 8, 4)] == [1, 2, 3, 4, 6, 8]  # 28 tiles: 8 slices = 224 programs
    assert by_tile[(128, 128, 8, 4)] == [1, 2, 3, 4]  # 56 tiles: 4 slices = 224, 6 = 336
    assert by_tile[(64, 64, 4, 5)] == [1]  # 224 tiles: 2 slices = 448
    assert all(c.bk == 128 for c in launches) and len(launches) == 39
    assert {c.bm for c in gemm_bench.sweep_launches(64, 3584, 18944, 132)} == {64, 128}  # 256 > 2 x 64 rows
