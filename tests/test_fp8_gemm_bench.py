"""``benchmarks/fp8_gemm_gpu.py`` off the GPU: bad arguments refused before CUDA is asked for (regression,
fresh-user walk: each ended in "Torch not compiled with CUDA enabled")."""

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
])  # fmt: skip
def test_bad_arguments_are_refused_before_cuda_is_asked_for(gemm_bench, monkeypatch, capsys, argv, message):
    monkeypatch.setattr(sys, "argv", ["fp8_gemm_gpu.py", *argv])
    with pytest.raises(SystemExit):
        gemm_bench.main()
    assert capsys.readouterr().err.splitlines()[-1] == f"fp8_gemm_gpu.py: error: {message}"


def test_without_cuda_it_says_so(gemm_bench, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fp8_gemm_gpu.py"])
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"^fp8_gemm_gpu.py needs CUDA$"):
        gemm_bench.main()
