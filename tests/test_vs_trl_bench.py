"""``benchmarks/vs_trl_gpu.py`` off the GPU: the model each ``--shape`` builds, the config of each ours*
run, ``--runs`` parsing, the report's ratio to TRL+vLLM on hand-made results, and ``ours_1off`` for
two steps on the CPU (a tiny model of the Qwen2.5 architecture; SmolLM2's real weights under ``-m slow``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch):
    module = _load("vs_trl_gpu")
    monkeypatch.setattr(module, "MODEL", {"shape": "smollm2", "path": "smollm2"})
    return module


# The published config.json values of Qwen/Qwen2.5-1.5B and Qwen/Qwen2.5-7B.
PUBLISHED = {
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}


@pytest.mark.parametrize("shape", sorted(PUBLISHED))
def test_shape_model_config_has_the_published_dims_and_the_tokenizers_ids(bench, shape):
    tokenizer = SimpleNamespace(bos_token_id=1, eos_token_id=2, pad_token_id=2)  # SmolLM2's ids
    config = bench.shape_model_config(shape, tokenizer)
    assert config.model_type == "qwen2"
    assert {k: getattr(config, k) for k in PUBLISHED[shape]} == PUBLISHED[shape]
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 2)


def test_qwen_1_5b_widths_agree_with_distributed_gpu_shape_table():
    from chatgym.trainer.config.run import load_config

    overrides = load_config(None, _load("distributed_gpu").SHAPES["qwen2.5-1.5b"]).model.config_overrides
    published = PUBLISHED["qwen2.5-1.5b"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
        assert overrides[key] == published[key], key


def test_shape_model_config_refuses_the_real_weights_shape(bench):
    with pytest.raises(KeyError, match="'smollm2': no random-weights model"):
        bench.shape_model_config("smollm2", SimpleNamespace(bos_token_id=1, eos_token_id=2, pad_token_id=2))


# Narrow layers (the depth and the vocabulary kept: a config checks its layer_types against the depth).
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    """The qwen2.5-1.5b shape with narrow layers, saved as the benchmark saves it."""
    bench = _load("vs_trl_gpu")
    return bench.save_random_model("qwen2.5-1.5b", tmp_path_factory.mktemp("qwen"), device="cpu", **TINY)


def test_save_random_model_writes_a_qwen2_with_smollm2s_tokenizer(tiny_qwen):
    from transformers import AutoConfig

    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.models.packaged import load_model

    config = AutoConfig.from_pretrained(tiny_qwen)
    assert (config.model_type, config.vocab_size, config.hidden_size, config.eos_token_id) == ("qwen2", 151936, 64, 2)
    assert len(get_tokenizer(tiny_qwen)) == 49152
    a, b = load_model(tiny_qwen), load_model(tiny_qwen)  # what ours and TRL each load
    assert a.config.name_or_path == str(tiny_qwen)
    assert all((a.state_dict()[k] == v).all() for k, v in b.state_dict().items())


def test_smollm2_shape_keeps_the_real_weights_config(bench):
    cfg = bench.our_config(0, 30, Path("/tmp/x"), **bench.OUR_RUNS["ours"])
    assert (cfg.model.path, cfg.model.dtype, cfg.env.eval_tasks) == ("smollm2", "float32", 64)
    assert (cfg.engine.backend, cfg.engine.options, cfg.trainer.pipeline) == ("hf", {"decode": "static"}, "sync")


@pytest.mark.parametrize(("shape", "dtype"), [("qwen2.5-1.5b", "float32"), ("qwen2.5-7b", "bfloat16")])
def test_qwen_shapes_load_the_saved_model_without_evaluation(bench, shape, dtype):
    bench.MODEL.update(shape=shape, path="/models/random")
    cfg = bench.our_config(0, 30, Path("/tmp/x"), **bench.OUR_RUNS["ours"])
    assert (cfg.model.path, cfg.model.random_init, cfg.model.dtype) == ("/models/random", False, dtype)
    assert cfg.env.eval_tasks == 0


def test_ours_vllm_and_ours_1off_configs(bench):
    vllm = bench.our_config(0, 30, Path("/tmp/x"), **bench.OUR_RUNS["ours_vllm"])
    assert (vllm.engine.backend, vllm.engine.dtype) == ("vllm", "bfloat16")
    assert vllm.engine.options == {"gpu_memory_utilization": 0.3}
    assert vllm.trainer.pipeline == "sync"
    # FP8 is refused at config load without an FP8 GPU: the overrides, as our_config passes them
    assert bench.engine_overrides("vllm_kv8", "fp8") == [
        "engine.backend=vllm", "engine.dtype=bfloat16",
        "engine.options={gpu_memory_utilization: 0.3, kv_cache_dtype: fp8, quantization: fp8}"]  # fmt: skip
    assert bench.OUR_RUNS["ours_vllm_fp8kv"] == {"engine": "vllm_kv8", "quantization": "fp8"}
    # issue 31's accuracy pair: the same run as ours_px_pc_nc, sampling from FP8 weights
    assert bench.OUR_RUNS["ours_px_pc_nc_fp8"] == {**bench.OUR_RUNS["ours_px_pc_nc"], "quantization": "fp8"}
    assert "engine.options.quantization=fp8" in bench.engine_overrides("async_c_px_pc", "fp8")
    assert bench.engine_overrides(**bench.OUR_RUNS["ours_vllm_fp8"])[-1] == (
        "engine.options={gpu_memory_utilization: 0.3, quantization: fp8}")
    off = bench.our_config(0, 30, Path("/tmp/x"), **bench.OUR_RUNS["ours_1off"])
    assert (off.trainer.pipeline, off.engine.backend, off.engine.options) == ("one_step_off", "hf", {"decode": "static"})
    assert not off.model.compile
    compiled = bench.our_config(0, 30, Path("/tmp/x"), **bench.OUR_RUNS["ours_compile"])
    assert (compiled.model.compile, compiled.trainer.pipeline, compiled.engine.options) == (True, "sync", {"decode": "static"})
    fused_c = bench.our_config(0, 30, Path("/tmp/x"), **bench.OUR_RUNS["ours_c_compile"])
    assert (fused_c.model.compile, fused_c.engine.options) == (True, {"decode": "static", "fused_step": "compiled"})
    every = bench.our_config(0, 30, Path("/tmp/x"), **bench.OUR_RUNS["ours_all"])
    assert (every.model.compile, every.engine.options) == (
        True, {"decode": "static", "fused_step": "compiled", "async_scheduling": True}
    )
    both = bench.our_config(0, 30, Path("/tmp/x"), **bench.OUR_RUNS["ours_1off_compile"])
    assert (both.model.compile, both.trainer.pipeline, both.engine.options) == (
        True, "one_step_off", {"decode": "static"}
    )
    run = {k: v for k, v in bench.OUR_RUNS["ours_1off_px_gil_ms4_pc"].items() if k != "switch_ms"}  # set by the run
    pc = bench.our_config(0, 30, Path("/tmp/x"), **run)
    assert (pc.trainer.pipeline, pc.engine.options) == ("one_step_off", {
        "decode": "static", "fused_step": "compiled", "async_scheduling": True, "sampler": "philox", "multi_step": 4,
        "precapture": True})
    # Checkpointing is on by default for the CUDA runs; an _nc run is without it whatever --checkpointing says.
    assert (pc.model.gradient_checkpointing, pc.train.share_prompt_prefix) == (True, True)
    bench.UPDATE["checkpointing"] = True
    try:
        on = bench.our_config(0, 30, Path("/tmp/x"), **run)
        run_nc = {k: v for k, v in bench.OUR_RUNS["ours_1off_px_gil_ms4_pc_nc"].items() if k != "switch_ms"}
        nc = bench.our_config(0, 30, Path("/tmp/x"), **run_nc)
    finally:
        bench.UPDATE["checkpointing"] = None
    assert (on.model.gradient_checkpointing, on.train.share_prompt_prefix) == (True, True)
    assert (nc.model.gradient_checkpointing, nc.train.share_prompt_prefix) == (False, False)
    assert (nc.trainer.pipeline, nc.engine.options) == (pc.trainer.pipeline, pc.engine.options)


@pytest.mark.parametrize(
    ("spec", "parsed"), [("ours_vllm:1", ("ours_vllm", 1)), ("ours_1off:0", ("ours_1off", 0)),
                         ("trl_vllm_fp32:12", ("trl_vllm_fp32", 12)), ("ours:4294967295", ("ours", 4294967295))]
)
def test_parse_run(bench, spec, parsed):
    assert bench.parse_run(spec) == parsed


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ours_1off", "--runs: 'ours_1off' is not NAME:SEED"),
        ("ours_vllm:x", "--runs: 'ours_vllm:x' is not NAME:SEED"),
        ("ours_2off:0", "--runs: unknown run 'ours_2off' in 'ours_2off:0'; choose from ours, "),
        # Regression (fresh-user walk): passed the parser, refused by train.seed only as the run's config loaded
        ("ours:4294967296", "--runs: the seed of 'ours:4294967296' must be in [0, 4294967295] (2**32 - 1)"),
    ],
)
def test_parse_run_refuses(bench, spec, message):
    with pytest.raises(SystemExit) as err:
        bench.parse_run(spec)
    assert str(err.value).startswith(message)


def test_fp32_trl_refused_at_7b(bench):
    with pytest.raises(SystemExit, match=r"--shape qwen2.5-7b: trl_fp32, trl_vllm_fp32 do not fit"):
        bench.check_runs([("trl_vllm_fp32", 0), ("ours", 0), ("trl_fp32", 1)], "qwen2.5-7b")


def _result(walls: list[float], shape: str, after_eval: int | None = None) -> dict:
    """A run's JSON: the first step a warm-up of 9 s, 8,192 tokens generated in 0.5 s every step."""
    steps = [{"wall_s": w, "gen_s": 0.5, "update_s": w - 0.5, "gen_tokens": 8192} for w in [9.0, *walls]]
    if after_eval is not None:
        steps[after_eval]["after_eval"] = True
    return {"steps": steps, "curve": [(0.0, None), (sum(walls) + 9.0, None)], "peak_gib": 10.0, "shape": shape}


def _write(folder: Path, runs: dict[str, dict]) -> None:
    for name, result in runs.items():
        (folder / f"{name}.json").write_text(json.dumps(result))


def test_report_ratio_to_the_faster_trl_vllm_run(bench, tmp_path, capsys):
    shape = "qwen2.5-1.5b"
    _write(
        tmp_path,
        {
            "ours_0": _result([1.0, 1.2, 1.1], shape),  # median 1.1
            "ours_1": _result([0.9, 0.9, 1.3], shape),  # median 0.9 -> mean 1.0
            "ours_1off_0": _result([0.8, 0.1, 0.6], shape, after_eval=2),  # 0.1 left out: median 0.7
            "trl_vllm_bf16_0": _result([2.0, 2.2, 2.1], shape),  # 2.1
            "trl_vllm_bf16_1": _result([2.5, 2.5, 2.5], shape),  # 2.5 -> mean 2.3: the faster
            "trl_vllm_fp32_0": _result([3.0, 3.0, 3.0], shape),
            "trl_bf16_0": _result([1.5, 1.5, 1.5], shape),  # faster, but no vLLM: not the anchor
        },
    )
    bench.report(tmp_path)
    out = capsys.readouterr().out
    assert out.startswith(f"chatgym vs TRL, shape qwen2.5-1.5b ({tmp_path})\n")
    # 2.3 / 1.0 and 2.3 / 0.7
    assert "against the faster TRL+vLLM run, trl_vllm_bf16 (2.300 s/step), its s/step / ours:" in out
    assert "\nours               2.30x\nours_1off          3.29x\n" in out
    assert "no held-out accuracy at shape qwen2.5-1.5b (random weights): no accuracy_vs_wallclock.png" in out
    assert not (tmp_path / "accuracy_vs_wallclock.png").exists()
    groups = {"ours": [bench.summarize("ours_0", json.loads((tmp_path / "ours_0.json").read_text()))]}
    groups["trl_vllm_fp32"] = [bench.summarize("trl_vllm_fp32_0", _result([3.0, 3.0, 3.0], shape))]
    anchor, ratios = bench.speedups(groups)
    assert anchor == "trl_vllm_fp32" and ratios == {"ours": pytest.approx(3.0 / 1.1)}


def test_summarize_tokens_per_second_of_generation_and_of_step(bench):
    row = bench.summarize("ours_0", _result([1.0, 1.2, 1.1], "qwen2.5-7b"))
    assert row["gen_tok_s"] == pytest.approx(8192 / 0.5)
    assert row["step_tok_s"] == pytest.approx(8192 / 1.1)  # the median step's
    assert (row["shape"], row["acc_before"], row["acc_after"]) == ("qwen2.5-7b", None, None)


def test_report_refuses_mixed_shapes_and_reads_old_jsons_as_smollm2(bench, tmp_path):
    old = _result([1.0], "smollm2")
    del old["shape"]
    _write(tmp_path, {"ours_0": old, "ours_1": _result([1.0], "qwen2.5-7b")})
    with pytest.raises(SystemExit, match=r"runs of several shapes \(qwen2.5-7b, smollm2\); one folder per shape"):
        bench.report(tmp_path)


def test_report_at_smollm2_prints_accuracy_and_draws_the_plot(bench, tmp_path, capsys):
    run = _result([1.0, 1.0, 1.0], "smollm2")
    run["curve"] = [(0.0, 0.25), (2.0, 0.5), (12.0, 0.75)]
    _write(tmp_path, {"ours_0": run})
    bench.report(tmp_path)
    out = capsys.readouterr().out.splitlines()
    # s/step, gen s, upd s, gen tok/s, step tok/s, peak, acc before / after / at the shortest run's 12 s
    assert out[2].split() == ["ours_0", "1.000", "0.500", "0.500", "16,384", "8,192", "10.00", "0.2500", "0.7500", "0.7500"]
    assert (tmp_path / "accuracy_vs_wallclock.png").stat().st_size > 0


def _usage_error(bench, capsys, argv: list[str]) -> str:
    """The one-line refusal of ``main(argv)``, after checking that it is the parser's: status 2, the
    usage, then ``vs_trl_gpu.py: error: ...`` (the message returned without that prefix)."""
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: vs_trl_gpu.py ") and err.endswith("\n")
    last = err.splitlines()[-1]
    assert last.startswith("vs_trl_gpu.py: error: ")
    return last.removeprefix("vs_trl_gpu.py: error: ")


def test_main_checks_runs_before_anything_runs(bench, capsys):
    # Regression (fresh-user walk): these were SystemExit(str), status 1 with no "vs_trl_gpu.py: error:".
    assert _usage_error(bench, capsys, ["--runs", "ours_1off", "--shape", "qwen2.5-1.5b"]) == (
        "--runs: 'ours_1off' is not NAME:SEED (e.g. ours:0)"
    )
    assert _usage_error(bench, capsys, ["--runs", "ours_vllm:0", "trl_vllm_fp32:0", "--shape", "qwen2.5-7b"]) == (
        "--shape qwen2.5-7b: trl_vllm_fp32 does not fit (fp32 weights + AdamW: 122 GB); run the *_bf16 ones"
    )
    # The default runs: ours' fastest synchronous run and TRL with its colocated vLLM, bf16 and fp32
    # masters (the anchor is the faster of the two), two seeds each.
    assert bench.build_parser().get_default("runs") == [
        "ours_px_pc_nc:0", "ours_px_pc_nc:1", "trl_vllm_bf16:0", "trl_vllm_bf16:1", "trl_vllm_fp32:0", "trl_vllm_fp32:1",
    ]


def test_out_folder_of_another_shape_refused(bench, tmp_path):
    _write(tmp_path, {"ours_0": _result([1.0], "qwen2.5-7b")})
    bench.check_out(tmp_path, "qwen2.5-7b")  # the same shape: more runs of it
    with pytest.raises(SystemExit, match=r"holds runs of shape qwen2.5-7b, not smollm2; one folder per shape"):
        bench.check_out(tmp_path, "smollm2")


def test_speedups_none_without_a_trl_vllm_run(bench):
    row = bench.summarize("ours_0", _result([1.0], "smollm2"))
    assert bench.speedups({"ours": [row], "trl_bf16": [row]}) is None
    assert bench.speedups({"trl_vllm_bf16": [row]}) is None  # no ours* run: nothing to compare


def test_main_refuses_zero_steps_and_zero_eval_every(bench, capsys):
    assert _usage_error(bench, capsys, ["--runs", "ours:0", "--steps", "0"]) == "--steps must be >= 1, got 0"
    assert _usage_error(bench, capsys, ["--runs", "ours:0", "--eval-every", "0"]) == "--eval-every must be >= 1, got 0"


def test_report_skips_files_that_are_not_runs(bench, tmp_path, capsys):
    # Regression: another JSON in the folder was a KeyError, a malformed one a JSONDecodeError, a run
    # with no steps a StatisticsError.
    _write(tmp_path, {"ours_0": _result([1.0, 1.0], "qwen2.5-7b"), "notes": {"comment": "x"},
                      "empty_0": {"steps": [], "curve": [], "peak_gib": 0.0}})  # fmt: skip
    (tmp_path / "broken.json").write_text("{")
    bench.report(tmp_path)
    out = capsys.readouterr().out
    assert "skipped broken.json: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))" in out
    assert "skipped empty_0.json: not a run of this script, or a run with no steps" in out
    assert "skipped notes.json: not a run of this script, or a run with no steps" in out
    assert "\nours_0 " in out


def test_summarize_without_timed_generation_gives_nan_tokens_per_second(bench):
    result = _result([1.0], "smollm2")
    for step in result["steps"]:
        step["gen_s"] = 0.0
    assert math.isnan(bench.summarize("ours_0", result)["gen_tok_s"])


def _one_step_off(bench, monkeypatch, path: str, shape: str) -> dict:
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "PROMPTS", 2)
    monkeypatch.setattr(bench, "GROUP", 2)
    monkeypatch.setattr(bench, "NEW_TOKENS", 16)
    monkeypatch.setattr(bench, "EVAL_TASKS", 2)
    bench.MODEL.update(shape=shape, path=path)
    return bench.run_ours(0, 2, 1, options={"no_plot": True}, **bench.OUR_RUNS["ours_1off"])


def _check_one_step_off(result: dict) -> None:
    steps = result["steps"]
    # Step 2 trains on the rollout that ran during step 1's update: one weight version behind.
    assert [s["staleness"] for s in steps] == [0.0, 1.0]
    assert [s.get("after_eval", False) for s in steps] == [False, True]  # evaluated after step 1
    walls = [s["wall_s"] for s in steps]
    assert [t for t, _ in result["curve"]] == [0.0, walls[0], walls[0] + walls[1]]


def test_ours_1off_two_steps_on_cpu_at_a_tiny_qwen_shape(bench, monkeypatch, tiny_qwen):
    result = _one_step_off(bench, monkeypatch, str(tiny_qwen), "qwen2.5-1.5b")
    _check_one_step_off(result)
    assert [acc for _, acc in result["curve"]] == [None, None, None]  # random weights: not evaluated
    # 2 prompts x 2 samples x 16 tokens: random weights end a reply on EOS with odds 1 / 151,936 a token
    assert [s["gen_tokens"] for s in result["steps"]] == [pytest.approx(64), pytest.approx(64)]
    assert [s["decode_steps"] for s in result["steps"]] == [16, 16]  # every reply the full 16 tokens


@pytest.mark.slow
def test_ours_1off_two_steps_on_cpu_with_smollm2(bench, monkeypatch):
    """~25 s on 2 cores (measured): SmolLM2's real weights, two held-out tasks evaluated."""
    result = _one_step_off(bench, monkeypatch, "smollm2", "smollm2")
    _check_one_step_off(result)
    assert all(acc in (0.0, 0.5, 1.0) for _, acc in result["curve"])


def test_child_command_is_the_parents_argv_plus_the_childs_flags(bench):
    argv = ["--shape", "qwen2.5-1.5b", "--runs", "ours:0", "trl_vllm_bf16:0", "--steps", "10"]
    script = str(BENCHMARKS / "vs_trl_gpu.py")
    assert bench.child_command(argv, only="trl_vllm_bf16:0", model_dir="/tmp/m") == [
        sys.executable, script, *argv, "--child-run", "trl_vllm_bf16:0", "--child-model-dir", "/tmp/m"
    ]
    assert bench.child_command(argv, save_model="/tmp/m") == [sys.executable, script, *argv, "--child-save-model", "/tmp/m"]


def test_run_isolated_runs_every_command_in_its_own_process_whatever_the_others_did(bench, tmp_path):
    # Regression: all runs shared one process; the fifth of an H200 lease ran out of memory in what the
    # others left, and a failure ended the runs after it. Real processes: one fails, each records its pid.
    def cmd(code: str, spec: str) -> tuple[str, list[str]]:
        return spec, [sys.executable, "-c", f"import os, sys; open({str(tmp_path / spec)!r}, 'w').write(str(os.getpid())); {code}"]

    failed = bench.run_isolated([cmd("sys.exit(3)", "a"), cmd("pass", "b"), cmd("raise MemoryError", "c"), cmd("", "d")])
    assert failed == ["a (rc 3)", "c (rc 1)"]
    pids = {(tmp_path / spec).read_text() for spec in "abcd"}
    assert len(pids) == 4 and str(os.getpid()) not in pids


def test_main_runs_each_run_in_a_child_and_exits_non_zero_naming_the_failed_ones(bench, monkeypatch, tmp_path, capsys):
    import torch

    # The children are real processes in run_isolated (test above); here: what main asks of them.
    calls = []

    def fake_run_isolated(commands, timeout=None):
        calls.extend(commands)
        _write(tmp_path, {"ours_0": _result([1.0], "smollm2")})  # the child that ended wrote its JSON
        return ["trl_vllm_bf16:0 (rc 1)"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "run_isolated", fake_run_isolated)
    # An earlier invocation's result of the run that fails now: not reported as this one's.
    _write(tmp_path, {"trl_vllm_bf16_0": _result([0.5], "smollm2")})
    argv = ["--runs", "ours:0", "trl_vllm_bf16:0", "--out", str(tmp_path)]
    monkeypatch.setattr(bench, "check_installed", lambda runs: None)  # TRL is not installed here
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 1
    assert calls == [(spec, bench.child_command(argv, only=spec)) for spec in ("ours:0", "trl_vllm_bf16:0")]
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"vs_trl_gpu.py: removed {tmp_path / 'trl_vllm_bf16_0.json'} (an earlier invocation's trl_vllm_bf16:0; run again now)"
    assert lines[3].split()[0] == "ours_0" and lines[4] == ""  # the report: the run that ended, alone
    assert not (tmp_path / "trl_vllm_bf16_0.json").exists()
    assert err.strip() == "vs_trl_gpu.py: runs that failed (their output is above): trl_vllm_bf16:0 (rc 1)"


def test_main_at_a_qwen_shape_has_a_child_save_the_weights_every_run_loads_then_removes_them(bench, monkeypatch, tmp_path):
    import torch

    calls = []

    def fake_run_isolated(commands, timeout=None):
        calls.extend(commands)
        _write(tmp_path, {"ours_0": _result([1.0], "qwen2.5-1.5b")})
        return []

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "run_isolated", fake_run_isolated)
    argv = ["--shape", "qwen2.5-1.5b", "--runs", "ours:0", "--out", str(tmp_path)]
    bench.main(argv)
    (save_spec, save_cmd), (run_spec, run_cmd) = calls
    workdir = save_cmd[save_cmd.index("--child-save-model") + 1]
    assert (save_spec, run_spec) == ("--save-model", "ours:0")
    assert save_cmd == bench.child_command(argv, save_model=workdir)
    assert run_cmd == bench.child_command(argv, only="ours:0", model_dir=workdir)
    assert not Path(workdir).exists()


def test_main_refuses_no_runs_and_a_run_given_twice(bench, capsys):
    assert _usage_error(bench, capsys, ["--runs", "--out", "/tmp/never"]) == (
        "--runs: give at least one NAME:SEED (e.g. ours:0)"
    )
    assert _usage_error(bench, capsys, ["--runs", "ours:0", "ours_1off:1", "ours:00"]) == (
        "--runs: ours:0 given more than once"
    )


def test_a_user_flag_abbreviation_does_not_reach_the_childs_flags(bench, capsys):
    # Regression: the child's --only / --model-dir made --o ambiguous (it had meant --out) and --mo
    # set the model directory of every run.
    assert _usage_error(bench, capsys, ["--runs", "ours:0", "--mo", "/x"]) == "unrecognized arguments: --mo /x"
    # --o is --out again
    assert _usage_error(bench, capsys, ["--runs", "ours:0", "--o", "/tmp/never", "--steps", "0"]) == (
        "--steps must be >= 1, got 0"
    )


def test_parse_run_refuses_a_seed_of_non_ascii_digits(bench):
    # Regression: "²" passed str.isdigit and int() raised a ValueError traceback.
    with pytest.raises(SystemExit, match=r"^--runs: 'ours:²' is not NAME:SEED \(e.g. ours:0\)$"):
        bench.parse_run("ours:²")


def test_check_out_skips_files_that_are_not_run_jsons(bench, tmp_path):
    # Regression: a *.json that is not JSON was a JSONDecodeError traceback here (report skips it).
    (tmp_path / "notes.json").write_text("not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    _write(tmp_path, {"ours_0": _result([1.0], "smollm2")})
    bench.check_out(tmp_path, "smollm2")
    with pytest.raises(SystemExit, match=r"holds runs of shape smollm2, not qwen2\.5-7b"):
        bench.check_out(tmp_path, "qwen2.5-7b")


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (this container's init may not reap orphans)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_run_isolated_ends_a_run_past_its_timeout_and_what_any_run_left_behind(bench, tmp_path):
    # A run's process group is ended whole: at the timeout (the run and its grandchild), and after a
    # run that exits leaving a grandchild (vLLM's engine core would hold the GPU for the next run).
    def leaves_a_sleeper(spec: str, then: str) -> tuple[str, list[str]]:
        pidfile = tmp_path / f"{spec}.pid"
        code = (
            "import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); {then}"
        )
        return spec, [sys.executable, "-c", code]

    t0 = time.monotonic()
    failed = bench.run_isolated([leaves_a_sleeper("hangs", "time.sleep(120)"), leaves_a_sleeper("exits", "pass")], timeout=3)
    assert failed == ["hangs (timed out after 3 s)"]
    assert time.monotonic() - t0 < 60  # not the 120 s the sleepers asked for
    for spec in ("hangs", "exits"):  # SIGKILL is delivered asynchronously: allow it a moment
        pid = int((tmp_path / f"{spec}.pid").read_text())
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), spec


def test_ms_per_decode_step_takes_the_reply_lengths_out(bench, tmp_path, capsys):
    # gen 0.5 s a step; longest replies 125, 100, 128 after the warm-up step (left out):
    # 500/125 = 4.0, 500/100 = 5.0, 500/128 = 3.90625 ms -> median 4.0.
    result = _result([1.0, 1.0, 1.0], "qwen2.5-1.5b")
    for step, longest in zip(result["steps"], [90, 125, 100, 128], strict=True):
        step["decode_steps"] = longest
    assert bench.summarize("ours_0", result)["ms_per_decode_step"] == pytest.approx(4.0)
    assert bench.summarize("trl_vllm_bf16_0", _result([1.0], "qwen2.5-1.5b"))["ms_per_decode_step"] is None
    _write(tmp_path, {"ours_0": result, "trl_vllm_bf16_0": _result([1.0], "qwen2.5-1.5b")})
    bench.report(tmp_path)
    out = capsys.readouterr().out.splitlines()
    at = out.index("generation ms per decode step (generation s / the step's longest reply, median):")
    assert out[at + 1].split() == ["ours_0", "4.000"]
    assert not out[at + 2].startswith("trl_vllm_bf16_0")  # only the run that recorded it


def test_main_without_cuda_says_so_before_asking_for_trl(bench, tmp_path):
    # Regression (fresh-user walk): without CUDA the first refusal was "the trl_* runs need TRL: pip
    # install ...", which would not have made the script run. Real: this machine has no CUDA, no TRL.
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the refusal is of a machine without it")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--runs", "ours:0", "trl_vllm_bf16:0", "--out", str(tmp_path / "out")])
    assert exc.value.code == "vs_trl_gpu.py: needs CUDA (torch.cuda.is_available() is False)"
    assert not (tmp_path / "out").exists()


def test_missing_trl_and_vllm_are_named(bench, monkeypatch):
    import importlib.util as util

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name in ("trl", "vllm") else real(name, *a))
    with pytest.raises(SystemExit) as exc:
        bench.check_installed([("ours", 0), ("trl_bf16", 0)])
    assert exc.value.code == "vs_trl_gpu.py: the trl_* runs need TRL: pip install trl==1.16.0 datasets"
    with pytest.raises(SystemExit) as exc:
        bench.check_installed([("ours_vllm", 0), ("ours", 1)])
    assert exc.value.code == "vs_trl_gpu.py: ours_vllm need vLLM on CUDA: pip install vllm"
    with pytest.raises(SystemExit) as exc:
        bench.check_installed([("ours_vllm_fp8kv", 0), ("ours_vllm_fp8", 1), ("ours", 0)])
    assert exc.value.code == "vs_trl_gpu.py: ours_vllm_fp8, ours_vllm_fp8kv need vLLM on CUDA: pip install vllm"
    bench.check_installed([("ours", 0), ("ours_1off", 1)])  # neither needed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--correction", "tis"], "argument --correction: invalid choice: 'tis' (choose from 'token_tis', "
                                  "'seq_tis', 'token_mask', 'seq_mask', 'geo_mask')"),
        (["--mask-band", "2", "0.5"], "--mask-band must be LO HI with 0 < LO <= 1 <= HI, got 2 0.5"),
        (["--mask-band", "0", "2"], "--mask-band must be LO HI with 0 < LO <= 1 <= HI, got 0 2"),
        (["--mask-band", "1.5", "2"], "--mask-band must be LO HI with 0 < LO <= 1 <= HI, got 1.5 2"),
        (["--mask-band", "nan", "2"], "--mask-band must be LO HI with 0 < LO <= 1 <= HI, got nan 2"),
        (["--mask-band", "0.5"], "argument --mask-band: expected 2 arguments"),
        (["--run-timeout", "0"], "--run-timeout must be > 0 seconds, got 0"),
        (["--run-timeout", "-30"], "--run-timeout must be > 0 seconds, got -30"),
        (["--run-timeout", "nan"], "--run-timeout must be > 0 seconds, got nan"),
        (["--pack-max-tokens", "0"], "--pack-max-tokens must be >= 1, got 0"),
        (["--pack-max-tokens", "-4"], "--pack-max-tokens must be >= 1, got -4"),
    ],
)
def test_correction_mask_band_and_run_timeout_are_checked_by_the_parser(bench, capsys, argv, message):
    # Regression (fresh-user walk): none was checked; a bad one failed in each run's child, minutes in
    # (the correction and band in the trainer's config, the timeout as subprocess' own error).
    assert _usage_error(bench, capsys, ["--runs", "ours:0", *argv]) == message


def test_correction_choices_are_the_trainers(bench):
    from chatgym.trainer.algos.correction import ROLLOUT_CORRECTIONS

    action = next(a for a in bench.build_parser()._actions if a.dest == "correction")
    assert tuple(action.choices) == ROLLOUT_CORRECTIONS


def test_out_of_another_shape_and_an_empty_report_are_usage_errors(bench, capsys, tmp_path):
    # Checked before CUDA (absent here): a flag's refusal, not "needs CUDA".
    _write(tmp_path, {"ours_0": _result([1.0], "qwen2.5-7b")})
    assert _usage_error(bench, capsys, ["--runs", "ours:0", "--out", str(tmp_path)]) == (
        f"--out {tmp_path}: holds runs of shape qwen2.5-7b, not smollm2; one folder per shape"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _usage_error(bench, capsys, ["--report", str(empty)]) == f"no results in {empty}"


def test_help_names_each_default_once(bench, monkeypatch):
    # Regression (fresh-user walk): --checkpointing and --in-process read "(default: ...) (default: ...)":
    # their help text said it, and ArgumentDefaultsHelpFormatter added it again.
    monkeypatch.setenv("COLUMNS", "100")
    parser = bench.build_parser()
    text = " ".join(parser.format_help().split())
    assert ("--checkpointing {on,off} ours' gradient checkpointing, the runs ending _nc aside (always off); "
            "None: on on CUDA (default: None)") in text
    assert "--in-process every run in this one process, not a process a run (default: False)" in text
    shown = [a for a in parser._actions if a.help is not argparse.SUPPRESS and a.default is not argparse.SUPPRESS]
    assert text.count("(default:") == len(shown)


@pytest.mark.parametrize(("share_prefix", "shared"), [("default", {False: True, True: False}), ("off", {False: False, True: False})])
def test_update_checkpointing_share_prefix_off_leaves_checkpointing_the_only_difference(tmp_path, share_prefix, shared):
    # The learner shares the prompt prefix only without checkpointing (padded layout), so by default the
    # two runs differ in that too; --share-prefix off turns it off in both (the 2026-12-06 lease's
    # update_ckpt compared sharing-without-checkpointing against neither).
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.learner.learner import Learner

    bench = _load("update_checkpointing_gpu")
    got = {}
    for checkpointing in (False, True):
        cfg = load_config(None, bench.overrides(tmp_path, 5, checkpointing, 64, share_prefix))
        assert cfg.model.gradient_checkpointing is checkpointing and cfg.train.micro_batch_size == 64
        got[checkpointing] = Learner.share_prefix.fget(SimpleNamespace(cfg=cfg, pack=False))
    assert got == shared
    with pytest.raises(SystemExit) as exc:
        bench.main(["--share-prefix", "on"])
    assert exc.value.code == 2


def test_update_checkpointing_refuses_bad_sizes_and_says_it_needs_cuda(capsys):
    # Regression (second walk): --micro 0 was the config's traceback and no CUDA a 24-line one.
    bench = _load("update_checkpointing_gpu")
    for argv, message in ((["--micro", "0"], "--micro must be >= 1, got 0"), (["--steps", "-1"], "--steps must be >= 1, got -1")):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        assert exc.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"update_checkpointing_gpu.py: error: {message}"
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exc:
            bench.main([])
        assert exc.value.code == "update_checkpointing_gpu.py: needs CUDA (torch.cuda.is_available() is False)"
