"""Compare a recipe's runs (advantage estimators x seeds) from their ``metrics.jsonl`` alone.

    python examples/recipes/compare_runs.py runs/recipes/arith_chain_gpu_*  [--out compare.png]

Each run directory's ``config.yaml`` names its ``algo.advantage`` and ``train.seed``. Prints a
markdown table of held-out accuracy at every evaluated step (one column per run, then the mean of
each estimator's seeds at the steps all of its runs reached), the held-out tool figures at the
first and last evaluation (``eval/tools/episodes_with_call_frac``, ``eval/tools/calls_per_episode``,
``eval/episode/turns_mean``, ``eval/tools/error_rate``), and draws held-out accuracy against steps
and against wall clock (seconds: the sum of ``timing/step_s`` and ``timing/eval_s`` up to the row),
the tool error rate and turns per episode against steps into ``--out``.
"""

from __future__ import annotations

import argparse
import json
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


def load_run(run_dir: Path) -> dict[str, Any]:
    """One run: its name, advantage, seed, evaluations ``[(step, wall_s, row)]`` in step order.

    Raises FileNotFoundError when ``run_dir`` has no ``metrics.jsonl`` or ``config.yaml``."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    wall = 0.0
    evals = []
    for row in rows:
        wall += row.get("timing/step_s", 0.0) + row.get("timing/eval_s", 0.0)
        if "eval/accuracy" in row:
            evals.append((row["step"], wall, row))
    return {
        "name": run_dir.name,
        "advantage": cfg["algo"]["advantage"],
        "seed": cfg["train"]["seed"],
        "evals": evals,
        "steps_run": max((r["step"] for r in rows), default=0),
    }


def seed_means(runs: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Per advantage, the mean held-out accuracy over its runs at each step every one of them
    evaluated."""
    out: dict[str, dict[int, float]] = {}
    by_adv: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        by_adv[run["advantage"]].append(run)
    for adv, group in by_adv.items():
        per_run = [{s: r["eval/accuracy"] for s, _, r in run["evals"]} for run in group]
        common = sorted(set.intersection(*(set(p) for p in per_run)))
        out[adv] = {s: sum(p[s] for p in per_run) / len(per_run) for s in common}
    return out


def table(runs: list[dict[str, Any]]) -> str:
    means = seed_means(runs)
    steps = sorted({s for run in runs for s, _, _ in run["evals"]})
    head = ["step", *(r["name"] for r in runs), *(f"mean {a}" for a in means)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for step in steps:
        cells = [str(step)]
        for run in runs:
            acc = {s: r["eval/accuracy"] for s, _, r in run["evals"]}
            cells.append(f"{acc[step]:.3f}" if step in acc else "")
        cells += [f"{m[step]:.4f}" if step in m else "" for m in means.values()]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| run | step | " + " | ".join(TOOL_KEYS) + " |", "|" + "---|" * (2 + len(TOOL_KEYS))]
    for run in runs:
        for step, _, row in (run["evals"][0], run["evals"][-1]):
            lines.append(f"| {run['name']} | {step} | " + " | ".join(f"{row[k]:.3f}" for k in TOOL_KEYS.values()) + " |")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    colors = {a: f"C{i}" for i, a in enumerate(sorted({r["advantage"] for r in runs}))}
    for run in runs:
        style = {"color": colors[run["advantage"]], "ls": "-" if run["seed"] == 0 else "--", "label": run["name"]}
        steps = [s for s, _, _ in run["evals"]]
        axes[0].plot(steps, [r["eval/accuracy"] for _, _, r in run["evals"]], marker="o", ms=3, **style)
        axes[1].plot([w for _, w, _ in run["evals"]], [r["eval/accuracy"] for _, _, r in run["evals"]], marker="o", ms=3, **style)
        axes[2].plot(steps, [r[TOOL_KEYS["tool_error_rate"]] for _, _, r in run["evals"]], marker="o", ms=3, **style)
        axes[3].plot(steps, [r[TOOL_KEYS["turns"]] for _, _, r in run["evals"]], marker="o", ms=3, **style)
    for ax, (x, y) in zip(axes, [("step", "held-out accuracy"), ("wall clock (s)", "held-out accuracy"),
                                 ("step", "held-out tool error rate"), ("step", "held-out turns / episode")], strict=True):
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=None, help="PNG path (default: no plot)")
    args = p.parse_args(argv)
    runs = sorted((load_run(d) for d in args.run_dirs), key=lambda r: (r["advantage"], r["seed"]))
    text = table(runs)
    print(text)
    if args.out:
        plot(runs, args.out)
        print(f"wrote {args.out}")
    return text


if __name__ == "__main__":
    main()
