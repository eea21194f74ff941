"""engine.backend: auto — the measured rule, the start-up option check, and a real build."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from chatgym.trainer.config.loader import ConfigError
from chatgym.trainer.config.run import EngineConfig
from chatgym.trainer.engines import auto, build_engine, check_options


def _checkpoint(tmp_path, shapes):
    for i, group in enumerate(shapes):
        save_file({f"w{i}_{j}": torch.zeros(s) for j, s in enumerate(group)}, str(tmp_path / f"part{i}.safetensors"))
    return tmp_path


def test_checkpoint_parameters_counts_every_file_from_the_headers(tmp_path):
    path = _checkpoint(tmp_path, [[(3, 4), (5,)], [(2, 2, 2)]])
    assert auto.checkpoint_parameters(path) == 3 * 4 + 5 + 8  # 25
    assert auto.checkpoint_parameters(tmp_path / "nothing") is None


def test_checkpoint_parameters_of_smollm2_equal_the_loaded_models():
    from chatgym.trainer.models.packaged import load_model, load_model_path

    model = load_model("smollm2", dtype="float32", device="cpu")
    # The tied LM head is stored once in the checkpoint and counted once by parameters().
    assert auto.checkpoint_parameters(load_model_path("smollm2")) == sum(p.numel() for p in model.parameters())


def test_the_rule_picks_by_machine_and_size(tmp_path, monkeypatch):
    path = _checkpoint(tmp_path, [[(10, 10)]])  # 100 parameters
    assert auto.choose_backend(path, cuda=False, vllm=True)[0] == "vllm"
    assert auto.choose_backend(path, cuda=False, vllm=False)[0] == "hf"
    assert auto.choose_backend(path, cuda=True, vllm=False)[0] == "hf"
    backend, why = auto.choose_backend(path, cuda=True, vllm=True)
    assert (backend, why.split(" (")[0]) == ("hf", "CUDA, 100 parameters <= 3e+09")
    monkeypatch.setattr(auto, "AUTO_VLLM_ABOVE", 99)
    assert auto.choose_backend(path, cuda=True, vllm=True)[0] == "vllm"
    monkeypatch.setattr(auto, "AUTO_VLLM_ABOVE", 100)  # at the bound: hf
    assert auto.choose_backend(path, cuda=True, vllm=True)[0] == "hf"
    assert auto.choose_backend(tmp_path / "empty", cuda=True, vllm=True)[0] == "hf"
    assert auto.candidates(cuda=True, vllm=True) == ["hf", "vllm"]
    assert auto.candidates(cuda=False, vllm=True) == ["vllm"]
    assert auto.candidates(cuda=True, vllm=False) == ["hf"]
    assert auto.auto_options("vllm", cuda=True) == {"gpu_memory_utilization": 0.3}
    assert auto.auto_options("vllm", cuda=False) == auto.auto_options("hf", cuda=True) == {}


def test_auto_options_must_suit_every_engine_it_may_pick(monkeypatch):
    monkeypatch.setattr(auto, "has_cuda", lambda: True)
    monkeypatch.setattr(auto, "has_vllm", lambda: True)
    check_options(EngineConfig(backend="auto", options={"quantization": "fp8"}))  # both take it
    with pytest.raises(ConfigError, match=r"'decode' not taken by the 'vllm' engine .* may pick any of \['hf', 'vllm'\]"):
        check_options(EngineConfig(backend="auto", options={"decode": "static"}))
    monkeypatch.setattr(auto, "has_vllm", lambda: False)  # hf is the only pick: its options are fine
    check_options(EngineConfig(backend="auto", options={"decode": "static"}))


def test_build_with_auto_builds_the_pick_and_logs_why(monkeypatch, capfd):
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines.hf import TransformersEngine
    from chatgym.trainer.models.packaged import load_model_path

    monkeypatch.setattr(auto, "has_vllm", lambda: False)  # no CUDA here either: the rule says hf
    engine = build_engine(
        EngineConfig(backend="auto", dtype="float32"), load_model_path("smollm2"), get_tokenizer("smollm2"), 0, 256
    )
    assert isinstance(engine, TransformersEngine)
    assert "chatgym: engine.backend auto -> hf (no CUDA, vLLM not installed)" in capfd.readouterr().err


def test_an_unknown_backend_names_auto_among_the_choices():
    with pytest.raises(ValueError, match=r"engine.backend: unknown 'vlm'; choose auto or one of \["):
        EngineConfig(backend="vlm")


def test_the_gpu_main_job_config_suits_either_pick_and_has_no_cpu_only_option(monkeypatch):
    from pathlib import Path

    from chatgym.trainer.config.run import load_config

    cfg = load_config(Path(__file__).resolve().parent.parent / "examples" / "configs" / "math_grpo_gpu.yaml")
    assert (cfg.engine.backend, cfg.model.device, cfg.train.micro_batch_size) == ("auto", "cuda", 64)
    assert cfg.engine.options == {}  # no kv_cache_gib / CPU share of memory to override
    monkeypatch.setattr(auto, "has_cuda", lambda: True)
    monkeypatch.setattr(auto, "has_vllm", lambda: True)
    check_options(cfg.engine)


def test_fp8_weights_pick_vllm_on_cuda_at_every_size(tmp_path):
    # The hf engine's FP8 step decoded slower than its bf16 one on the H200 (0.75 / 0.85x at the 7B
    # shape), vLLM's faster (1.20x at 64 rows): under auto an FP8 run must not land on hf for a small model.
    path = _checkpoint(tmp_path, [[(10, 10)]])  # 100 parameters: hf without FP8
    assert auto.choose_backend(path, cuda=True, vllm=True)[0] == "hf"
    backend, why = auto.choose_backend(path, cuda=True, vllm=True, fp8=True)
    assert (backend, why.split(":")[0]) == ("vllm", "CUDA, FP8 weights")
    assert auto.choose_backend(path, cuda=True, vllm=False, fp8=True)[0] == "hf"  # nothing else to pick
    assert auto.choose_backend(path, cuda=False, vllm=True, fp8=True)[0] == "vllm"  # (refused at load on CPU)


def test_build_engine_under_auto_passes_the_fp8_request_to_the_rule(tmp_path, monkeypatch, capsys):
    from chatgym.trainer import engines

    picked = []

    def choose(model_path, *, fp8):
        picked.append(fp8)
        raise RuntimeError("stop before building")

    monkeypatch.setattr(auto, "choose_backend", choose)
    monkeypatch.setattr(engines, "check_options", lambda cfg: None)
    for options in ({"quantization": "FP8"}, {}):
        with pytest.raises(RuntimeError, match="stop before building"):
            build_engine(EngineConfig(backend="auto", options=options), tmp_path, None, 0, 128)
    assert picked == [True, False]
