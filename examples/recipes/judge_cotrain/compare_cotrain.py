"""Table and plot of co-training runs (``chatgym cotrain``).

A judge: its held-out agreement against the best constant rating's, how many ratings it gives, and
the policy's reference-judged reward. A simulated user: its held-out faithfulness against the blind
user's (one that states no identifier), coverage and groundedness, distinct openings, and the policy's
score. The party is read off the rows (``eval/judge/*`` or ``eval/user/*``); one party per call.

    python examples/recipes/judge_cotrain/compare_cotrain.py RUN_DIR [RUN_DIR ...] [--out compare.png]

Reads each run's ``metrics.jsonl`` (its ``eval/*`` rows; the wall clock of a row is the sum of
``timing/step_s`` and ``timing/eval_s`` up to it, seconds) and, for a judge, ``eval_calibration.jsonl``
(one row per held-out calibration sample); prints a markdown table (stdout) and draws the curves
against steps and the first against wall clock (``--out``). Wall clock compares speed only for runs
that had a GPU alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

COLUMNS = (
    ("eval/judge/calibration/reward_mean", "calibration agreement"),
    ("eval/judge/calibration/best_constant_agreement", "best constant"),
    ("eval/judge/calibration/rating_distinct", "distinct ratings"),
    ("eval/judge/calibration/order_accuracy", "order accuracy"),
    ("eval/judge/reward_mean", "policy-answer agreement"),
    ("eval/judge/best_constant_agreement", "its best constant"),
    ("eval/judge/parse_rate", "parse rate"),
    ("eval/policy/reference_reward", "policy reference reward"),
    ("eval/score", "policy score (judge-rated)"),
)
USER_COLUMNS = (
    ("eval/user/reward_mean", "faithfulness"),
    ("eval/user/blind_faithfulness", "blind user's"),
    ("eval/user/faithfulness_over_blind", "over blind"),
    ("eval/user/coverage", "coverage"),
    ("eval/user/grounded", "grounded"),
    ("eval/user/opening_distinct", "distinct openings"),
    ("eval/score", "policy score"),
)


def party_of(runs: list[Path]) -> str:
    """``"user"`` when any evaluation row has ``eval/user/*`` keys, else ``"judge"``."""
    for run in runs:
        if any(k.startswith("eval/user/") for r in eval_rows(run) for k in r):
            return "user"
    return "judge"


def eval_rows(run: Path) -> list[dict[str, Any]]:
    """The run's evaluation rows (those with ``eval/score``), in step order, each with ``wall_s``: the
    seconds of ``timing/step_s`` and ``timing/eval_s`` of every row up to and including it (in file
    order: the step-0 evaluation is logged first). Start-up (loading the models) and checkpoint saves
    are not in it: it runs behind the clock on the wall, the same way for every run.

    Raises ValueError when an evaluation row has no ``step``."""
    rows = read_rows(run / "metrics.jsonl")
    wall = 0.0
    out = []
    for r in rows:
        wall += (r.get("timing/step_s") or 0.0) + (r.get("timing/eval_s") or 0.0)
        if "eval/score" in r:
            if "step" not in r:
                raise ValueError(f"{run / 'metrics.jsonl'}: an evaluation row has no 'step'")
            out.append({**r, "wall_s": wall})
    return sorted(out, key=lambda r: r["step"])


def _parse(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The rows of the JSONL file ``path`` (none when it is missing) and whether its last line was
    cut short (a run killed while writing it; that line is left out).

    Raises ValueError naming the line when any other line is not JSON."""
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == len(lines):
                return rows, True
            raise ValueError(f"{path}: line {n} is not JSON ({e.msg})") from None
    return rows, False


def cut_short(path: Path) -> bool:
    """Whether the last line of the JSONL file ``path`` is not a whole JSON row."""
    return _parse(path)[1]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of the JSONL file ``path``, a cut-short last line left out (:func:`_parse`)."""
    return _parse(path)[0]


def rating_counts(run: Path) -> dict[int, dict[float | None, int]]:
    """Per judge weight version: how often each rating was given to the held-out calibration answers.
    The table reads the version as the step: true while every step updates the judge (the committed
    runs); a step whose judge batch was empty (e.g. ``algo.dynamic_sampling`` dropping every group)
    does not move it.

    Raises ValueError naming the row when one lacks ``judge_version`` or ``rating``."""
    out: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    path = run / "eval_calibration.jsonl"
    for n, row in enumerate(read_rows(path), 1):
        if "judge_version" not in row or "rating" not in row:
            raise ValueError(f"{path}: row {n} lacks 'judge_version' or 'rating'")
        out[int(row["judge_version"])][row["rating"]] += 1
    return {v: dict(c) for v, c in sorted(out.items())}


def table(runs: list[Path]) -> str:
    """One markdown row per (run, evaluation): a judge's :data:`COLUMNS` and the ratings given, or a
    user's :data:`USER_COLUMNS`."""
    user = party_of(runs) == "user"
    columns = USER_COLUMNS if user else COLUMNS
    head = ["run", "step", "wall clock (s)", *(name for _, name in columns)] + ([] if user else ["ratings given (calibration)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        counts = rating_counts(run)
        for r in eval_rows(run):
            cells = [f"{r['wall_s']:.0f}", *(f"{r[k]:.4f}" if r.get(k) is not None else "–" for k, _ in columns)]
            if user:
                lines.append(f"| {run.name} | {r['step']} | " + " | ".join(cells) + " |")
                continue
            given = counts.get(int(r["step"]), {})
            spread = ", ".join(f"{'none' if k is None else f'{k:g}'}: {n}" for k, n in sorted(given.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))
            lines.append(f"| {run.name} | {r['step']} | " + " | ".join(cells) + f" | {spread or '–'} |")
    return "\n".join(lines)


def plot(runs: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if party_of(runs) == "user":
        panels = (
            ("eval/user/reward_mean", "held-out user faithfulness (dashed: a blind user's)", "step"),
            ("eval/user/reward_mean", "held-out user faithfulness", "wall_s"),
            ("eval/user/coverage", "known identifiers stated (coverage)", "step"),
            ("eval/score", "policy score (tau2 reward)", "step"),
        )
        baselines = {"eval/user/reward_mean": "eval/user/blind_faithfulness"}
    else:
        panels = (
            ("eval/judge/calibration/reward_mean", "held-out calibration agreement (dashed: best constant)", "step"),
            ("eval/judge/calibration/reward_mean", "held-out calibration agreement", "wall_s"),
            ("eval/judge/reward_mean", "agreement on the policy's held-out answers\n(dashed: best constant)", "step"),
            ("eval/judge/calibration/rating_distinct", "distinct ratings on them (1: a constant judge)", "step"),
            ("eval/policy/reference_reward", "policy reward, reference-judged", "step"),
        )
        baselines = {
            "eval/judge/calibration/reward_mean": "eval/judge/calibration/best_constant_agreement",
            "eval/judge/reward_mean": "eval/judge/best_constant_agreement",
        }
    nrows = -(-len(panels) // 3)
    fig, grid = plt.subplots(nrows, 3, figsize=(15, 3.9 * nrows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    axes = axes[: len(panels)]
    for run in runs:
        rows = eval_rows(run)
        for ax, (key, title, x) in zip(axes, panels, strict=True):
            xs = [r[x] for r in rows]
            (line,) = ax.plot(xs, [r.get(key, float("nan")) for r in rows], marker="o", ms=3, label=run.name)
            if key in baselines and x == "step":
                const = [r.get(baselines[key], float("nan")) for r in rows]
                ax.plot(xs, const, ls="--", color=line.get_color())
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step" if x == "step" else "wall clock (s; runs sharing a GPU ran slower)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="PNG to draw (default: none)")
    args = parser.parse_args(argv)
    runs = [r for r in args.runs if (r / "metrics.jsonl").is_file()]
    for r in sorted(set(args.runs) - set(runs)):
        print(f"compare_cotrain.py: {r} has no metrics.jsonl; skipped", file=sys.stderr)
    if not runs:
        print("compare_cotrain.py: no runs", file=sys.stderr)
        return 2
    try:
        for r in runs:
            for name in ("metrics.jsonl", "eval_calibration.jsonl"):
                if cut_short(r / name):
                    print(f"compare_cotrain.py: {r}: the last line of {name} is cut short; that line left out", file=sys.stderr)
            if not eval_rows(r):
                print(f"compare_cotrain.py: {r} has no evaluation row (eval/score) yet", file=sys.stderr)
        text = table(runs)
    except ValueError as e:
        print(f"compare_cotrain.py: {e}", file=sys.stderr)
        return 2
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        plot(runs, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
