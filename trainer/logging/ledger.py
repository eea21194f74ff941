"""``batches.jsonl``: which prompt groups each learner update trained on, one JSON line per step.

    {"step": 3, "version": 3, "groups": [[1, 0], [2, 1]], "tasks": [17, 4]}

``step`` is the 1-based step of the update (the row of ``metrics.jsonl`` with the same ``step``),
``version`` the policy version after it, ``groups`` the ``[rollout step, group]`` of
each group of the batch in the order the learner saw them (``async``: groups of several rollout
steps; a group is one task of ``tasks_for_step(rollout step)``, its G samples), ``tasks`` their task
ids. A run resumed from the checkpoint of step ``c`` drops the rows after ``c`` (their updates are
not in the checkpoint's weights) and writes them again, so the file of a finished run lists every
update of its final weights exactly once, whatever was killed on the way: the union of its groups is
what the run trained on (each group once, unless the data repeats it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LEDGER_FILE = "batches.jsonl"


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``batches.jsonl`` (a last line cut off by a killed writer is left out).

    Raises:
        ValueError: a damaged line before the last (file and line named).
    """
    lines = Path(path).read_text().splitlines()
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON ({exc.msg})") from exc
    return rows


class BatchLedger:
    """Appends one row per update to ``<output_dir>/batches.jsonl`` (see the module docstring).

    Args:
        output_dir: the run's output directory.
        resume_step: keep only the rows of steps ``<= resume_step`` of an existing file (the
            checkpoint a resumed run starts from); None: keep none (a fresh run).

    Raises:
        ValueError: an existing file has a damaged line before its last.
    """

    def __init__(self, output_dir: str | Path, resume_step: int | None = None):
        self.path = Path(output_dir) / LEDGER_FILE
        kept = []
        if resume_step is not None and self.path.is_file():
            kept = [r for r in read_ledger(self.path) if r.get("step", 0) <= resume_step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def log(self, step: int, version: int, groups: Sequence[tuple[int, int]], tasks: Sequence[Any]) -> None:
        """Append the row of 1-based step ``step`` (written through to the OS at once: a process killed
        after this call keeps the line)."""
        row = {"step": int(step), "version": int(version), "groups": [list(g) for g in groups]}
        row["tasks"] = list(tasks)
        with self.path.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
