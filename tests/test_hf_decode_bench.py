"""``benchmarks/hf_decode_gpu.py``'s modes off the GPU: ``--modes`` runs what it names, ``--fp8`` alone adds
the FP8 modes to the defaults."""

from __future__ import annotations

import importlib.util
import os
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
    defaults = [m for m in decode_bench.ENGINE_MODES if "fp8" not in m and "kv8" not in m]
    assert modes(decode_bench, monkeypatch) == defaults
    # Review: the e4m3 cache's bf16-weights mode is FP8 too (refused on a GPU without it): not a default
    assert "static all kv8" in decode_bench.ENGINE_MODES and "static all" in defaults
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
                          (["--seed", "-1"], "unrecognized arguments: --seed -1"),
                          # Regression (second walk): a mode given twice built two engines and leaked one
                          (["--modes", "static", "static"], "--modes: a mode given twice in ['static', 'static']"),
                          # Regression (walk): --interleave was taken beside --vllm-variants and did nothing
                          (["--interleave", "--vllm-variants", "a={}"], "--interleave runs the engine modes round "
                           "by round; --vllm-variants runs vLLM alone, a process a variant")):  # fmt: skip
        with pytest.raises(SystemExit):
            modes(decode_bench, monkeypatch, *argv)
        assert capsys.readouterr().err.splitlines()[-1] == f"hf_decode_gpu.py: error: {message}"


def test_vllm_variants_parse_to_names_and_options_and_bad_ones_are_refused(decode_bench, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["hf_decode_gpu.py", "--shape", "qwen2.5-7b", "--vllm-variants", "bf16={}",
                                      'fp8_kv={"quantization": "fp8", "kv_cache_dtype": "fp8"}',
                                      "--vllm-ratios", "fp8_kv/bf16"])
    args = decode_bench.parse_args()
    assert args.vllm_variants == [("bf16", {}), ("fp8_kv", {"quantization": "fp8", "kv_cache_dtype": "fp8"})]
    assert args.vllm_ratios == ["fp8_kv/bf16"]
    for argv, message in ((["--vllm-variants", "bf16"], "'bf16': NAME=JSON, NAME of letters, digits and _.+-"),
                          (["--vllm-variants", "a b={}"], "'a b={}': NAME=JSON, NAME of letters, digits and _.+-"),
                          (["--vllm-variants", "x={quantization: fp8}"],
                           "x: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
                          (["--vllm-variants", "x=[1]"], "x: the options must be a JSON object, got '[1]'"),
                          (["--vllm-variants", "x={}", "x={}"], "--vllm-variants: a name given twice in ['x', 'x']"),
                          (["--vllm-variants", "x={}", "--vllm-ratios", "x/y"],
                           "--vllm-ratios: 'x/y' is not A/B of two --vllm-variants names ['x']"),
                          # Regression (noticed in stop 65): a variant over itself was taken
                          (["--vllm-variants", "x={}", "--vllm-ratios", "x/x"],
                           "--vllm-ratios: 'x/x' is not A/B of two --vllm-variants names ['x']"),
                          # Regression (noticed in stop 65): the engine's options were taken and did nothing
                          (["--vllm-variants", "x={}", "--modes", "static", "--fp8", "--skip-generate"],
                           "--vllm-variants runs vLLM alone, a process a variant; --modes, --fp8, --skip-generate "
                           "would do nothing there"),
                          (["--vllm-variants", "x={}", "--seeded"], "--seeded would do nothing there")):  # fmt: skip
        monkeypatch.setattr(sys, "argv", ["hf_decode_gpu.py", *argv])
        with pytest.raises(SystemExit):
            decode_bench.parse_args()
        assert capsys.readouterr().err.splitlines()[-1].endswith(message)


def test_report_divides_each_fp8_variant_by_its_bf16_twin_and_the_asked_ratios(decode_bench, capsys):
    # (seconds, tokens, first round's seconds, decode seconds): tokens/s 1000, 1600, 2000, 1500 and
    # LLM.generate's 1250; no decode-only figures
    results = {"vllm bf16_async": (2.0, 2000, 9.0, None), "vllm fp8_async": (1.25, 2000, 9.0, None),
               "vllm fp8_async_kv": (1.0, 2000, 9.0, None), "vllm bf16": (2.0, 3000, 9.0, None),
               "vllm bf16 LLM.gen": (2.0, 2500, 9.0, None)}  # fmt: skip
    rows = decode_bench.report("qwen2.5-7b", 64, results, [("fp8_async_kv", "bf16_async"), ("bf16_async", "bf16")])
    tail = [row.split("batch   64  ", 1)[1] for row in rows[len(results) :]]
    assert tail == [
        "chatgym's vLLM engine / vLLM LLM.generate (bf16) x1.200",
        "FP8/bf16 vllm fp8_async         x1.600",
        "vllm fp8_async_kv / vllm bf16_async x2.000",
        "vllm bf16_async / vllm bf16 x0.667",
    ]


def test_report_gives_decode_tokens_per_second_and_their_fp8_ratio_with_decode_only(decode_bench):
    # --decode-only: 64 rows x 64 tokens (steps 65-128) over the median difference of the rounds: bf16
    # 4096 / 1.0 s = 4,096 tok/s, FP8 4096 / 0.625 s = 6,554; their ratio 1.6 where the whole runs' is 1.333
    results = {"engine static all": (2.0, 8192, 5.0, 1.0), "engine static fp8 all": (1.5, 8192, 5.0, 0.625)}
    rows = decode_bench.report("qwen2.5-7b", 64, results)
    assert rows[0].endswith("x1.00 vs engine static all  decode      4,096 tok/s")
    assert rows[1].endswith("x1.33 vs engine static all  decode      6,554 tok/s")
    assert rows[2].split("batch   64  ", 1)[1] == "FP8/bf16 engine static fp8 all  x1.333  decode x1.600"


def test_decode_only_times_the_cut_requests_each_round(decode_bench, monkeypatch):
    # time_engine's decode seconds: the median over rounds of (128-token round - 64-token round), here
    # by a stand-in engine whose rounds take 0.01 s a token (so 1.28 - 0.64 s each round).
    from types import SimpleNamespace

    seen, gemm_seen = [], []

    class Engine:
        def __init__(self, *args, **kwargs):
            gemm_seen.append(os.environ.get("CHATGYM_FP8_GEMM"))

        async def close(self):
            pass

    async def run_engine(engine, prompts, params):
        seen.append(params[0].max_tokens)
        return 0.01 * params[0].max_tokens, len(prompts) * params[0].max_tokens

    monkeypatch.setattr(decode_bench, "run_engine", run_engine)
    monkeypatch.setitem(sys.modules, "chatgym.trainer.engines.hf", SimpleNamespace(TransformersEngine=Engine))
    from chatgym.trainer.engines import SamplingParams

    monkeypatch.delenv("CHATGYM_FP8_GEMM", raising=False)
    got = decode_bench.time_engine(None, None, "static all", [[1, 2]], [SamplingParams(max_tokens=128)], 3, True)
    assert seen == [128, 64, 128, 64, 128, 64, 128, 64]  # warm-ups, then three rounds of both
    assert got[1:3] == (128, 1.28) and got[0] == pytest.approx(1.28) and got[3] == pytest.approx(0.64)
    # A mode's environment (mode_env) holds while its engine is built, and is gone after it.
    decode_bench.time_engine(None, None, "static fp8+head all cutlass", [[1, 2]], [SamplingParams(max_tokens=8)], 1)
    assert gemm_seen == [None, "cutlass"] and "CHATGYM_FP8_GEMM" not in os.environ


@pytest.mark.slow
def test_a_vllm_variants_options_reach_its_own_vllm_process(decode_bench, capsys):
    # A variant's options replace the child's defaults and reach vLLM: max_num_seqs 1 runs the two
    # requests one after the other, 128 steps each (a prefill that samples the first token, then 127),
    # where both together take 128. Real vLLM on the CPU, the SmolLM2 shape with random weights.
    cpu = {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.25, "kv_cache_gib": 1}
    per_batch: dict = {}
    for label, seqs in (("one", 1), ("two", 2)):
        decode_bench.add_vllm_results(per_batch, "smollm2", [2], 1, False, None, {**cpu, "max_num_seqs": seqs}, label)
    timelines = [line for line in capsys.readouterr().out.splitlines() if " timeline " in line]
    steps = {line.split("  vllm ")[1].split(" timeline")[0] + (" raw" if "raw" in line else ""):
             int(line.split("steps ")[1].split()[0]) for line in timelines}  # fmt: skip
    assert steps == {"one": 256, "one raw": 256, "two": 128, "two raw": 128}
    assert set(per_batch[2]) == {"vllm one", "vllm one LLM.gen", "vllm two", "vllm two LLM.gen"}
    assert all(tokens == 2 * decode_bench.NEW_TOKENS for _, tokens, *_ in per_batch[2].values())


def test_interleave_runs_every_mode_each_round_after_building_them_all(decode_bench, monkeypatch, capsys):
    # --interleave: both engines built and warmed up first, then each round runs bf16 (full, cut) and FP8
    # (full, cut) in turn (the call order below is what it is for). A stand-in engine per mode: 0.01 s a
    # token for bf16, 0.00625 for FP8, plus 1 ms for each full round the mode has run; the decode seconds
    # are the medians of (128-token - 64-token) rounds, 0.64 s and 0.4 s.
    from types import SimpleNamespace

    order, built_env = [], []

    class Engine:
        def __init__(self, model, tokenizer, **kwargs):
            self.name = "fp8" if kwargs.get("quantization") else "bf16"
            built_env.append(os.environ.get("CHATGYM_FP8_GEMM"))

        async def close(self):
            order.append((self.name, "close"))

    async def run_engine(engine, prompts, params):
        order.append((engine.name, params[0].max_tokens))
        rounds = sum(1 for name, n in order if name == engine.name and n == 128)
        per_token = 0.01 if engine.name == "bf16" else 0.00625
        return per_token * params[0].max_tokens + 0.001 * rounds, len(prompts) * params[0].max_tokens

    monkeypatch.setattr(decode_bench, "run_engine", run_engine)
    monkeypatch.setitem(sys.modules, "chatgym.trainer.engines.hf", SimpleNamespace(TransformersEngine=Engine))
    monkeypatch.delenv("CHATGYM_FP8_GEMM", raising=False)
    from chatgym.trainer.engines import SamplingParams

    modes = ["static all", "static fp8+head all cutlass"]
    got = decode_bench.time_engines_interleaved(None, None, modes, [[1, 2]], [SamplingParams(max_tokens=128)], 2, True)
    assert order == [("bf16", 128), ("bf16", 64), ("fp8", 128), ("fp8", 64),  # built and warmed up
                     ("bf16", 128), ("bf16", 64), ("fp8", 128), ("fp8", 64),  # round 1
                     ("bf16", 128), ("bf16", 64), ("fp8", 128), ("fp8", 64),  # round 2
                     ("bf16", "close"), ("fp8", "close")]
    assert built_env == [None, "cutlass"] and "CHATGYM_FP8_GEMM" not in os.environ
    assert got["engine static all"][3] == pytest.approx(0.64) and got["engine static fp8+head all cutlass"][3] == pytest.approx(0.4)
    assert got["engine static all"][2] == pytest.approx(1.281)  # the first round's seconds (round 1 of 128)
    assert "decode rounds, 1 rows, engine static all: 640.0 640.0 ms" in capsys.readouterr().out


def test_the_rows_are_printed_again_only_after_several_shapes(decode_bench, capsys):
    # report() prints each batch's rows as they come; one shape's rows were printed a second time at the
    # end (stop 64's note). Now only several shapes' rows come again, after a summary line.
    decode_bench.summary(["smollm2"], [["a", "b"]])
    assert capsys.readouterr().out == ""
    decode_bench.summary(["smollm2", "qwen2.5-7b"], [["a"], ["b", "c"]])
    assert capsys.readouterr().out == "summary:\na\nb\nc\n"


def test_interleave_closes_the_engines_built_when_a_later_one_fails(decode_bench, monkeypatch):
    # Regression (walk): a second mode whose engine failed to build left the first engine open.
    from types import SimpleNamespace

    closed = []

    class Engine:
        def __init__(self, model, tokenizer, **kwargs):
            if kwargs.get("quantization"):
                raise RuntimeError("no FP8 here")

        async def close(self):
            closed.append(self)

    async def run_engine(engine, prompts, params):
        return 1.0, len(prompts) * params[0].max_tokens

    monkeypatch.setattr(decode_bench, "run_engine", run_engine)
    monkeypatch.setitem(sys.modules, "chatgym.trainer.engines.hf", SimpleNamespace(TransformersEngine=Engine))
    from chatgym.trainer.engines import SamplingParams

    with pytest.raises(RuntimeError, match=r"^no FP8 here$"):
        decode_bench.time_engines_interleaved(None, None, ["static all", "static fp8+head all kv8"], [[1, 2]],
                                              [SamplingParams(max_tokens=8)], 1)
    assert len(closed) == 1


def test_no_engine_is_referenced_when_the_cache_is_emptied(decode_bench, monkeypatch):
    # Regression (second walk): the closing loop's variable kept the last engine (its KV cache and graphs)
    # alive through torch.cuda.empty_cache(); the old time_engine deleted it first.
    import weakref
    from types import SimpleNamespace

    alive = weakref.WeakSet()
    seen = []

    class Engine:
        def __init__(self, model, tokenizer, **kwargs):
            alive.add(self)

        async def close(self):
            pass

    async def run_engine(engine, prompts, params):
        return 1.0, len(prompts) * params[0].max_tokens

    monkeypatch.setattr(decode_bench, "run_engine", run_engine)
    monkeypatch.setattr(decode_bench, "_empty_cache", lambda: seen.append(len(alive)))
    monkeypatch.setitem(sys.modules, "chatgym.trainer.engines.hf", SimpleNamespace(TransformersEngine=Engine))
    from chatgym.trainer.engines import SamplingParams

    decode_bench.time_engine(None, None, "static all", [[1, 2]], [SamplingParams(max_tokens=8)], 1)
    decode_bench.time_engines_interleaved(None, None, ["static all", "static fp8+head all kv8"], [[1, 2]],
                                          [SamplingParams(max_tokens=8)], 1)
    assert seen == [0, 0]


def test_help_names_no_default_of_none(decode_bench, monkeypatch, capsys):
    """Regression (noticed in stop 65): --modes' help, which names its default, ended "(default: None)"."""
    monkeypatch.setattr(sys, "argv", ["hf_decode_gpu.py", "--help"])
    with pytest.raises(SystemExit):
        decode_bench.parse_args()
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in out and "(default: 3)" in out and "default: static, static compiled, static all" in out

