"""JSONL traces of rollouts: one line per traced trajectory, for debugging.

Each line is the trajectory's fields (``Trajectory.to_json``: messages, token ids, loss mask,
logprobs, per-turn rewards, finish reasons, stop reasons — the stop string or EOS id that ended
each turn —, timings, info with per-turn records holding ``finish_reason`` and ``stop_reason``)
plus ``batch`` (the collector's call counter) and ``text`` (the token ids decoded with special
tokens, i.e. exactly what the model saw and wrote). Values JSON cannot hold (dataclasses, numpy scalars, sets) are converted;
anything else is written as its ``repr``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import IO, Any

from chatgym.trainer.rollout.types import Trajectory


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


class TraceWriter:
    """Appends a sampled fraction of trajectories to a JSONL file.

    Args:
        path: file to append to (its directory is created).
        fraction: probability in [0, 1] that a trajectory is written. The choice is a fixed function
            of ``(seed, batch, group_id, sample_index)``, so reruns trace the same episodes.
        seed: seed of that choice.
        tokenizer: optional; when given, each line also holds the decoded ``text``.

    Raises:
        ValueError: if ``fraction`` is outside [0, 1].
    """

    def __init__(self, path: str | os.PathLike, fraction: float = 1.0, seed: int = 0, tokenizer: Any = None):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"trace_fraction must be in [0, 1], got {fraction}")
        self.path = os.fspath(path)
        self.fraction = fraction
        self.seed = seed
        self.tokenizer = tokenizer
        self.written = 0
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        # Kept open across collect calls (one line per trajectory); closed by close().
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def selected(self, batch: int, group_id: int, sample_index: int) -> bool:
        if self.fraction >= 1.0:
            return True
        return random.Random(f"{self.seed}:{batch}:{group_id}:{sample_index}").random() < self.fraction

    def write(self, traj: Trajectory, batch: int = 0) -> bool:
        """Write ``traj`` if it is selected; returns whether it was written."""
        if self._file is None:
            raise ValueError(f"trace file {self.path} is closed")
        if not self.selected(batch, traj.group_id, traj.sample_index):
            return False
        record: dict[str, Any] = {"batch": batch, **traj.to_json()}
        if self.tokenizer is not None:
            record["text"] = self.tokenizer.decode(traj.token_ids, skip_special_tokens=False)
        self._file.write(json.dumps(record, ensure_ascii=False, default=jsonable) + "\n")
        self._file.flush()
        self.written += 1
        return True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_trace(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a JSONL trace file, in file order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
