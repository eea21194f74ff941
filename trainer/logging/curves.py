"""The learning-curve PNG: drawn from a run's ``metrics.jsonl``.

Run as a script (``python curves.py METRICS_JSONL OUT_PNG``) it is the redraw that
:meth:`~chatgym.trainer.logging.writer.MetricsLogger.plot_later` starts in a child process during training: a
redraw is 0.5-1 s of Python, and in a thread of the training process it held the GIL that the engine's
decode thread needs between GPU launches. It imports only the standard library and matplotlib, so the
child starts without chatgym's imports.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

CURVE_KEYS = (
    ("reward/mean", "reward (train)"),
    ("reward/accuracy", "accuracy (train)"),
    ("eval/score", "held-out score"),
    ("actor/kl", "KL to reference"),
    ("actor/entropy", "entropy (nats)"),
    ("response/length_mean", "response length (tokens)"),
    ("actor/clip_frac", "clip fraction"),
    ("timing/step_s", "seconds per step"),
)


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``; a last line still being written (no newline yet) is skipped.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a whole line that is not JSON (the message names the file and the line number).
    """
    lines = Path(path).read_text().split("\n")[:-1]  # what follows the last newline is not a whole row yet
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {number}: not a JSON row ({exc.msg})") from exc
    return rows


def draw(history: list[dict[str, Any]], out: str | Path) -> Path:
    """Draw the curves of :data:`CURVE_KEYS` that have data (one panel each, three per row, 100 dpi)
    into the PNG ``out``, written whole (a temporary file renamed into place); returns ``out``."""
    # The object-oriented API (no pyplot): no global figure state.
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    out = Path(out)
    panels = []
    for key, label in CURVE_KEYS:
        points = [(r["step"], r[key]) for r in history if isinstance(r.get(key), (int, float))]
        if points:
            panels.append((label, points))
    cols = 3
    rows = max(1, math.ceil(len(panels) / cols))
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, (label, points) in zip(axes.flat, panels, strict=False):
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", markersize=3)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    tmp.replace(out)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: curves.py METRICS_JSONL OUT_PNG", file=sys.stderr)
        return 2
    try:
        draw(read_history(argv[0]), argv[1])
    except Exception as exc:  # the parent keeps the last line of stderr as the error
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)  # str() of an OSError names the path
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
