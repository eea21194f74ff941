"""Checkpoints: model weights, optimizer and scheduler states, RNG states and the step, written
atomically; ``--resume`` restores them so the run continues from the same step with the same next
batch.

Layout of ``<output_dir>/checkpoints/step_000010/``::

    policy/             save_pretrained of the policy (a LoRA policy: its adapters) + tokenizer
    critic/             the value model (PPO only)
    trainer_state.pt    {"step", "optimizer", "scheduler", "rng", "config"[, "pipeline"]}

``pipeline`` (async runs) is the pipeline's state: its replay buffer and the groups in flight, so a
resumed run takes the same next batch (:meth:`chatgym.trainer.pipeline.Pipeline.state_dict`).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

_STEP_DIR = re.compile(r"^step_(\d+)$")
STATE_FILE = "trainer_state.pt"
# How a failed write reads once torch (RuntimeError) or safetensors (its Rust io::Error) has wrapped it.
_WRITE_FAILURE = re.compile(
    r"No space left|Disk quota|Read-only file system|Permission denied|File too large|file write failed|os error \d+"
)


class CheckpointNotWritten(RuntimeError):
    """The disk refused a checkpoint (full, over quota, read-only, a file size limit); the message names
    the checkpoint, the reason and the bytes free. The partial files are removed, older checkpoints kept."""


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``output_dir``, oldest first (a half-written one is never listed)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def find_checkpoint(output_dir: str | Path, resume: bool | str | Path, *, resumable: bool = True) -> Path | None:
    """The checkpoint a run starts from, checked without loading anything.

    Args:
        output_dir: the run's output directory.
        resume: False (fresh run), True (newest checkpoint in ``output_dir``, or None when there is
            none), or a checkpoint directory.
        resumable: whether the command can continue a run (``chatgym train --resume``; ``chatgym
            cotrain`` cannot): the refusal of a used ``output_dir`` offers ``--resume`` only then.

    Raises:
        FileExistsError: a fresh run into an ``output_dir`` that already holds checkpoints.
        FileNotFoundError: ``resume`` names a directory that is not a complete checkpoint.
    """
    if resume is False:
        if latest_checkpoint(output_dir) is not None:
            resume_hint = "pass --resume to continue or " if resumable else ""
            raise FileExistsError(f"{output_dir} already holds checkpoints; {resume_hint}choose another --output-dir")
        return None
    if resume is True:
        return latest_checkpoint(output_dir)
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a chatgym checkpoint (no {STATE_FILE})")
    return path


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a checkpoint directory named ``step_NNNNNN`` (None for another name)."""
    m = _STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    policy: Any,
    tokenizer: Any,
    optimizer: Any,
    scheduler: Any,
    critic: Any = None,
    config: dict[str, Any] | None = None,
    keep: int = 2,
    rng_extra: dict[str, Any] | None = None,
    pipeline_state: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of completed step ``step`` and keep only the newest ``keep``.

    ``optimizer`` and ``scheduler`` are anything with ``state_dict()``; ``rng_extra`` adds generator
    states of the caller's (e.g. its shuffling generator) to the saved RNG states; ``pipeline_state``
    (picklable, e.g. the async pipeline's replay buffer) is saved in the same file, so it is written
    atomically with the rest.

    The files go to a temporary directory that is renamed into place at the end, so a crash never
    leaves a checkpoint that :func:`latest_checkpoint` would pick up half-written.

    Returns:
        The checkpoint directory.

    Raises:
        CheckpointNotWritten: the filesystem refused a write (disk full, quota, read-only, a file size
            limit); nothing of this checkpoint is left on disk.
    """
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    # Not mkdtemp: its mode 0700 would stay on the renamed checkpoint; mkdir follows the umask.
    tmp = root / f".step_{step:06d}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        policy.save_pretrained(tmp / "policy", safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "policy")
        if critic is not None:
            critic.save_pretrained(tmp / "critic", safe_serialization=True)
        state = {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": {**rng_state(), **(rng_extra or {})},
            "config": config,
        }
        if pipeline_state is not None:
            state["pipeline"] = pipeline_state
        torch.save(state, tmp / STATE_FILE)
        _files_follow_the_umask(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except Exception as exc:
        if not (isinstance(exc, OSError) or _WRITE_FAILURE.search(str(exc))):
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # before the message reads the free space
        raise CheckpointNotWritten(_not_written(root, final, exc)) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in list_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _not_written(root: Path, final: Path, exc: Exception) -> str:
    text = str(exc)
    rust = re.search(r"I/O error: (.+?) \(os error \d+\)", text)  # safetensors' wrapped io::Error
    found = _WRITE_FAILURE.search(text)
    if isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    else:
        reason = rust.group(1) if rust else found.group(0) if found else text
    free = shutil.disk_usage(root).free
    kept = [p.name for p in list_checkpoints(root.parent)]
    older = f"; kept: {', '.join(kept)}" if kept else "; no earlier checkpoint"
    return f"could not write checkpoint {final}: {reason} ({free / 1e9:.2f} GB free on that disk{older})"


def _files_follow_the_umask(root: Path) -> None:
    """Give every file under ``root`` the mode a new file gets here (``0o666`` less the umask):
    safetensors writes its files 0600 whatever the umask, which left a checkpoint's weights unreadable
    to anyone else. The mode is read from a probe file, not from ``os.umask`` (setting it to read it
    races with other threads)."""
    probe = root / ".mode_probe"
    probe.touch()
    mode = stat.S_IMODE(probe.stat().st_mode)
    probe.unlink()
    for path in root.rglob("*"):
        if path.is_file():
            os.chmod(path, mode)


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """The ``trainer_state.pt`` of checkpoint directory ``path`` (loaded on CPU).

    Raises:
        FileNotFoundError: ``path`` is not a complete checkpoint.
    """
    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} is not a chatgym checkpoint (no {STATE_FILE})")
    # Our own file: it holds RNG states (numpy arrays, tuples), which weights_only=True rejects.
    return torch.load(file, map_location="cpu", weights_only=False)


def load_pipeline_state(path: str | Path) -> dict[str, Any] | None:
    """The pipeline state saved with checkpoint ``path`` (None when the run saved none: sync runs)."""
    return load_trainer_state(path).get("pipeline")
