"""Seeded task sequences for the visual envs: row ``i`` of a split is made on first access from
``(seed, split, i)`` alone, so a 5,000-row split costs nothing until it is read and every process
sees the same rows.

Train and test are disjoint by construction: a candidate belongs to the test split when the SHA-256 of
its key (the board, or the chart and question) falls in one eighth of the hash space, to train
otherwise; each split's row ``i`` is the first candidate of its own seed stream that falls in the split.
No held-out board or question is ever a training one, however small the space of boards.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any

SPLITS = ("train", "test")
DEFAULT_SIZES = {"train": 5000, "test": 200}
TEST_SHARE = 8  # one key in TEST_SHARE belongs to the test split
MAX_ATTEMPTS = 10_000


def check_split(name: str, split: Any) -> None:
    """ValueError unless ``split`` is one of :data:`SPLITS`; the message starts with ``name`` (an env id,
    or the task sequence's name)."""
    if not isinstance(split, str) or split not in SPLITS:
        raise ValueError(f"{name}: split must be one of {SPLITS}, got {split!r}")


def split_of(key: str) -> str:
    """``"test"`` for one key in :data:`TEST_SHARE` (by SHA-256), else ``"train"``."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "test" if digest % TEST_SHARE == 0 else "train"


class SeededTasks(Sequence[dict[str, Any]]):
    """``n`` rows made lazily by ``make(rng) -> (row, key)``; row ``i`` is the first candidate, drawn
    with ``random.Random(f"{name}/{seed}/{split}/{i}/{attempt}")``, whose ``key`` is in ``split``.
    Rows are cached and shared: treat them as read-only.

    Raises:
        ValueError: unknown split, ``n`` < 1.
        IndexError: an index outside ``[0, n)``.
        RuntimeError: no candidate of the split found in :data:`MAX_ATTEMPTS` draws (a generator
            whose settings admit almost no boards).
    """

    def __init__(
        self, name: str, split: str, n: int, seed: int, make: Callable[[random.Random], tuple[dict[str, Any], str]]
    ):
        check_split(name, split)
        if n < 1:
            raise ValueError(f"{name}: the number of tasks must be >= 1, got {n}")
        self.name, self.split, self.n, self.seed, self.make = name, split, n, seed, make
        self._row = functools.lru_cache(maxsize=None)(self._make_row)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        i = int(i)
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(f"{self.name}: task index {i} out of range ({self.n} tasks)")
        return self._row(i)

    def _make_row(self, i: int) -> dict[str, Any]:
        for attempt in range(MAX_ATTEMPTS):
            rng = random.Random(f"{self.name}/{self.seed}/{self.split}/{i}/{attempt}")
            row, key = self.make(rng)
            if split_of(key) == self.split:
                return {**row, "task_id": f"{self.name}/{self.split}/{i}"}
        raise RuntimeError(f"{self.name}: no {self.split} task found in {MAX_ATTEMPTS} draws for row {i}")
