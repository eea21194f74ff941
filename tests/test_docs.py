"""The user docs stay true: docs/config.md is what the dataclasses say, the write-an-env example prints
what docs/write-an-env.md shows, ``import chatgym``'s entry points are the real objects (and import no
torch), the README is a front door (short, quickstart early, the CI's test command), and every
relative link in README.md and docs/ names a file that exists."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- docs/config.md ----------------------------------------------------------------------------------


def test_config_reference_is_fresh():
    gen = _generator()
    assert (DOCS / "config.md").read_text(encoding="utf-8") == gen.render(), (
        f"docs/config.md is stale: run `{gen.COMMAND}`"
    )


def test_every_config_key_has_a_docstring_entry():
    assert _generator().undocumented() == []


def test_config_reference_lists_every_key_once():
    from chatgym.trainer.config.cotrain import CoTrainConfig
    from chatgym.trainer.config.run import Config, config_to_dict

    def keys(data, prefix):
        for name, value in data.items():
            key = f"{prefix}.{name}" if prefix else name
            if isinstance(value, dict) and value:  # a section; a mapping-valued key defaults to {}
                yield from keys(value, key)
            else:
                yield key

    expected = sorted(keys(config_to_dict(Config()), "")) + sorted(
        f"cotrain.{f.name}" for f in dataclasses.fields(CoTrainConfig)
    )
    text = (DOCS / "config.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([\w.]+)` \| (?!section)", text, re.M)
    assert sorted(listed) == sorted(expected)


def test_field_docs_split_entries_that_name_several_fields():
    from chatgym.trainer.config.run import AlgoConfig, LoraConfig, OptimConfig

    gen = _generator()
    lora = gen.field_docs(LoraConfig)
    assert lora["r"] == lora["alpha"] == lora["dropout"] == (
        "rank, scaling numerator (scale = alpha / r) and dropout of the adapters."
    )
    # A field with no line of its own gets the line that names it, prefixed with that line's field.
    algo = gen.field_docs(AlgoConfig)
    assert algo["advantage_kwargs"].startswith("``advantage``: advantage estimator (``grpo``")
    # Fields with a line each get their own (these shared one line, which read garbled in config.md).
    optim = gen.field_docs(OptimConfig)
    assert optim["lr"] == "peak learning rate."
    assert optim["value_lr"] == "the value head's (None: same as ``lr``)."
    assert optim["min_lr_ratio"] == "the decays' end, as a share of ``lr``."


# ---- the write-an-env example --------------------------------------------------------------------------

EXAMPLE_OUTPUT = """\
task train/1: Spell 'token' backwards.  (tools: ['count_letters'])
  turn 1: reward 0.0 terminated False truncated False new ["tool: '5'"]
  turn 2: reward 1.0 terminated True truncated False new []
  success True answer 'nekot' components {'correct': 1.0, 'format': 1.0}
task train/2: Spell 'reward' backwards.  (tools: ['count_letters'])
  turn 1: reward 0.0 terminated True truncated False new []
  success False answer None components {'correct': 0.0, 'format': 0.0}
task mine/0: Spell 'string' backwards.  (tools: ['count_letters'])
  turn 1: reward 1.0 terminated True truncated False new []
  success True answer 'gnirts' components {'correct': 1.0, 'format': 1.0}
"""


def test_reverse_env_example_prints_what_the_guide_shows():
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "reverse_env.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == EXAMPLE_OUTPUT
    guide = (DOCS / "write-an-env.md").read_text(encoding="utf-8")
    assert EXAMPLE_OUTPUT in guide


# ---- import chatgym ------------------------------------------------------------------------------------

ENTRY_POINTS = {
    "make_engine": ("chatgym.trainer.engines", "make_engine"),
    "Collector": ("chatgym.trainer.rollout.collector", "Collector"),
    "Trainer": ("chatgym.trainer.train", "Trainer"),
    "load_config": ("chatgym.trainer.config.run", "load_config"),
    "check_chat_env": ("chatgym.envs.env_checker", "check_chat_env"),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_entry_point_is_the_real_object(name):
    import chatgym

    module, attr = ENTRY_POINTS[name]
    assert getattr(chatgym, name) is getattr(importlib.import_module(module), attr)


def test_public_names_are_listed():
    import chatgym

    public = {"make_engine", "Collector", "Trainer", "load_config", "check_chat_env"}
    assert set(chatgym.__all__) == public | {"__version__"}
    assert public <= set(dir(chatgym))
    with pytest.raises(AttributeError, match="module 'chatgym' has no attribute 'no_such_name'"):
        _ = chatgym.no_such_name


def test_import_chatgym_imports_no_torch():
    code = "import sys, chatgym; print('torch' in sys.modules, sorted(chatgym.__all__)[0])"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "False Collector\n"


# ---- the README and the links --------------------------------------------------------------------------


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160
    first_code = next(i for i, line in enumerate(lines) if line.startswith("import gymnasium as gym"))
    assert first_code < 40
    # CI (.ci/run) runs this exact command; the README must give the same one.
    assert any(line.split("#")[0].strip() == "bash scripts/test.sh" for line in lines[:first_code])
    assert any(line.split("#")[0].strip() == "bash scripts/train.sh" for line in lines[:first_code])
    assert "## Failure modes we guard against" in lines


COMMIT = re.compile(r"(?<![\w/.-])[0-9a-f]{7,40}(?![\w.-])")


@pytest.mark.parametrize("path", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_no_commit_hashes_or_session_names(path):
    text = path.read_text(encoding="utf-8")
    hashes = [h for h in COMMIT.findall(text) if re.search(r"[a-f]", h) and re.search(r"\d", h)]
    assert hashes == []
    assert re.findall(r"_s\d\d\b|\bsession \d+", text) == []


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("path", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_name_files_that_exist(path):
    text = path.read_text(encoding="utf-8")
    missing = [
        target
        for target in LINK.findall(text)
        if not target.startswith(("http://", "https://", "mailto:")) and not (path.parent / target).exists()
    ]
    assert missing == []


# ---- the resume example --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [README, DOCS / "training.md"], ids=lambda p: p.name)
def test_resume_example_resumes_with_the_first_runs_config(path, tmp_path, capsys, monkeypatch):
    # Regression (fresh-user walk): the example's resume left out the first run's algo.kl_coef=0.01, so
    # it said "resuming ... with a config that differs" and trained on with the YAML's 0.0.
    from chatgym.trainer.config.resume import keep_changed_config
    from chatgym.trainer.config.run import load_config, save_config
    from chatgym.trainer.train_cli import _parse

    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")  # _parse sets it when unset: restored after
    monkeypatch.chdir(ROOT)  # the examples' config paths
    commands = [shlex.split(line.strip())[2:] for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip().startswith(".venv/bin/chatgym train ")]
    (resume,) = [argv for argv in commands if "--resume" in argv]
    out = resume[resume.index("--output-dir") + 1]
    first = next(argv for argv in commands if "--resume" not in argv and out in argv)
    (first_args, first_overrides), (resume_args, resume_overrides) = _parse(first), _parse(resume)
    save_config(load_config(first_args.config, first_overrides), tmp_path / "config.yaml")
    keep_changed_config(tmp_path / "config.yaml", load_config(resume_args.config, resume_overrides), 5)
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "config.until_step_5.yaml").exists()


def test_training_doc_says_gradient_checkpointing_is_off_on_the_gpu_by_default():
    # Regression (fresh-user walk): the doc said the GPU path uses gradient checkpointing; it is off by
    # default and in the GPU example config.
    from chatgym.trainer.config.run import load_config

    assert load_config(None).model.gradient_checkpointing is False
    assert load_config(ROOT / "examples" / "configs" / "math_grpo_gpu.yaml").model.gradient_checkpointing is False
    text = " ".join((DOCS / "training.md").read_text(encoding="utf-8").split())
    assert "gradient checkpointing stays off unless `model.gradient_checkpointing: true`" in text
    assert "uses bf16 and gradient checkpointing" not in text


# ---- docs/architecture.md ------------------------------------------------------------------------------


def test_architecture_names_every_file_a_training_step_runs():
    # One real step of the main job (scaled down) under a profiler: every library file it runs a
    # function of must appear in the trajectory table, so the table cannot drift from the code.
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from trajectory_files import trajectory_files
    finally:
        sys.path.pop(0)
    files = trajectory_files("hf")
    assert "trainer/rollout/collector.py" in files and "envs/math/env.py" in files
    doc = (DOCS / "architecture.md").read_text(encoding="utf-8")
    assert [f for f in files if f"`{f}`" not in doc] == []
