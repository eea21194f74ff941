"""Compare a recipe's runs (advantage estimators x seeds) from their ``metrics.jsonl`` alone.

    python examples/recipes/compare_runs.py runs/recipes/arith_chain_gpu_*  [--out compare.png]

Each run directory's ``config.yaml`` names its ``algo.advantage`` and ``train.seed``; arguments that
are not directories or have no ``config.yaml`` (a glob's ``.log`` files, the cold start's model) are
skipped with a note on stderr. Prints a markdown table of held-out accuracy at every evaluated step
(one column per run, then the mean of each estimator's seeds at the steps all of its runs reached),
the held-out tool figures at the first and last evaluation (``eval/tools/episodes_with_call_frac``,
``eval/tools/calls_per_episode``, ``eval/episode/turns_mean``, ``eval/tools/error_rate``; nan where
a row lacks one), and draws held-out accuracy against steps and against wall clock (seconds: the sum
of ``timing/step_s`` and ``timing/eval_s`` up to the row), the tool error rate and turns per episode
against steps into ``--out``. A run with no evaluation row is left out of the tables and the plot
(a line under the tables names it); an evaluation with failed episodes (``eval/failed`` > 0, counted
as misses in its accuracy; runs logged before chatgym counted them had accuracy over the others) is
marked ``(N failed)``. Wall clock compares speed only for runs that
had a GPU alone: runs that shared one (``compare_estimators.sh`` runs them at once) ran under
different load.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

TOOL_KEYS = {
    "tool_rate": "eval/tools/episodes_with_call_frac",
    "calls": "eval/tools/calls_per_episode",
    "turns": "eval/episode/turns_mean",
    "tool_error_rate": "eval/tools/error_rate",
}


def is_run(path: Path) -> bool:
    """A run directory: a directory with a ``config.yaml``."""
    return path.is_dir() and (path / "config.yaml").is_file()


def load_run(run_dir: Path) -> dict[str, Any]:
    """One run: its name, advantage, seed, evaluations ``[(step, wall_s, row)]`` in step order (none
    when it has no ``metrics.jsonl`` yet). An evaluation row is one with ``eval/accuracy`` or
    ``eval/failed`` (one without accuracy — every episode failed, logged before failures counted as
    misses — reads as nan).

    Raises FileNotFoundError when ``run_dir`` has no ``config.yaml``."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    wall = 0.0
    evals = []
    for row in (json.loads(line) for line in lines if line.strip()):
        wall += row.get("timing/step_s", 0.0) + row.get("timing/eval_s", 0.0)
        if "eval/accuracy" in row or "eval/failed" in row:
            evals.append((row["step"], wall, {"eval/accuracy": float("nan"), **row}))
    return {
        "name": run_dir.name,
        "advantage": cfg["algo"]["advantage"],
        "seed": cfg["train"]["seed"],
        "evals": evals,
    }


def seed_means(runs: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Per advantage, the mean held-out accuracy over its runs at each step every one of them
    evaluated."""
    out: dict[str, dict[int, float]] = {}
    by_adv: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        if run["evals"]:  # a run never evaluated would leave its estimator no common step
            by_adv[run["advantage"]].append(run)
    for adv, group in by_adv.items():
        per_run = [{s: r["eval/accuracy"] for s, _, r in run["evals"]} for run in group]
        common = sorted(set.intersection(*(set(p) for p in per_run)))
        out[adv] = {s: sum(p[s] for p in per_run) / len(per_run) for s in common}
    return out


def _failed(row: dict[str, Any]) -> str:
    """`` (N failed)`` for an evaluation with failed episodes, else ``""``."""
    n = row.get("eval/failed", 0)
    return f" ({n:g} failed)" if n > 0 else ""


def table(runs: list[dict[str, Any]]) -> str:
    unevaluated = [r["name"] for r in runs if not r["evals"]]
    runs = [r for r in runs if r["evals"]]
    means = seed_means(runs)
    steps = sorted({s for run in runs for s, _, _ in run["evals"]})
    head = ["step", *(r["name"] for r in runs), *(f"mean {a}" for a in means)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for step in steps:
        cells = [str(step)]
        for run in runs:
            row = {s: r for s, _, r in run["evals"]}.get(step)
            cells.append("" if row is None else f"{row['eval/accuracy']:.3f}{_failed(row)}")
        cells += [f"{m[step]:.4f}" if step in m else "" for m in means.values()]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| run | step | " + " | ".join(TOOL_KEYS) + " |", "|" + "---|" * (2 + len(TOOL_KEYS))]
    for run in runs:
        for step, _, row in (run["evals"][0], run["evals"][-1]):
            figures = " | ".join(f"{row.get(k, float('nan')):.3f}" for k in TOOL_KEYS.values())
            lines.append(f"| {run['name']} | {step}{_failed(row)} | {figures} |")
    if any(_failed(row) for run in runs for _, _, row in run["evals"]):
        lines += ["", "(N failed): eval/failed > 0, N held-out episodes failed (misses in the accuracy)."]
    if unevaluated:
        lines += ["", "No evaluation row (not in the tables): " + ", ".join(unevaluated) + "."]
    return "\n".join(lines)


# The plot's panels: (metric key, y-axis title, x axis: "step" or the wall clock of the row).
PANELS = (
    ("eval/accuracy", "held-out accuracy", "step"),
    ("eval/accuracy", "held-out accuracy", "wall clock (s)"),
    (TOOL_KEYS["tool_error_rate"], "held-out tool error rate", "step"),
    (TOOL_KEYS["turns"], "held-out turns / episode", "step"),
)


def plot(runs: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(18, 4.4))
    colors = {a: f"C{i}" for i, a in enumerate(sorted({r["advantage"] for r in runs}))}
    for ax, (key, title, x) in zip(axes, PANELS, strict=True):
        for run in runs:
            if not run["evals"]:
                continue
            style = {
                "color": colors[run["advantage"]],
                "ls": "-" if run["seed"] == 0 else "--",
                "label": run["name"],
            }
            xs = [s if x == "step" else w for s, w, _ in run["evals"]]
            ax.plot(xs, [r.get(key, float("nan")) for _, _, r in run["evals"]], marker="o", ms=3, **style)
        ax.set_xlabel(x)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        if x != "step":
            ax.set_title("runs sharing one GPU ran under different load:\nnot a speed comparison", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=None, help="PNG path (default: no plot)")
    args = p.parse_args(argv)
    for d in args.run_dirs:
        if not is_run(d):
            print(f"compare_runs.py: skipped {d}: not a run directory (no config.yaml)", file=sys.stderr)
    dirs = [d for d in args.run_dirs if is_run(d)]
    if not dirs:
        p.error("no run directory (a directory with a config.yaml) among the arguments")
    runs = sorted((load_run(d) for d in dirs), key=lambda r: (r["advantage"], r["seed"]))
    text = table(runs)
    print(text)
    if args.out:
        plot(runs, args.out)
        print(f"wrote {args.out}", file=sys.stderr)  # stdout is the markdown alone (compare.md)
    return text


if __name__ == "__main__":
    main()
