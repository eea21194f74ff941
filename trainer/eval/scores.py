"""Evaluation metrics of one (model, env) cell, computed from its episode rows.

* ``pass@k`` — the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
  on Code", arXiv:2107.03374, section 2.1): with ``n`` samples of a task of which ``c`` are correct,
  ``pass@k = 1 - C(n - c, k) / C(n, k)``, averaged over tasks. Computed as the paper's numerically
  stable product ``1 - prod_{i = n-c+1}^{n} (1 - k / i)``.
* mean reward with a 95% confidence interval — the mean over tasks of each task's mean reward, and
  ``mean ± 1.96 · s / sqrt(T)`` with ``s`` the sample standard deviation (ddof 1) of the ``T`` task
  means (normal approximation). Tasks, not episodes, are the independent units: samples of one task
  are correlated. When every task mean is 0 or 1 (one sample per task of a pass/fail reward) the
  interval is Wilson's score interval instead (E. B. Wilson 1927, "Probable inference, the law of
  succession, and statistical inference"): it stays inside [0, 1] and is not degenerate at 0/T or
  T/T, where the normal approximation gives intervals below 0 or of width 0 on small T; other
  task means in [0, 1] get the normal interval clipped to [0, 1]. With a single
  task the interval is undefined (``None``).
* mean turns, generated tokens per episode, tool-call error rate (tool errors / tool calls over all
  episodes), episode failure rate (episodes that crashed or timed out / episodes), wall time;
* the multi-turn figures a training run logs as ``eval/tools/calls_per_episode``,
  ``eval/episode/truncated_frac`` and ``eval/reward/by_turns/<n>``
  (:func:`chatgym.trainer.logging.step_metrics.multiturn_metrics`): tool calls per episode, share of
  episodes truncated, mean reward of the episodes with ``n`` turns. The store keeps no per-kind tool
  errors or truncating budget, so those splits are in the training run's metrics only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

Z_95 = 1.959963984540054  # standard normal quantile at 0.975


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task (Chen et al. 2021, eq. 1 and their numpy implementation).

    Args:
        n: samples drawn (>= 1).
        c: correct samples (0 <= c <= n).
        k: budget (1 <= k <= n).

    Returns:
        The probability that at least one of ``k`` samples drawn without replacement from the ``n`` is
        correct, in [0, 1].

    Raises:
        ValueError: arguments outside those ranges.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise ValueError(f"pass_at_k takes ints, got n={n!r}, c={c!r}, k={k!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n, 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_ci(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """``(mean, low, high)``: the mean and its 95% normal-approximation interval (see module docstring).

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("mean_ci needs at least one value")
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    if all(v in (0.0, 1.0) for v in values):
        return (mean, *wilson_interval(mean, n))
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z_95 * sd / math.sqrt(n)
    if all(0.0 <= v <= 1.0 for v in values):  # a mean of values in [0, 1] cannot leave [0, 1]
        return mean, max(0.0, mean - half), min(1.0, mean + half)
    return mean, mean - half, mean + half


def wilson_interval(p: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval ``(low, high)`` for a proportion ``p`` of ``n`` trials (see module docstring)."""
    z2n = z * z / n
    center = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / n + z2n / (4 * n))
    return max(0.0, center - half), min(1.0, center + half)


@dataclass
class CellMetrics:
    """Metrics of one (model, env) cell.

    Attributes:
        episodes, tasks: episode rows and distinct tasks counted.
        samples_per_task: the smallest number of samples of any task (``n`` of pass@n).
        k: the pass@k budget used (``min(k asked, samples_per_task)``).
        pass_at_1, pass_at_k: mean over tasks of the unbiased estimator.
        mean_reward, reward_ci_low, reward_ci_high: mean over tasks of task-mean reward, and its 95% CI
            (``None`` with one task).
        mean_turns: assistant turns per episode.
        tokens_per_episode: generated tokens per episode over episodes that report them (``None``
            when none do, e.g. the scripted reference policy).
        tool_calls, tool_errors: totals; ``tool_error_rate`` is their ratio (``None`` without calls).
        failure_rate: share of episodes that failed (env crash, timeout, engine error).
        wall_s: seconds the evaluation took, summed over the sessions that produced the rows.
        tool_calls_per_episode: tool calls / episodes.
        truncated_frac: share of episodes truncated (an env limit or a token budget).
        reward_by_turns: turns -> mean reward of the episodes with that many turns (failed ones with
            their recorded reward, as in ``mean_reward``).
    """

    episodes: int
    tasks: int
    samples_per_task: int
    k: int
    pass_at_1: float
    pass_at_k: float
    mean_reward: float
    reward_ci_low: float | None
    reward_ci_high: float | None
    mean_turns: float
    tokens_per_episode: float | None
    tool_calls: int
    tool_errors: int
    tool_error_rate: float | None
    failure_rate: float
    wall_s: float
    tool_calls_per_episode: float
    truncated_frac: float
    reward_by_turns: dict[int, float]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cell_metrics(rows: Iterable[Mapping[str, Any]], k: int = 1, wall_s: float = 0.0) -> CellMetrics:
    """Metrics of one cell from its episode rows.

    Args:
        rows: mappings with ``task_index``, ``reward`` (float), ``success`` (0/1), ``turns``,
            ``generated_tokens`` (int or None), ``tool_calls``, ``tool_errors``, ``failed`` (0/1),
            optionally ``truncated`` (0/1).
            A failed episode counts as incorrect, with its reward as recorded (0 when it crashed).
        k: pass@k budget; capped at the smallest number of samples of any task.
        wall_s: the cell's wall time in seconds (the store computes it from its sessions).

    Raises:
        ValueError: no rows, or ``k < 1``.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("cell_metrics needs at least one episode row")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    by_task: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_task[r["task_index"]].append(r)
    n_min = min(len(v) for v in by_task.values())
    k_used = min(k, n_min)
    p1, pk, task_means = [], [], []
    for eps in by_task.values():
        n, c = len(eps), sum(int(bool(e["success"])) for e in eps)
        p1.append(pass_at_k(n, c, 1))
        pk.append(pass_at_k(n, c, k_used))
        task_means.append(sum(float(e["reward"]) for e in eps) / n)
    mean, lo, hi = mean_ci(task_means)
    tokens = [int(r["generated_tokens"]) for r in rows if r.get("generated_tokens") is not None]
    calls = sum(int(r.get("tool_calls") or 0) for r in rows)
    errors = sum(int(r.get("tool_errors") or 0) for r in rows)
    return CellMetrics(
        episodes=len(rows),
        tasks=len(by_task),
        samples_per_task=n_min,
        k=k_used,
        pass_at_1=sum(p1) / len(p1),
        pass_at_k=sum(pk) / len(pk),
        mean_reward=mean,
        reward_ci_low=lo,
        reward_ci_high=hi,
        mean_turns=sum(int(r["turns"]) for r in rows) / len(rows),
        tokens_per_episode=sum(tokens) / len(tokens) if tokens else None,
        tool_calls=calls,
        tool_errors=errors,
        tool_error_rate=errors / calls if calls else None,
        failure_rate=sum(int(bool(r["failed"])) for r in rows) / len(rows),
        wall_s=wall_s,
        tool_calls_per_episode=calls / len(rows),
        truncated_frac=sum(int(bool(r.get("truncated"))) for r in rows) / len(rows),
        reward_by_turns=_reward_by_turns(rows),
    )


def _reward_by_turns(rows: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    by: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        by[int(r["turns"])].append(float(r["reward"]))
    return {n: sum(v) / len(v) for n, v in sorted(by.items())}
