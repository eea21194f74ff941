"""What the visual recipe's policy does on the board, per training step and per held-out evaluation.

    python examples/recipes/visual/grid_metrics.py runs/recipes/visual_cpu [--config examples/recipes/visual/cpu.yaml]

Reads ``traces.jsonl`` / ``eval_traces.jsonl`` of a VisualGrid-v0 run (every episode: the configs set
``trace_fraction: 1``) and writes ``grid_metrics.json`` beside them, printing the held-out rows:

* ``solved``: share of episodes solved; ``turns``: assistant turns per episode;
* ``valid``: share of turns whose text holds a ``<move>`` with a direction (:func:`read_move`);
* ``first_optimal``: share of episodes whose first move is the first move of a shortest solution of
  the board (breadth-first search over the task's board) — what needs the image to be read: a policy
  that ignores the board scores about the share of boards its favourite move happens to start;
* ``moves``: how the valid moves split over up / down / left / right (a constant move shows a policy
  that does not use the image).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

_ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?)(?:<\|im_end\|>|$)", re.S)


def first_moves(board: list[str], max_moves: int) -> set[str]:
    """The first moves of every shortest solution of ``board`` (empty when none within ``max_moves``)."""
    from chatgym.envs.visual import sokoban

    start = sokoban.Board.parse(board)
    best = sokoban.solve(start, max_moves)
    if not best:
        return set()
    out = set()
    for d in sokoban.DIRECTIONS:
        after, what = start.move(d)
        rest = None if what == "blocked" else sokoban.solve(after, len(best) - 1)
        if rest is not None and len(rest) == len(best) - 1:
            out.add(d)
    return out


def batch_rows(path: Path, tasks: dict[str, Any], max_moves: int) -> list[dict[str, Any]]:
    """One row per collector batch of the trace file at ``path`` (in batch order)."""
    from chatgym.envs.visual.grid import read_move

    by_batch: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        by_batch[rec["batch"]].append(rec)
    rows = []
    for batch in sorted(by_batch):
        recs, moves, turns, valid, optimal = by_batch[batch], Counter(), 0, 0, 0
        for rec in recs:
            said = [read_move(t) for t in _ASSISTANT.findall(rec["text"])]
            turns += len(said)
            valid += sum(m is not None for m in said)
            moves.update(m for m in said if m is not None)
            split, index = rec["task_id"].split("/")[-2:]
            if said and said[0] in first_moves(tasks[split][int(index)]["board"], max_moves):
                optimal += 1
        n, total = len(recs), max(sum(moves.values()), 1)
        rows.append({
            "batch": batch, "episodes": n, "solved": sum(bool(r["success"]) for r in recs) / n, "turns": turns / n,
            "valid": valid / max(turns, 1), "first_optimal": optimal / n,
            "moves": {d: moves[d] / total for d in ("up", "down", "left", "right")},
        })
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("--config", type=Path, help="the run's config (default: the run's config.yaml)")
    args = p.parse_args(argv)
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.trainer.config.run import load_config

    cfg = load_config(args.config or args.run / "config.yaml")
    envs = {s: gym.make(cfg.env.id, split=s, **cfg.env.kwargs).unwrapped for s in ("train", "test")}
    tasks = {s: e.tasks for s, e in envs.items()}
    max_moves = 4 * int(cfg.env.kwargs.get("max_moves", 10))
    steps = [json.loads(x) for x in (args.run / "metrics.jsonl").read_text().splitlines()]
    eval_steps = [r["step"] for r in steps if "eval/score" in r]
    out: dict[str, Any] = {"train": [], "eval": []}
    if (args.run / "traces.jsonl").is_file():
        out["train"] = [{"step": i + 1, **r} for i, r in enumerate(batch_rows(args.run / "traces.jsonl", tasks, max_moves))]
    if (args.run / "eval_traces.jsonl").is_file():
        rows = batch_rows(args.run / "eval_traces.jsonl", tasks, max_moves)
        out["eval"] = [{"step": s, **r} for s, r in zip(eval_steps, rows, strict=False)]
    (args.run / "grid_metrics.json").write_text(json.dumps(out, indent=1))
    for r in out["eval"]:
        print(f"held-out step {r['step']} ({r['episodes']} boards): solved {r['solved']:.3f}, valid {r['valid']:.3f}, "
              f"first move optimal {r['first_optimal']:.3f}, turns {r['turns']:.2f}, moves {r['moves']}")
    return out


if __name__ == "__main__":
    main()
