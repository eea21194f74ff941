"""``benchmarks/hf_decode_gpu.py``'s modes off the GPU: ``--modes`` runs what it names, ``--fp8`` alone adds
the FP8 modes to the defaults."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def decode_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("hf_decode_gpu", BENCHMARKS / "hf_decode_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def modes(bench, monkeypatch, *argv: str) -> list[str]:
    monkeypatch.setattr(sys, "argv", ["hf_decode_gpu.py", *argv])
    return bench.parse_args().modes


def test_modes_given_are_run_as_given_with_fp8(decode_bench, monkeypatch):
    # Regression (H100 lease, 2026-12-06): --fp8 added 'static', 'static fp8' and 'static fp8+head' to the
    # modes asked for, three uncompiled 7B runs the lease had no use for.
    assert modes(decode_bench, monkeypatch, "--fp8", "--modes", "static all", "static fp8 all") == [
        "static all", "static fp8 all"]
    defaults = [m for m in decode_bench.ENGINE_MODES if "fp8" not in m]
    assert modes(decode_bench, monkeypatch) == defaults
    assert modes(decode_bench, monkeypatch, "--fp8") == [*defaults, "static fp8", "static fp8+head"]


@pytest.mark.slow
def test_raw_generate_is_vllms_own_loop_on_the_same_engine(decode_bench):
    # The benchmark's reference column: vLLM's LLM.generate on chatgym's VLLMEngine's own vllm.LLM
    # (same engine arguments and request parameters); greedy, so it must give the engine's ids' count.
    import asyncio

    from chatgym.trainer.engines import SamplingParams
    from chatgym.trainer.engines.vllm_inproc import VLLMEngine

    eng = VLLMEngine("smollm2", dtype="float32", enforce_eager=True, max_model_len=512, kv_cache_gib=1)
    try:
        prompts = decode_bench.make_prompts(3, 49152, 0)
        params = [SamplingParams(max_tokens=8, temperature=0.0) for _ in prompts]
        ours = asyncio.run(decode_bench.run_engine(eng, prompts, params))[1]
        seconds, tokens = decode_bench.raw_generate(eng, prompts, params)
        assert seconds > 0 and tokens == ours and 3 <= tokens <= 24
        # the step timeline sees both paths' LLMEngine.step calls: at least one a new token of the longest
        marks = decode_bench.step_timeline(eng)
        for run in (lambda: asyncio.run(decode_bench.engine_span(eng, prompts, params)),
                    lambda: decode_bench.raw_generate_span(eng, prompts, params)):
            t0, t1, tokens = run()
            assert tokens == ours and len(marks) >= 8 and t0 <= marks[0][0] and marks[-1][1] <= t1
            marks.clear()
    finally:
        asyncio.run(eng.close())


def test_span_breakdown_splits_a_round_into_lead_steps_gaps_and_tail(decode_bench):
    # Hand values: the round ran 10.000-10.100 s; steps at 10.010-10.040 and 10.045-10.090.
    got = decode_bench.span_breakdown(10.0, 10.1, [(10.01, 10.04), (10.045, 10.09)])
    assert got["steps"] == 2
    assert [round(got[k], 9) for k in ("lead_ms", "in_steps_ms", "between_ms", "tail_ms")] == [10.0, 75.0, 5.0, 10.0]
    assert decode_bench.span_breakdown(0.0, 1.0, []) == {"steps": 0}


def test_bad_sizes_and_weights_are_refused_before_cuda_is_asked_for(decode_bench, monkeypatch, capsys):
    # Regression (fresh-user walk): --batch 0 and --real-weights at a Qwen shape passed the parser;
    # the second failed only in build_model, mid-run on a GPU.
    for argv, message in ((["--batch", "0"], "--batch and --repeats must be >= 1, got [0] and 3"),
                          (["--real-weights", "--shape", "qwen2.5-7b"],
                           "--real-weights: only SmolLM2's weights are packaged (--shape smollm2)"),
                          # Regression (second walk): argparse read --seed as --seeded, then "-1" as stray
                          (["--seed", "-1"], "unrecognized arguments: --seed -1")):  # fmt: skip
        with pytest.raises(SystemExit):
            modes(decode_bench, monkeypatch, *argv)
        assert capsys.readouterr().err.splitlines()[-1] == f"hf_decode_gpu.py: error: {message}"
