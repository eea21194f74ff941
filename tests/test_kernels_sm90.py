"""The `hf` engine's Triton kernels compiled for sm_90a on the CPU (benchmarks/kernels_sm90.py): the
properties the H100 measurements rest on, checked without a GPU (docs/gpu.md, "One kernel a row for the
FP8 step's quantizations; the sampler's lanes and base-2 log").

* the philox sampler's score takes ``-log2(u)`` in full precision (libdevice ``__nv_log2f``) and its
  log with ``lg2.approx`` (libdevice ``fast_log2f``, one instruction where ``tl.log`` is a ~35-instruction
  polynomial: the kernel's PTX 2,145 instructions with both logs in full precision, 1,606 so);
* the one-pass MLP quantization at the Qwen2.5-7B shape keeps the row in registers without spilling, in
  at most 64 registers a thread (2 programs of 16 warps a multiprocessor, the measured configuration);
* no kernel of the step spills.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def kernels():
    pytest.importorskip("triton")
    spec = importlib.util.spec_from_file_location("kernels_sm90", BENCHMARKS / "kernels_sm90.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels_sm90"] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        return {k.name.split(" ")[0] + (" e4m3" if "e4m3" in k.name else ""): k for k in module.engine_kernels()}
    finally:
        sys.modules.pop("kernels_sm90", None)


def test_the_sampler_takes_one_full_precision_log_and_one_approximate(kernels):
    """-log2(u) in full precision (near u = 1, where the likely winners are, lg2.approx's absolute error
    would be most of it: a fresh-user walk's finding), its log with lg2.approx."""
    ptx = kernels["philox_chunk"].ptx
    assert "__nv_log2f" in ptx and "lg2.approx" in ptx and "__nv_logf" not in ptx
    assert kernels["philox_chunk"].instructions < 2000  # 1,606 here; 2,145 with two full-precision logs


def test_the_one_pass_mlp_quantization_holds_the_row_in_64_registers(kernels):
    k = kernels["silu_mul_row"]
    assert k.warps == 16 and k.spill_bytes == 0 and k.registers <= 64, (k.registers, k.spill_bytes)
    assert k.resident == 2


def test_no_kernel_of_the_step_spills(kernels):
    assert set(kernels) == {"decode_attention e4m3", "decode_attention", "philox_chunk", "silu_mul_row", "row_quant"}
    assert {name: k.spill_bytes for name, k in kernels.items()} == dict.fromkeys(kernels, 0)
