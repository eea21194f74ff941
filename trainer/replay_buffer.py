"""The replay buffer of the asynchronous pipelines: finished groups wait here for the learner.

One entry is one *group*: the G trajectories of one task of one rollout step (GRPO's unit; a group
is trained on whole or not at all). The buffer is bounded (``capacity`` groups; a put past it evicts
by the buffer's order, oldest first under FIFO), ordered FIFO by default, or by a priority such as
``reward_variance`` (groups whose rewards differ first: DAPO's dynamic sampling without discarding).
Every trajectory keeps its per-token ``weight_versions``, so the staleness of a group is known when
the learner takes it (:meth:`ReplayBuffer.drop_stale`).

``state_dict`` / ``load_state_dict`` carry the whole buffer (entries, arrival counter, counters) so a
run resumed from a checkpoint takes the same next batch. With ``spill_dir`` the groups' trajectories
live on disk (one JSON file per group; only metadata in memory): the buffer survives the process and
can be re-opened with :meth:`ReplayBuffer.open_spilled` (peers: AReaL's and verl's persistable data
pools, SkyRL's async trainer buffer).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from chatgym.trainer.rollout.trace import jsonable
from chatgym.trainer.rollout.types import Trajectory


@dataclass
class GroupEntry:
    """One finished group.

    Attributes:
        step: the rollout step whose task grid the group belongs to (``RolloutRequest.step``).
        group_id: the group's position in that grid (``RolloutRequest.groups`` entry).
        trajectories: the group's trajectories ordered by ``sample_index`` (failed ones included);
            None while spilled to disk.
        issued_version: the rollout weight version when the group's request was issued (the version
            of a group that generated no token at all).
        seq: arrival number in the buffer (set by :meth:`ReplayBuffer.put`; -1 before).
        min_version, max_version: oldest / newest weight version over the group's generated tokens
            (``issued_version`` when none); filled from the trajectories at construction.
        reward_variance: population variance of the rewards of the group's non-failed trajectories
            (0.0 with fewer than two).
    """

    step: int
    group_id: int
    trajectories: list[Trajectory] | None
    issued_version: int = 0
    seq: int = -1
    min_version: int = -1
    max_version: int = -1
    reward_variance: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.trajectories is not None and self.min_version < 0:
            versions = [v for t in self.trajectories for v in t.weight_versions if v >= 0]
            self.min_version = min(versions, default=self.issued_version)
            self.max_version = max(versions, default=self.issued_version)
            rewards = [t.reward for t in self.trajectories if not t.failed]
            self.reward_variance = float(np.var(rewards)) if len(rewards) > 1 else 0.0

    @property
    def key(self) -> tuple[int, int]:
        return (self.step, self.group_id)

    def staleness(self, version: int) -> int:
        """How many weight versions older than ``version`` the group's oldest token is."""
        return version - self.min_version

    def meta_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trajectories"}


def _fifo(entry: GroupEntry) -> tuple:
    return (entry.seq,)


def _reward_variance(entry: GroupEntry) -> tuple:
    # Informative groups (rewards differ: a non-zero GRPO advantage) first, FIFO within each class.
    return (entry.reward_variance == 0.0, entry.seq)


PRIORITIES: dict[str, Callable[[GroupEntry], tuple]] = {"fifo": _fifo, "reward_variance": _reward_variance}


def trajectory_from_json(record: dict[str, Any]) -> Trajectory:
    """Inverse of ``Trajectory.to_json`` (unknown keys, e.g. a trace's ``batch``, are ignored), and of
    :func:`trajectory_record`: its ``image_store_png`` (``{sha256: PNG data URL}``) becomes the
    trajectory's ``image_store`` again."""
    names = {f.name for f in fields(Trajectory)}
    traj = Trajectory(**{k: v for k, v in record.items() if k in names})
    stored = record.get("image_store_png")
    if stored:
        from chatgym.trainer.chat.images import decode_image

        traj.image_store = {ref: decode_image(url) for ref, url in stored.items()}
    return traj


def trajectory_record(traj: Trajectory) -> dict[str, Any]:
    """``traj.to_json()`` plus its images as lossless PNG data URLs (``image_store_png``), so a group
    spilled to disk or saved in a checkpoint comes back with the pixels the learner trains on (a
    trace keeps refs only)."""
    record = traj.to_json()
    if traj.image_store:
        from chatgym.trainer.chat.images import encode_data_url

        record["image_store_png"] = {ref: encode_data_url(img) for ref, img in traj.image_store.items()}
    return record


class ReplayBuffer:
    """Bounded buffer of finished groups.

    Args:
        capacity: most groups held (>= 1). A put past it evicts one group: under ``fifo`` the
            oldest arrival (the stalest: the staleness bound would drop it first anyway), under a
            priority the group :meth:`take` would reach last.
        priority: ``fifo`` (arrival order) or ``reward_variance`` (groups with differing rewards
            first, FIFO within each class).
        spill_dir: keep trajectories on disk (``<spill_dir>/<step>_<group>.json``) instead of in
            memory; None: in memory.

    Raises:
        ValueError: ``capacity < 1`` or an unknown ``priority`` (the known ones are named).
    """

    def __init__(self, capacity: int, priority: str = "fifo", spill_dir: str | os.PathLike | None = None):
        if capacity < 1:
            raise ValueError(f"replay buffer capacity must be >= 1, got {capacity}")
        if priority not in PRIORITIES:
            raise ValueError(f"unknown replay buffer priority {priority!r}; known: {', '.join(PRIORITIES)}")
        self.capacity = capacity
        self.priority = priority
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        if self.spill_dir is not None:
            self.spill_dir.mkdir(parents=True, exist_ok=True)
        self._entries: dict[tuple[int, int], GroupEntry] = {}
        self._seq = 0
        self.evicted = 0  # groups pushed out by capacity since the start (checkpointed)
        self.dropped_stale = 0  # groups dropped by the staleness bound since the start (checkpointed)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._entries

    def keys(self) -> list[tuple[int, int]]:
        """Keys ``(step, group_id)`` in the order :meth:`take` would return them."""
        return [e.key for e in self._ordered()]

    def _ordered(self) -> list[GroupEntry]:
        return sorted(self._entries.values(), key=PRIORITIES[self.priority])

    def put(self, entry: GroupEntry) -> list[GroupEntry]:
        """Add a finished group; returns the groups evicted to stay within ``capacity`` (with their
        trajectories). Raises ValueError for a key already in the buffer (a group counted twice)."""
        if entry.key in self._entries:
            raise ValueError(f"group {entry.key} is already in the replay buffer")
        entry.seq = self._seq
        self._seq += 1
        if self.spill_dir is not None and entry.trajectories is not None:
            self._write(entry)
            entry.trajectories = None
        self._entries[entry.key] = entry
        evicted = []
        while len(self._entries) > self.capacity:
            # FIFO evicts the oldest arrival; a priority evicts what it would take last.
            victim = (
                min(self._entries.values(), key=_fifo) if self.priority == "fifo" else self._ordered()[-1]
            )
            evicted.append(self._pop(victim.key))
            self.evicted += 1
        return evicted

    def take(self, n: int) -> list[GroupEntry]:
        """Remove and return up to ``n`` groups in the buffer's order (with their trajectories)."""
        return [self._pop(e.key) for e in self._ordered()[: max(n, 0)]]

    def drop_stale(self, version: int, max_staleness: int) -> list[GroupEntry]:
        """Remove and return the groups whose oldest token is more than ``max_staleness`` versions
        older than ``version``."""
        stale = [e.key for e in self._ordered() if e.staleness(version) > max_staleness]
        self.dropped_stale += len(stale)
        return [self._pop(k) for k in stale]

    def staleness(self, version: int) -> list[int]:
        """Staleness of each held group against ``version``, in take order."""
        return [e.staleness(version) for e in self._ordered()]

    def _pop(self, key: tuple[int, int]) -> GroupEntry:
        entry = self._entries.pop(key)
        if entry.trajectories is None:
            entry.trajectories = self._read(entry)
            self._path(entry).unlink(missing_ok=True)
        return entry

    # ---- disk -----------------------------------------------------------------------------------

    def _path(self, entry: GroupEntry) -> Path:
        assert self.spill_dir is not None
        return self.spill_dir / f"{entry.step:08d}_{entry.group_id:06d}.json"

    def _write(self, entry: GroupEntry) -> None:
        path = self._path(entry)
        record = {"meta": entry.meta_dict(), "trajectories": [trajectory_record(t) for t in entry.trajectories or []]}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, default=jsonable))
        os.replace(tmp, path)  # a crash never leaves a half-written group file

    def _read(self, entry: GroupEntry) -> list[Trajectory]:
        if self.spill_dir is None:
            raise RuntimeError(f"group {entry.key} has no trajectories and the buffer does not spill")
        record = json.loads(self._path(entry).read_text())
        return [trajectory_from_json(r) for r in record["trajectories"]]

    @classmethod
    def open_spilled(
        cls, spill_dir: str | os.PathLike, capacity: int, priority: str = "fifo"
    ) -> ReplayBuffer:
        """Re-open the groups a spilling buffer left in ``spill_dir`` (arrival order kept)."""
        buf = cls(capacity, priority, spill_dir)
        metas = []
        for path in sorted(buf.spill_dir.glob("*.json")):  # type: ignore[union-attr]
            metas.append(json.loads(path.read_text())["meta"])
        for meta in sorted(metas, key=lambda m: m["seq"]):
            entry = GroupEntry(trajectories=None, **meta)
            buf._entries[entry.key] = entry
            buf._seq = max(buf._seq, entry.seq + 1)
        return buf

    # ---- checkpoints ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue with the same buffer: the entries (trajectories read back
        from disk when spilled), the arrival counter and the drop counters. Picklable (the
        checkpoint's ``trainer_state.pt``)."""
        entries = []
        for e in self._ordered():
            trajs = e.trajectories if e.trajectories is not None else self._read(e)
            entries.append({"meta": e.meta_dict(), "trajectories": [trajectory_record(t) for t in trajs]})
        return {
            "capacity": self.capacity,
            "priority": self.priority,
            "seq": self._seq,
            "evicted": self.evicted,
            "dropped_stale": self.dropped_stale,
            "entries": entries,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the buffer's contents by ``state`` (from :meth:`state_dict`); capacity and
        priority stay this buffer's own (a resumed run may change them)."""
        for key in list(self._entries):
            self._pop(key)
        for record in state["entries"]:
            entry = GroupEntry(
                trajectories=[trajectory_from_json(r) for r in record["trajectories"]], **record["meta"]
            )
            if self.spill_dir is not None:
                self._write(entry)
                entry.trajectories = None
            self._entries[entry.key] = entry
        self._seq = int(state["seq"])
        self.evicted = int(state.get("evicted", 0))
        self.dropped_stale = int(state.get("dropped_stale", 0))


def entries_from_trajectories(
    trajs: Iterable[Trajectory], step: int, issued_version: int, groups: Iterable[int] | None = None
) -> list[GroupEntry]:
    """Split one request's trajectories (ordered by (group_id, sample_index)) into group entries."""
    by_group: dict[int, list[Trajectory]] = {}
    for t in trajs:
        by_group.setdefault(t.group_id, []).append(t)
    ids = sorted(by_group) if groups is None else list(groups)
    return [
        GroupEntry(step, g, sorted(by_group.get(g, []), key=lambda t: t.sample_index), issued_version)
        for g in ids
    ]


def staleness_metrics(entries: Sequence[GroupEntry], version: int) -> dict[str, float]:
    """The staleness distribution of a batch's groups against the learner ``version``.

    ``staleness/mean|min|max`` over groups (a group's staleness: ``version`` minus its oldest token's
    version), ``staleness/groups_<k>``: how many groups were k versions old, and
    ``staleness/offpolicy_token_frac``: the share of generated tokens sampled by older weights.
    """
    if not entries:
        return {}
    ages = [e.staleness(version) for e in entries]
    out: dict[str, float] = {
        "staleness/mean": sum(ages) / len(ages),
        "staleness/min": float(min(ages)),
        "staleness/max": float(max(ages)),
    }
    for k in sorted(set(ages)):
        out[f"staleness/groups_{k}"] = float(ages.count(k))
    versions = [v for e in entries for t in e.trajectories or () for v in t.weight_versions if v >= 0]
    out["staleness/offpolicy_token_frac"] = (
        sum(v < version for v in versions) / len(versions) if versions else 0.0
    )
    return out
