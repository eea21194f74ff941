"""Checkpoint files on disk."""

from __future__ import annotations

import os
import stat

import torch

from chatgym.trainer.learner.checkpoint import list_checkpoints, save_checkpoint
from chatgym.trainer.models.random_init import random_model

TINY = dict(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8)


def test_a_checkpoint_directory_follows_the_umask_not_0700(tmp_path):
    """Regression: checkpoints were written into a mkdtemp directory and renamed, so they kept its
    mode 0700, and safetensors writes its files 0600: another user (a shared cluster's eval job) could
    not read them."""
    model = random_model("smollm2", seed=0, **TINY)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    old = os.umask(0o022)
    try:
        path = save_checkpoint(tmp_path, 3, policy=model, tokenizer=None, optimizer=optimizer, scheduler=scheduler)
    finally:
        os.umask(old)
    assert path == tmp_path / "checkpoints" / "step_000003"
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert "policy/model.safetensors" in files and "trainer_state.pt" in files
    assert {f: oct(stat.S_IMODE((path / f).stat().st_mode)) for f in files} == {f: "0o644" for f in files}
    assert list_checkpoints(tmp_path) == [path]
    assert sorted(p.name for p in path.parent.iterdir()) == ["step_000003"]  # no temporary left


def test_a_checkpoint_the_disk_refuses_is_one_clear_error_and_leaves_no_partial_files(tmp_path):
    """Regression: a full disk failed the run at the checkpoint save with safetensors' or torch's raw
    traceback. A real refused write: a 1 MB file size limit (RLIMIT_FSIZE, SIGXFSZ ignored so the write
    fails with EFBIG instead of killing the process) against the ~3 MB weights file."""
    import pytest
    from train_helpers import file_size_limit

    from chatgym.trainer.learner.checkpoint import CheckpointNotWritten

    model = random_model("smollm2", seed=0, **TINY)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    kw = dict(policy=model, tokenizer=None, optimizer=optimizer, scheduler=scheduler)
    first = save_checkpoint(tmp_path, 1, **kw)
    assert (first / "policy" / "model.safetensors").stat().st_size > 2_000_000
    with file_size_limit(1_000_000), pytest.raises(CheckpointNotWritten) as info:
        save_checkpoint(tmp_path, 2, **kw)
    message = str(info.value)
    head = f"could not write checkpoint {tmp_path / 'checkpoints' / 'step_000002'}: File too large ("
    assert message.startswith(head) and message.endswith(" GB free on that disk; kept: step_000001)")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]
    assert list_checkpoints(tmp_path) == [first]


def test_an_error_that_is_not_a_refused_write_keeps_its_own_type(tmp_path):
    """Only a refused write becomes CheckpointNotWritten: a bug (here a state_dict that raises) keeps its
    traceback, and no partial checkpoint is left either."""
    import pytest

    class Broken:
        def state_dict(self):
            raise KeyError("bug")

    model = random_model("smollm2", seed=0, **TINY)
    with pytest.raises(KeyError, match="bug"):
        save_checkpoint(tmp_path, 1, policy=model, tokenizer=None, optimizer=Broken(), scheduler=Broken())
    assert list((tmp_path / "checkpoints").iterdir()) == []
