"""FreshQA (Vu et al. 2023, "FreshLLMs: Refreshing Large Language Models with Search Engine
Augmentation", arXiv:2310.03214), 2024-12-18 release, as an eval-only open-search question set.

Read from ``inspect-evals==0.26.0`` (``inspect_evals/abstention_bench/data/freshqa/
FreshQA_v12182024.csv``, installed with ``pip install --no-deps``). Many answers are newer than
the bundled Wikipedia corpus, so this set measures searching and abstaining, not recall of the
corpus. There is no training split: FreshQA's own ``TEST`` and ``DEV`` splits are exposed as
``test`` and ``dev``.
"""

from __future__ import annotations

import csv
import functools
from typing import Any

from chatgym.package_files import locate_package_file

FRESHQA_DIST = "inspect-evals"
FRESHQA_FILE = "inspect_evals/abstention_bench/data/freshqa/FreshQA_v12182024.csv"
SPLITS = {"test": "TEST", "dev": "DEV"}


@functools.lru_cache(maxsize=1)
def _rows() -> tuple[dict[str, str], ...]:
    path = locate_package_file(FRESHQA_DIST, FRESHQA_FILE, "0.26.0")
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().splitlines(keepends=True)
    # The CSV opens with a warning line and a blank line before the header.
    header_at = next(i for i, line in enumerate(lines) if line.startswith("id,split,question"))
    return tuple(csv.DictReader(lines[header_at:]))


def load_freshqa(split: str = "test", *, include_false_premise: bool = False) -> list[dict[str, Any]]:
    """FreshQA questions of one split, in file order.

    Each row: ``task_id`` (``freshqa/<id>``), ``question``, ``answers`` (every non-empty
    ``answer_i``), ``type`` (FreshQA's fact type: never/slow/fast-changing), ``hops`` (1 or 2),
    ``false_premise``, ``support`` (``[]``: answers are not tied to corpus documents).

    Args:
        split: ``"test"`` or ``"dev"``.
        include_false_premise: keep questions built on a false premise (their reference answers
            are corrections such as "No animal has ever landed on the moon", which exact match
            cannot score).

    Raises:
        ValueError: ``split`` is ``train`` or unknown (FreshQA is eval-only).
        FileNotFoundError: ``inspect-evals`` is not installed.
    """
    if split not in SPLITS:
        raise ValueError(f"FreshQA is eval-only: split must be one of {sorted(SPLITS)}, got {split!r}")
    out = []
    for r in _rows():
        if r["split"] != SPLITS[split]:
            continue
        false_premise = r["false_premise"].strip().upper() == "TRUE"
        if false_premise and not include_false_premise:
            continue
        answers = [r[f"answer_{i}"].strip() for i in range(10) if r.get(f"answer_{i}", "").strip()]
        if not answers:
            continue
        out.append(
            {
                "task_id": f"freshqa/{r['id']}",
                "question": r["question"].strip(),
                "answers": answers,
                "type": r["fact_type"],
                "hops": 2 if r["num_hops"] == "multi-hop" else 1,
                "false_premise": false_premise,
                "support": [],
            }
        )
    return out
