"""``benchmarks/engine_gaps_gpu.py`` off the GPU: decode steps found by their first attention kernel, and the
window's busy time, idle time, kernels by name and gaps, against a timeline laid out by hand."""

from __future__ import annotations

import importlib

import pytest
from test_hf_decode_bench import BENCHMARKS


@pytest.fixture
def gaps(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports hf_decode_gpu from there
    return importlib.import_module("engine_gaps_gpu")


def timeline():
    """Five decode steps of two layers, 100 us apart: per layer attention 10 us then a GEMM 30 us (the
    second layer's GEMM overlapped by a 5 us copy), then the sampler 5 us and an idle gap of 15 us; a
    prefill attention kernel (another name) before them."""
    out = [(-50.0, -40.0, "prefill_attention")]
    for step in range(5):
        t = 100.0 * step
        out += [(t, t + 10, "decode_attention"), (t + 10, t + 40, "gemm"),
                (t + 40, t + 50, "decode_attention"), (t + 50, t + 80, "gemm"), (t + 60, t + 65, "Memcpy DtoD"),
                (t + 80, t + 85, "sampler")]
    return sorted(out)


def test_steps_start_at_their_first_decode_attention_kernel(gaps):
    assert gaps.step_starts(timeline(), layers=2) == [0.0, 100.0, 200.0, 300.0, 400.0]


def test_the_window_splits_into_busy_idle_kernels_and_gaps(gaps):
    lines = gaps.summarize(timeline(), [0.0, 100.0, 200.0, 300.0, 400.0], [], 1, 4)
    # steps 2-4 (from step 2's start to step 5's): 3 steps of 100 us, 85 us busy each (the copy inside a GEMM counts once), 15 us idle
    assert lines[0] == ("window: decode steps 2-4, 3 steps: 0.100 ms a step, some kernel running 0.085 ms, "
                        "device idle 0.015 ms (15.0%)")
    assert [line.split() for line in lines[1:3]] == [["60.0", "us", "a", "step", "gemm"],
                                                    ["20.0", "us", "a", "step", "decode_attention"]]
    assert sorted(line.split()[0] + " " + line.split()[-1] for line in lines[3:5]) == ["5.0 DtoD", "5.0 sampler"]
    assert lines[5:] == []  # 15 us gaps: under the 20 us listed


def test_gaps_over_20_us_are_listed_largest_first_with_the_host_calls_then(gaps):
    intervals = [(0.0, 10.0, "decode_attention"), (40.0, 50.0, "gemm"), (100.0, 110.0, "decode_attention"),
                 (200.0, 210.0, "decode_attention")]
    host = [(5.0, 45.0, "cudaEventSynchronize"), (120.0, 130.0, "aten::copy_")]
    lines = gaps.summarize(intervals, [0.0, 100.0, 200.0], host, 0, 2)
    assert lines[0].startswith("window: decode steps 1-2, 2 steps: 0.100 ms a step, some kernel running 0.015 ms")
    assert [line for line in lines if "gap" in line] == [
        "    gap    90.0 us at +   0.110 ms; host in: ",
        "    gap    50.0 us at +   0.050 ms; host in: ",
        "    gap    30.0 us at +   0.010 ms; host in: cudaEventSynchronize",
    ]


def test_too_few_steps_say_so(gaps):
    """The walk's findings: 65 steps (a window of none) divided by zero, fewer indexed past the starts."""
    assert gaps.summarize([], [0.0, 1.0], [], 0, 5) == [
        "no window: 2 decode steps seen, and one from step 1's start to a later step's needs at least 2"]
    for n in (0, 64, 65):  # as profile_mode asks: steps 65 .. min(n, 128)
        starts = [float(t) for t in range(n)]
        assert gaps.summarize([], starts, [], 64, min(len(starts) - 1, 127)) == [
            f"no window: {n} decode steps seen, and one from step 65's start to a later step's needs at least 66"]
    assert gaps.summarize([], [0.0, 0.0], [], 0, 1) == ["no window: decode steps 1 and 2 start at the same time"]


def test_intervals_in_any_order_give_the_same_window(gaps):
    shuffled = timeline()[::-1]
    assert gaps.step_starts(shuffled, layers=2) == [0.0, 100.0, 200.0, 300.0, 400.0]
    assert gaps.summarize(shuffled, [0.0, 100.0, 200.0, 300.0, 400.0], [], 1, 4) == \
        gaps.summarize(timeline(), [0.0, 100.0, 200.0, 300.0, 400.0], [], 1, 4)


def test_rows_below_one_are_refused_before_cuda_is_asked_for(gaps, monkeypatch, capsys):
    # Regression (second walk): --rows 0 and -1 were taken (hf_decode_gpu refuses --batch 0).
    import sys

    monkeypatch.setattr(sys, "argv", ["engine_gaps_gpu.py", "--rows", "256", "0"])
    with pytest.raises(SystemExit):
        gaps.main()
    assert capsys.readouterr().err.splitlines()[-1] == "engine_gaps_gpu.py: error: --rows must be >= 1, got [256, 0]"


def test_modes_without_the_compiled_step_are_refused_before_cuda_is_asked_for(gaps, monkeypatch, capsys):
    # Regression (noticed in stop 65): 'static' (no compiled step, so no decode_attention kernel to mark the
    # steps) ran the whole GPU run to print "no window".
    import sys

    monkeypatch.setattr(sys, "argv", ["engine_gaps_gpu.py", "--modes", "static all", "static", "layers"])
    with pytest.raises(SystemExit):
        gaps.main()
    assert capsys.readouterr().err.splitlines()[-1] == ("engine_gaps_gpu.py: error: --modes: ['static', 'layers'] run "
                                                        "no compiled step, whose kernels mark the decode steps here")


def test_a_mode_given_twice_is_refused(gaps, monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys, "argv", ["engine_gaps_gpu.py", "--modes", "static all", "static all"])
    with pytest.raises(SystemExit):
        gaps.main()
    assert capsys.readouterr().err.splitlines()[-1] == ("engine_gaps_gpu.py: error: --modes: a mode given twice in "
                                                        "['static all', 'static all']")
