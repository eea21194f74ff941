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
