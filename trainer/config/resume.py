"""What a resumed run keeps of the config it resumes: the old config when the new one differs, and
which of the held-out evaluation's settings moved since the first run (its step-0 evaluation is the
run summary's "before")."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

from chatgym.trainer.config.loader import changed_values, config_changes
from chatgym.trainer.config.run import Config, config_to_dict

# The settings that decide what the held-out evaluation scores (train.py's evaluate()).
EVAL_SETTINGS = ("env.id", "env.kwargs", "env.eval_split", "env.eval_tasks", "env.eval_temperature")


def eval_changes(out: Path, cfg: Config) -> list[str]:
    """The :data:`EVAL_SETTINGS` keys whose values in ``cfg`` differ from the first run's config in
    ``out`` (the oldest ``config.until_step_<step>.yaml`` a resume kept, else ``config.yaml``)."""
    kept = sorted(out.glob("config.until_step_*.yaml"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    first = kept[0] if kept else out / "config.yaml"
    if not first.is_file():
        return []
    changes = changed_values(yaml.safe_load(first.read_text()) or {}, config_to_dict(cfg))
    return [key for key in changes if key.startswith(EVAL_SETTINGS)]


def keep_changed_config(path: Path, cfg: Config, step: int) -> None:
    """Before a resumed run writes ``path`` (``config.yaml``): when the config it resumes with differs
    from the one there (beyond ``train.max_steps`` and ``train.output_dir``), say so in one line and
    keep the old file as ``config.until_step_<step>.yaml``. A resume whose command leaves out an
    override of the first run (``algo.kl_coef=0.01``) otherwise trains on with the YAML's value and
    overwrites the record of the first run's, without a word."""
    if not path.is_file():
        return
    old = yaml.safe_load(path.read_text()) or {}
    changes = config_changes(old, config_to_dict(cfg), ignore=("train.max_steps", "train.output_dir"))
    if not changes:
        return
    kept = path.with_name(f"config.until_step_{step}.yaml")
    shutil.copyfile(path, kept)
    print(
        f"chatgym: resuming at step {step} with a config that differs from {path}: {'; '.join(changes)} "
        f"(the steps from here use the new values; the old config is kept in {kept})",
        file=sys.stderr,
    )
