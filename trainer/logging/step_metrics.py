"""Per-step metrics of the rollouts: rewards, accuracy, lengths, turns, failures, timings, and the
multi-turn ones (:func:`multiturn_metrics`: tool calls, tool errors by kind, turns, truncation by
budget, reward by turn count, GenRM verdicts), which the evaluation summary reports too (``eval/``).

metrics = rollout_metrics(trajectories, rollout_s=12.5)   # {"reward/mean": ..., ...}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from chatgym.envs.tools import TOOL_ERROR_KINDS
from chatgym.trainer.rollout.types import Trajectory, hit_budget


def failure_counts(trajs: Sequence[Trajectory], shown: int = 3) -> str:
    """The failed trajectories' errors, by first line (200 characters), in the order they first
    occur, each with how many share it: ``"2 of them: A; 1: B"``; more than ``shown`` distinct
    errors end in ``"; and K other errors"`` (``"error"`` for one). ``""`` when none failed."""
    # A Counter keeps first-occurrence order; "" has no lines.
    counts = Counter((str(t.error).splitlines() or [""])[0][:200] for t in trajs if t.failed)
    parts = [f"{n}: {error}" for error, n in list(counts.items())[:shown]]
    if parts:
        parts[0] = parts[0].replace(": ", " of them: ", 1)
    if len(counts) > shown:
        rest = len(counts) - shown
        parts.append(f"and {rest} other error{'s' if rest > 1 else ''}")
    return "; ".join(parts)


def all_failed(trajs: Sequence[Trajectory], step: int) -> str | None:
    """One line when every trajectory of step ``step`` failed (nothing can be trained on: an env id
    the rollout workers do not know, an engine that cannot generate), naming the first three distinct
    errors and how many share each (:func:`failure_counts`); None otherwise (no trajectories, or at least one that
    did not fail)."""
    if not trajs or not all(t.failed for t in trajs):
        return None
    return f"chatgym: step {step}: all {len(trajs)} episodes failed, nothing was trained ({failure_counts(trajs)})"


def some_failed(trajs: Sequence[Trajectory], step: int) -> str | None:
    """One line when some but not all trajectories of step ``step`` failed: the update trains on the
    rest, and without this only ``batch/failed`` would say so. None otherwise."""
    failed = sum(t.failed for t in trajs)
    if not failed or failed == len(trajs):
        return None
    return (
        f"chatgym: step {step}: {failed} of {len(trajs)} episodes failed and were left out of the update "
        f"({failure_counts(trajs)})"
    )


def rollout_metrics(trajs: Sequence[Trajectory], rollout_s: float) -> dict[str, float]:
    """Metrics of a step's trajectories: rewards, ``reward/accuracy`` (share of ``Trajectory.success``
    among those whose env defines it; absent when none does), lengths, failures, timings, and
    :func:`multiturn_metrics`. ``rollout_s`` is how long the trajectories' rollout ran (logged as
    ``timing/rollout_s``); ``throughput/gen_tokens_per_s`` is their generated tokens (failed
    episodes' included) per second of it."""
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
    out.update(multiturn_metrics(trajs))
    return out


def accuracy(name: str, trajs: Sequence[Trajectory]) -> dict[str, float]:
    judged = [t.success for t in trajs if t.success is not None]
    return {name: float(np.mean(judged))} if judged else {}


def held_out_scores(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """``eval/score`` and ``eval/accuracy`` of held-out episodes (one per task), counted as the
    leaderboard counts them (:func:`chatgym.trainer.eval.scores.cell_metrics`): a failed episode is a
    miss, with the reward it had when it failed (0 unless the env rewarded a turn before that). Over
    the episodes that did not fail alone, a model whose evaluation episodes crash would look better.

    Returns:
        ``eval/score``: mean reward of all the episodes (0.0 with none); ``eval/accuracy``: the
        episodes with ``success`` True over those that state success plus the failed ones — absent
        when episodes did not fail and none of them states success (the env defines none).
    """
    if not trajs:
        return {"eval/score": 0.0}
    ok = [t for t in trajs if not t.failed]
    out = {"eval/score": float(np.mean([t.reward for t in trajs]))}
    judged = [t.success for t in ok if t.success is not None]
    if judged or not ok:  # every episode failed: every one a miss
        out["eval/accuracy"] = float(np.mean(judged + [False] * (len(trajs) - len(ok))))
    return out


# Budgets an episode can be cut by, as ``episode/truncated/<budget>`` (fractions of all trajectories):
# ``env`` the env's own limit (``max_turns``; Judge-v0's judge failure), ``max_response_tokens`` and
# ``max_model_len`` the collector's episode budgets, ``max_tokens`` an episode with a turn cut by the
# per-turn budget (the episode went on with the cut text), ``timeout`` ``episode_timeout_s``.
TRUNCATION_BUDGETS = ("env", "max_response_tokens", "max_model_len", "max_tokens", "timeout")


def multiturn_metrics(trajs: Sequence[Trajectory], prefix: str = "") -> dict[str, float]:
    """Tool use, turns, truncation by budget, reward by turn count and GenRM verdicts of a batch.

    Args:
        trajs: the trajectories (failed ones included; they count only in ``episode/truncated/*``).
        prefix: prepended to every name (``"eval/"`` for the evaluation summary).

    Returns (names without ``prefix``; means over the trajectories that did not fail unless said):
        ``tools/calls_per_episode`` — tool calls (``info["tool_results_total"]``: one ``tool`` message
        per call, malformed calls included); ``tools/episodes_with_call_frac`` — share with >= 1 call;
        ``tools/error_rate`` — failed calls / calls, over the batch (0.0 without calls);
        ``tools/error_rate/<kind>`` — the same per kind (``info["tool_errors_by_kind"]``; every kind of
        :data:`chatgym.envs.tools.TOOL_ERROR_KINDS` always, other kinds when they occur);
        ``episode/turns_mean``, ``episode/turns_max`` — assistant turns;
        ``episode/truncated/<budget>`` — share of ALL trajectories cut by each of
        :data:`TRUNCATION_BUDGETS`; ``episode/truncated_frac`` — share ended by any of them;
        ``reward/by_turns/<n>`` — mean reward of the episodes with ``n`` turns (the ``n`` present);
        with GenRM (:mod:`chatgym.envs.wrappers.genrm`) episodes: ``genrm/judged_frac``, ``genrm/score_mean``
        (parsed verdicts), ``genrm/unparseable_frac`` (of the judged), ``genrm/judge_s_mean``,
        ``reward/env_mean`` and ``reward/genrm_mean`` (the components, over the judged).
    """
    ok = [t for t in trajs if not t.failed]
    calls = sum(int(t.info.get("tool_results_total", 0) or 0) for t in ok)
    by_kind: dict[str, int] = dict.fromkeys(TOOL_ERROR_KINDS, 0)
    for t in ok:
        for kind, n in (t.info.get("tool_errors_by_kind") or {}).items():
            by_kind[kind] = by_kind.get(kind, 0) + int(n)
    errors = sum(int(t.info.get("tool_errors_total", 0) or 0) for t in ok)
    turns = [t.num_turns for t in ok]
    out: dict[str, float] = {
        "tools/calls_per_episode": calls / len(ok) if ok else 0.0,
        "tools/episodes_with_call_frac": _mean(int(t.info.get("tool_results_total", 0) or 0) > 0 for t in ok),
        "tools/error_rate": errors / calls if calls else 0.0,
    }
    out.update({f"tools/error_rate/{k}": n / calls if calls else 0.0 for k, n in by_kind.items()})
    out["episode/turns_mean"] = _mean(turns)
    out["episode/turns_max"] = max(turns, default=0)
    cut = [_cut_by(t) for t in trajs]
    out.update({f"episode/truncated/{b}": _mean(b in c for c in cut) for b in TRUNCATION_BUDGETS})
    out["episode/truncated_frac"] = _mean(bool(c - {"max_tokens"}) for c in cut)
    for n in sorted(set(turns)):
        out[f"reward/by_turns/{n}"] = _mean(t.reward for t in ok if t.num_turns == n)
    judged = [t.info["genrm"] for t in ok if isinstance(t.info.get("genrm"), dict)]
    if judged:
        parsed = [g["score"] for g in judged if g.get("score") is not None]
        components = [
            t.info.get("reward_components") or {} for t in ok if isinstance(t.info.get("genrm"), dict)
        ]
        out.update(
            {
                "genrm/judged_frac": len(judged) / len(ok),
                "genrm/score_mean": _mean(parsed),
                "genrm/unparseable_frac": 1.0 - len(parsed) / len(judged),
                "genrm/judge_s_mean": _mean(float(g.get("judge_s", 0.0)) for g in judged),
                "reward/env_mean": _mean(float(c.get("env", 0.0)) for c in components),
                "reward/genrm_mean": _mean(float(c.get("genrm", 0.0)) for c in components),
            }
        )
    return {prefix + k: v for k, v in out.items()}


def _mean(values: Iterable[float | int | bool]) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else 0.0


def _cut_by(t: Trajectory) -> set[str]:
    """The budgets that cut trajectory ``t`` (see :data:`TRUNCATION_BUDGETS`)."""
    out = set()
    if t.failed:
        if t.info.get("error_kind") == "timeout":
            out.add("timeout")
        return out
    if t.truncated:
        out.add(str(t.info.get("truncated_by", "env")))
    if any(r.get("cut_by") == "max_tokens" for r in t.info.get("turns") or ()):
        out.add("max_tokens")
    return out
