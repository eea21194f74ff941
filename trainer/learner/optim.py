"""AdamW and the learning-rate schedule (linear warm-up, then constant / linear / cosine decay)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from chatgym.trainer.config.run import OptimConfig


def lr_factor(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    Warm-up: ``(step + 1) / warmup_steps`` for the first ``warmup_steps`` steps (so step 0 already
    moves the weights). Then ``constant``: 1; ``linear``: from 1 down to ``min_lr_ratio`` at the last
    step; ``cosine``: ``min + (1 − min)·½(1 + cos(π·progress))`` over the same span.
    Example, warmup 2, total 6, linear, min 0: steps 0..5 -> 0.5, 1, 1, 2/3, 1/3, 0.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(1, total_steps - cfg.warmup_steps - 1)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    shape = 1.0 - progress if cfg.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_optimizer(
    groups: Iterable[tuple[list[torch.nn.Parameter], float]], cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``(params, peak_lr)`` groups and a LambdaLR applying :func:`lr_factor` to every group.

    ``fused`` AdamW is used on CUDA (one kernel per step); ``foreach`` elsewhere.
    """
    param_groups = [{"params": params, "lr": lr} for params, lr in groups if params]
    if not param_groups:
        raise ValueError("build_optimizer: no trainable parameters")
    on_cuda = param_groups[0]["params"][0].is_cuda
    optimizer = torch.optim.AdamW(
        param_groups,
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=on_cuda or None,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, cfg))
    return optimizer, scheduler
