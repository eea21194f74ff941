"""build_engine names an engine.options key the backend does not take (it was a raw TypeError from the
engine's constructor, e.g. the main job's vLLM options with engine.backend=hf)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from chatgym.trainer.engines import build_engine


def test_an_option_the_backend_does_not_take_is_named():
    cfg = SimpleNamespace(backend="hf", options={"gpu_memory_utilization": 0.25, "kv_cache_gib": 2}, dtype="auto")
    with pytest.raises(ValueError) as err:
        build_engine(cfg, "unused", tokenizer=None, seed=0, max_model_len=512)
    message = str(err.value)
    assert message.startswith(
        "engine.options: 'gpu_memory_utilization', 'kv_cache_gib' not taken by the 'hf' engine (TransformersEngine); "
        "it takes ["
    )
    assert "'decode'" in message and "'max_batch_size'" in message
    # Fresh-user walk: engine.backend=hf over the main job's vLLM options; the way out is named.
    assert message.endswith(" (another backend's options? replace them: 'engine.options={}')")


def test_a_misspelt_vllm_option_is_named_before_the_engine_starts():
    # Regression: `engine.options={enforce_eagr: true}` was vLLM's raw TypeError
    # after the policy had loaded; VLLMEngine passes **kwargs on to EngineArgs, so nothing was checked.
    pytest.importorskip("vllm")
    from chatgym.trainer.config.loader import ConfigError

    cfg = SimpleNamespace(backend="vllm", options={"enforce_eagr": True, "max_num_seqs": 8}, dtype="auto")
    with pytest.raises(ConfigError) as err:
        build_engine(cfg, "unused", tokenizer=None, seed=0, max_model_len=512)
    assert str(err.value) == (
        "engine.options: 'enforce_eagr' not taken by the 'vllm' engine (VLLMEngine); "
        "did you mean 'enforce_eager' for 'enforce_eagr'? (another backend's options? replace them: "
        "'engine.options={}')"
    )


def test_an_hf_option_under_the_vllm_backend_names_the_hf_backend():
    # Regression (fresh-user walk): engine.options={decode: static} over the main job's vLLM engine got
    # "did you mean 'spec_model' for 'decode'?", and a misspelt option was told to see a Python method.
    pytest.importorskip("vllm")
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines import check_engine_options

    with pytest.raises(ConfigError) as err:
        check_engine_options("vllm", {"decode": "static", "multi_step": 2}, "--engine-arg")
    assert str(err.value) == ("--engine-arg: 'decode', 'multi_step' not taken by the 'vllm' engine (VLLMEngine); "
                              "they are the 'hf' engine's: set --engine hf")
    with pytest.raises(ConfigError) as err:
        check_engine_options("vllm", {"zzzqqq": 1}, "--engine-arg")
    assert str(err.value) == ("--engine-arg: 'zzzqqq' not taken by the 'vllm' engine (VLLMEngine); it takes ['dtype', "
                              "'enforce_eager', 'kv_cache_gib', 'max_model_len', 'seed', 'sleep_level'] and the fields "
                              "of vllm.EngineArgs (gpu_memory_utilization, ...)")


@pytest.mark.parametrize("share", [2, 0, -0.1, "half", True])
def test_a_gpu_memory_share_outside_0_1_is_refused_at_config_load(share):
    # Regression (fresh-user walk): gpu_memory_utilization=2 was vLLM's multi-line pydantic error after the
    # learner had loaded.
    pytest.importorskip("vllm")
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines import check_engine_options

    with pytest.raises(ConfigError) as err:
        check_engine_options("vllm", {"gpu_memory_utilization": share}, "engine.options")
    assert str(err.value) == ("engine.options: gpu_memory_utilization is the share of the GPU's memory (on a CPU, of "
                              f"the NUMA node's) vLLM may take, in (0, 1], got {share!r}")
    check_engine_options("vllm", {"gpu_memory_utilization": 0.3}, "engine.options")  # the GPU config's


def cli_with_engine_options(tmp_path, capsys, options: str) -> tuple[int, str, Path]:
    """``chatgym train`` of the main job's config on a tiny random policy with the hf engine and
    ``engine.options=<options>``: (exit status, last stderr line, the output dir asked for)."""
    import json

    from train_helpers import TINY_LLAMA

    from chatgym.trainer.train_cli import main

    config = str(Path(__file__).resolve().parent.parent / "examples" / "configs" / "math_grpo.yaml")
    out = tmp_path / "run"
    overrides = [
        "engine.backend=hf",
        f"engine.options={options}",
        "model.random_init=true",
        "model.config_overrides=" + json.dumps(TINY_LLAMA),
    ]
    status = main([config, "--output-dir", str(out), *overrides])
    return status, capsys.readouterr().err.strip().splitlines()[-1], out


def test_cli_names_a_bad_engine_option_in_one_line_and_leaves_no_output_dir(tmp_path, capsys):
    status, err, out = cli_with_engine_options(tmp_path, capsys, "{decod: static}")
    assert status == 2 and err == (
        "chatgym train: engine.options: 'decod' not taken by the 'hf' engine (TransformersEngine); "
        "did you mean 'decode' for 'decod'? (another backend's options? replace them: 'engine.options={}')"
    )
    assert not out.exists()


def test_cli_refuses_a_bad_decode_attention_override_in_one_line_naming_the_variable(tmp_path, capsys, monkeypatch):
    """Fresh-user walks: with the default fused step the bad value was refused only as the worker built
    the step (every episode failed, exit 0), then under ``engine.options:``, an option not set."""
    monkeypatch.setenv("CHATGYM_DECODE_ATTENTION", "flash")
    status, err, out = cli_with_engine_options(tmp_path, capsys, "{}")
    assert status == 2 and err == "chatgym train: CHATGYM_DECODE_ATTENTION must be one of ('sdpa', 'triton'), got 'flash'"
    assert not out.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("{fused_step: Compiled}", "fused_step must be true, false or 'compiled', got 'Compiled'"),
        ("{decode: dynamic, fused_step: compiled}", "fused_step 'compiled' needs decode 'static' (this engine decodes 'dynamic')"),
    ],
)
def test_cli_refuses_an_hf_option_value_at_start_up(tmp_path, capsys, options, message):
    # Regression (fresh-user walk): a bad fused_step was refused by the engine's constructor, after the
    # learner's and the engine's models had loaded ("engine: ..."); the start-up check names the field.
    status, err, out = cli_with_engine_options(tmp_path, capsys, options)
    assert (status, err) == (2, f"chatgym train: engine.options: {message}")
    assert not out.exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="decode 'auto' is static on CUDA")
@pytest.mark.parametrize("option", ["async_scheduling: true", "fused_step: compiled"])
def test_cli_refuses_a_static_only_option_under_auto_without_cuda_at_start_up(tmp_path, capsys, option):
    # Regression: async_scheduling with the CPU's dynamic decode was silently ignored, then refused by
    # the engine after the models loaded; decode 'auto' is known to be dynamic here at start-up
    # (fresh-user walk: "fused_step: compiled" alone failed 18 s in, with no hint at decode).
    name = option.split(":")[0]
    name = "fused_step 'compiled'" if name == "fused_step" else name
    status, err, out = cli_with_engine_options(tmp_path, capsys, f"{{{option}}}")
    assert (status, err) == (2, f"chatgym train: engine.options: {name} needs decode 'static' (this engine decodes "
                                "'dynamic'): decode 'auto' is dynamic without CUDA; set engine.options.decode=static")
    assert not out.exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="decode 'auto' is static on CUDA")
def test_the_hint_at_decode_is_written_the_way_its_setting_is_given():
    # Regression (fresh-user walk): the hint said "set decode: static", YAML, to a command-line user.
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines import check_engine_options

    with pytest.raises(ConfigError) as raised:
        check_engine_options("hf", {"async_scheduling": True}, "--engine-arg")
    assert str(raised.value) == ("--engine-arg: async_scheduling needs decode 'static' (this engine decodes 'dynamic'): "
                                 "decode 'auto' is dynamic without CUDA; set --engine-arg decode=static")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is there")
@pytest.mark.parametrize(("options", "message"), [
    ({"device": "cuda"}, "device 'cuda', but this machine has no CUDA GPU; leave device out (the engine takes CUDA "
                         "where there is one, else the CPU)"),
    ({"decode": "statik"}, "decode must be 'auto', 'static' or 'dynamic', got 'statik'"),
    ({"async_scheduling": "maybe"}, "async_scheduling must be true or false, got 'maybe'"),
])
def test_hf_values_the_engine_would_refuse_late_are_refused_at_config_load(options, message):
    # Regression (fresh-user walk): device=cuda on a CPU machine was a torch AssertionError traceback
    # after the learner loaded; decode=statik was refused only after both models loaded; and
    # async_scheduling=maybe trained as if true.
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines import check_engine_options

    with pytest.raises(ConfigError) as raised:
        check_engine_options("hf", options, "engine.options")
    assert str(raised.value) == f"engine.options: {message}"


def test_cli_names_a_value_the_engine_refuses_and_leaves_no_output_dir(tmp_path, capsys):
    # A ValueError of the engine's constructor (after the models loaded) is a one-line config error.
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        status, err, out = cli_with_engine_options(tmp_path, capsys, "{eos_token_ids: [-1]}")  # needs the vocabulary
        gc.collect()
    assert status == 2
    assert err == ("chatgym train: engine.options.eos_token_ids: eos_token_ids has ids outside the model's vocabulary "
                   "[0, 49152): [-1] (ids the model can never sample; [] means none)")
    assert not out.exists()
    # Regression (CI rehearsal): the failed Trainer left its event loop unclosed, and a later test's
    # check_env caught the ResourceWarning when the garbage collector found it.
    assert [str(w.message) for w in seen if "event loop" in str(w.message)] == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("{multi_step: 0}", "engine.options: multi_step must be an int >= 1, got 0"),
        ("{decode: dynamic, multi_step: 4}",
         "engine.options: multi_step 4 needs decode 'static' (this engine decodes 'dynamic')"),
    ],
)
def test_cli_refuses_a_multi_step_the_engine_cannot_run_before_any_model_loads(tmp_path, capsys, options, message):
    status, err, out = cli_with_engine_options(tmp_path, capsys, options)
    assert (status, err) == (2, f"chatgym train: {message}")
    assert not out.exists()


@pytest.mark.parametrize(
    ("options", "shown"),
    [("{batch_window_s: -1}", "batch_window_s must be a finite number of seconds >= 0, got -1"),
     ("{batch_window_s: abc}", "batch_window_s must be a finite number of seconds >= 0, got 'abc'"),
     ("{batch_quiet_s: .inf}", "batch_quiet_s must be a finite number of seconds >= 0, got inf"),
     ("{batch_window_s: .nan}", "batch_window_s must be a finite number of seconds >= 0, got nan"),
     ("{batch_quiet_s: true}", "batch_quiet_s must be a finite number of seconds >= 0, got True"),
     ("{max_batch_size: 0}", "max_batch_size must be an int >= 1, got 0")],
)
def test_cli_refuses_batching_values_before_any_model_loads(tmp_path, capsys, options, shown):
    # Regression (fresh-user walk): a string ended in a TypeError traceback, inf killed the worker with
    # an OverflowError mid-run, nan trained with the wait silently off, and -1 was refused only after
    # the learner's model had loaded.
    import chatgym.trainer.train as train_module

    loaded = []
    real = train_module.Trainer.__init__
    train_module.Trainer.__init__ = lambda self, *a, **k: (loaded.append(1), real(self, *a, **k))[1]
    try:
        status, err, out = cli_with_engine_options(tmp_path, capsys, options)
    finally:
        train_module.Trainer.__init__ = real
    assert (status, err) == (2, f"chatgym train: engine.options: {shown}")
    assert loaded == [] and not out.exists()
