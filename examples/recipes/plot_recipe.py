"""Tool-use curves of a recipe run, read from its output directory (no GPU, no model).

    python examples/recipes/plot_recipe.py runs/recipes/retool_cpu [--out curves.png]

Reads ``metrics.jsonl`` (train reward, held-out score by step), ``traces.jsonl`` (training episodes;
the recipes set ``train.trace_fraction: 1.0`` so every episode is there) and ``eval_traces.jsonl``
(every held-out episode; one collector call per evaluation). Per training step and per evaluation
it computes, from the episodes' messages and final ``info``:

* ``tool_rate``: share of episodes with at least one tool call (the collector's
  ``info["tool_results_total"]``: one ``tool`` message per call attempt, malformed calls included; in
  Search-v0's tags mode, a search, read from ``info["searches"]``);
* ``calls``: tool calls per episode; ``turns``: assistant turns per episode;
* ``tool_error_rate``: share of tool results that are errors (``info["tool_errors_total"]``:
  unparseable call, unknown tool, bad arguments, failed search, a sandbox status other than ``ok``);
* ``accuracy``: share of ``Trajectory.success``; ``f1``: mean ``info["f1"]`` where the env gives it.

Writes ``curves.png`` (4 small panels) and ``tool_metrics.json`` next to the run's files (or
``--out``), and prints the held-out figures before and after training.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.is_file():
        return
    with path.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def episode_stats(trace: dict[str, Any]) -> dict[str, float]:
    """Tool figures of one traced episode (see the module docstring)."""
    info = trace.get("info") or {}
    # The collector's counters: one `tool` message answers each call attempt, malformed ones included
    # (the opening messages, e.g. a worked example, are not counted); errors are the env's
    # ``tool_errors`` (unparseable call, unknown tool, bad arguments, a sandbox status other than ok).
    calls = int(info.get("tool_results_total", 0))
    errors = int(info.get("tool_errors_total", 0))
    results = calls
    if not calls and info.get("searches"):  # Search-v0 tags mode: searches are not tool calls
        calls = int(info["searches"])
    out = {
        "tool_rate": float(calls > 0),
        "calls": float(calls),
        "turns": float(len(trace.get("finish_reasons") or [])),
        "tool_results": float(results),
        "tool_errors": float(errors),
        "reward": float(trace.get("reward", 0.0)),
    }
    if trace.get("success") is not None:
        out["accuracy"] = float(trace["success"])
    if "f1" in info:
        out["f1"] = float(info["f1"])
    if "em" in info:
        out["em"] = float(info["em"])
    return out


def summarise(episodes: Iterable[dict[str, float]]) -> dict[str, float]:
    """Means over episodes; ``tool_error_rate`` is errors over all tool results (0 when none)."""
    eps = list(episodes)
    if not eps:
        return {}
    out: dict[str, float] = {"episodes": float(len(eps))}
    for key in ("tool_rate", "calls", "turns", "reward", "accuracy", "f1", "em"):
        vals = [e[key] for e in eps if key in e]
        if vals:
            out[key] = sum(vals) / len(vals)
    results = sum(e["tool_results"] for e in eps)
    out["tool_error_rate"] = sum(e["tool_errors"] for e in eps) / results if results else 0.0
    return out


def by_batch(traces: Iterable[dict[str, Any]]) -> list[dict[str, float]]:
    """One summary per collector call (``batch``), in call order."""
    groups: dict[int, list[dict[str, float]]] = defaultdict(list)
    for t in traces:
        groups[int(t.get("batch", 0))].append(episode_stats(t))
    return [summarise(groups[b]) for b in sorted(groups)]


def recipe_metrics(run_dir: Path) -> dict[str, Any]:
    """``{"train": [per step], "eval": [per evaluation, with its "step"]}`` of a run directory."""
    metrics = list(read_jsonl(run_dir / "metrics.jsonl"))
    train = by_batch(read_jsonl(run_dir / "traces.jsonl"))
    for i, row in enumerate(train, 1):
        row["step"] = i
    evals = by_batch(read_jsonl(run_dir / "eval_traces.jsonl"))
    eval_steps = [m["step"] for m in metrics if "eval/score" in m]
    for row, step in zip(evals, eval_steps, strict=False):
        row["step"] = step
    return {"train": train, "eval": evals, "metrics": metrics}


def plot(data: dict[str, Any], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, evals = data["train"], data["eval"]
    fig, axes = plt.subplots(1, 4, figsize=(13, 2.8), dpi=70)

    def line(ax: Any, rows: list[dict[str, float]], key: str, label: str, **kw: Any) -> None:
        pts = [(r["step"], r[key]) for r in rows if key in r and "step" in r]
        if pts:
            ax.plot(*zip(*pts, strict=True), label=label, **kw)

    line(axes[0], train, "reward", "train reward")
    line(axes[0], train, "accuracy", "train accuracy")
    axes[0].set_title("reward (train)")
    line(axes[1], train, "tool_rate", "train")
    line(axes[1], evals, "tool_rate", "held-out", marker="o")
    axes[1].set_title("episodes with a tool call")
    line(axes[2], train, "turns", "turns / episode")
    line(axes[2], train, "calls", "calls / episode")
    line(axes[2], train, "tool_error_rate", "tool error rate")
    axes[2].set_title("turns, calls, errors (train)")
    line(axes[3], evals, "accuracy", "held-out accuracy (EM)", marker="o")
    line(axes[3], evals, "f1", "held-out F1", marker="o")
    axes[3].set_title("held-out")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, default=None, help="PNG path (default RUN_DIR/curves.png)")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    data = recipe_metrics(args.run_dir)
    if not data["train"] and not data["eval"]:
        raise SystemExit(f"{args.run_dir}: no traces.jsonl / eval_traces.jsonl to read")
    out = args.out or args.run_dir / "curves.png"
    plot(data, out, args.title or args.run_dir.name)
    summary = {"train": data["train"], "eval": data["eval"]}
    (args.run_dir / "tool_metrics.json").write_text(json.dumps(summary, indent=1))
    if data["eval"]:
        for name, row in (("before", data["eval"][0]), ("after", data["eval"][-1])):
            figures = ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k not in ("episodes", "step"))
            print(f"held-out {name} (step {row.get('step')}, {int(row['episodes'])} tasks): {figures}")
    print(f"wrote {out}")
    return summary


if __name__ == "__main__":
    main()
