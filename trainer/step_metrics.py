"""Per-step metrics of the rollouts: rewards, accuracy, lengths, turns, failures, timings.

metrics = rollout_metrics(trajectories, rollout_s=12.5)   # {"reward/mean": ..., ...}
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .learner.prepare import hit_budget
from .rollout.types import Trajectory


def rollout_metrics(trajs: Sequence[Trajectory], rollout_s: float) -> dict[str, float]:
    """Metrics of a step's trajectories: rewards, ``reward/accuracy`` (share of ``Trajectory.success``
    among those whose env defines it; absent when none does), lengths, failures, timings."""
    ok = [t for t in trajs if not t.failed]
    rewards = [t.reward for t in ok]
    lengths = [t.response_tokens for t in ok]
    gen_tokens = sum(t.response_tokens for t in trajs)
    out = {
        "reward/mean": float(np.mean(rewards)) if ok else 0.0,
        "reward/std": float(np.std(rewards)) if ok else 0.0,
        "response/length_mean": float(np.mean(lengths)) if ok else 0.0,
        "response/length_max": max(lengths, default=0),
        "response/hit_budget_frac": float(np.mean([hit_budget(t) for t in ok])) if ok else 0.0,
        "response/turns_mean": float(np.mean([t.num_turns for t in ok])) if ok else 0.0,
        "batch/trajectories": len(trajs),
        "batch/failed": len(trajs) - len(ok),
        "timing/rollout_s": rollout_s,
        "timing/generate_s_mean": float(np.mean([t.timing.get("generate_s", 0.0) for t in trajs]))
        if trajs
        else 0.0,
        "timing/env_s_mean": float(np.mean([t.timing.get("env_s", 0.0) for t in trajs])) if trajs else 0.0,
        "throughput/gen_tokens_per_s": gen_tokens / max(rollout_s, 1e-9),
    }
    out.update(accuracy("reward/accuracy", ok))
    return out


def accuracy(name: str, trajs: Sequence[Trajectory]) -> dict[str, float]:
    judged = [t.success for t in trajs if t.success is not None]
    return {name: float(np.mean(judged))} if judged else {}
