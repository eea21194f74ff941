"""A small version of ``benchmarks/sandbox_load.py``: 100 executions at concurrency 16 through a real
``chatgym serve-sandbox`` process; every result is right and nothing leaks (processes, zombies,
descriptors, temp dirs counted before and after)."""

import importlib.util
import shutil
from pathlib import Path

import pytest

from chatgym.sandboxes.local.bwrap import bwrap_args, probe

spec = importlib.util.spec_from_file_location(
    "sandbox_load", Path(__file__).resolve().parents[1] / "benchmarks" / "sandbox_load.py"
)
sandbox_load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox_load)

BWRAP = shutil.which("bwrap")
BWRAP_WHY = probe(bwrap_args(BWRAP, network=False, keep=[])) if BWRAP else "no bwrap on PATH"


@pytest.mark.parametrize(
    "backend",
    [
        "local",
        # The same through bwrap: slow (about 10 s more on a busy 2-core machine).
        pytest.param(
            "bwrap",
            marks=[pytest.mark.slow, pytest.mark.skipif(bool(BWRAP_WHY), reason=f"bwrap: {BWRAP_WHY}")],
        ),
    ],
)
def test_no_leaks_under_load(backend):
    r = sandbox_load.load_test(backend, runs=100, concurrency=16)
    assert r["wrong"] == [] and r["statuses"] == {"ok": 90, "error": 10}  # every 10th request raises
    assert r["leaks"] == dict.fromkeys(r["before"], 0), r
    assert r["before"]["processes of sandbox uids"] == 0 and r["before"]["zombies in the tree"] == 0
    assert r["before"]["zygote fds"] > 0 and r["before"]["zygote work dirs"] == 0  # the census saw the zygote


@pytest.mark.slow
def test_1000_runs_at_concurrency_32():
    r = sandbox_load.load_test("local", runs=1000, concurrency=32)
    sandbox_load.report(r)
    assert r["wrong"] == [] and r["statuses"] == {"ok": 900, "error": 100}
    assert r["leaks"] == dict.fromkeys(r["before"], 0)
