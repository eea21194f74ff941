"""Least-loaded routing of episodes to engine replicas, with per-replica metrics.

An episode runs whole inside one rollout worker (reset, every turn's generate call, every env step),
so it stays on its replica for all its turns and the replica's prefix cache serves each next turn.
The router picks the replica for each new episode: the one with the fewest outstanding episodes
among those below ``capacity`` (ties: the lowest index). The driver knows an episode's length only
after it ran, so outstanding episodes — not tokens — are the load signal; the tokens each replica
served are counted for the metrics. With a capacity, episodes beyond it wait in the driver and each
goes to the first replica that frees a slot, so a faster replica takes more of them.

Metrics per replica ``i`` (:meth:`Router.metrics`, prefix ``rollout/worker{i}/``): ``episodes``
(finished there), ``requests`` (generate calls = turns), ``gen_tokens``, ``tokens`` (trajectory
lengths), ``max_outstanding`` (its longest queue), ``busy_s`` (wall time with at least one episode
outstanding), ``retried`` (episodes taken back after it failed).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass


@dataclass
class ReplicaStats:
    """Counters of one replica (see the module docstring)."""

    assigned: int = 0
    outstanding: int = 0
    max_outstanding: int = 0
    episodes: int = 0
    requests: int = 0
    gen_tokens: int = 0
    tokens: int = 0
    retried: int = 0
    busy_s: float = 0.0
    busy_since: float | None = None


class Router:
    """Least-loaded choice among ``n`` replicas.

    Args:
        n: number of replicas (>= 1).
        capacity: most outstanding episodes per replica (None: no cap).

    Raises:
        ValueError: ``n`` < 1 or ``capacity`` < 1.
    """

    def __init__(self, n: int, capacity: int | None = None):
        if n < 1:
            raise ValueError(f"a router needs at least one replica, got {n}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1 or None, got {capacity}")
        self.capacity = capacity
        self.replicas = [ReplicaStats() for _ in range(n)]

    def pick(self, exclude: Collection[int] = ()) -> int | None:
        """The least-loaded replica with a free slot, not in ``exclude``; None when there is none."""
        best: int | None = None
        for i, r in enumerate(self.replicas):
            if i in exclude or (self.capacity is not None and r.outstanding >= self.capacity):
                continue
            if best is None or r.outstanding < self.replicas[best].outstanding:
                best = i
        return best

    def start(self, i: int) -> None:
        """Episode sent to replica ``i``."""
        r = self.replicas[i]
        if r.outstanding == 0:
            r.busy_since = time.perf_counter()
        r.assigned += 1
        r.outstanding += 1
        r.max_outstanding = max(r.max_outstanding, r.outstanding)

    def finish(self, i: int, *, turns: int = 0, gen_tokens: int = 0, tokens: int = 0) -> None:
        """Episode done on replica ``i`` after ``turns`` generate calls."""
        r = self.replicas[i]
        self._leave(r)
        r.episodes += 1
        r.requests += turns
        r.gen_tokens += gen_tokens
        r.tokens += tokens

    def fail(self, i: int) -> None:
        """Episode taken back from replica ``i`` (it died or refused); it will run elsewhere."""
        r = self.replicas[i]
        self._leave(r)
        r.retried += 1

    def _leave(self, r: ReplicaStats) -> None:
        if r.outstanding <= 0:
            raise RuntimeError("router: an episode finished on a replica with none outstanding")
        r.outstanding -= 1
        if r.outstanding == 0 and r.busy_since is not None:
            r.busy_s += time.perf_counter() - r.busy_since
            r.busy_since = None

    def metrics(self, prefix: str = "rollout/") -> dict[str, float]:
        """The per-replica counters as flat metrics (``{prefix}worker{i}/{name}``)."""
        out: dict[str, float] = {}
        for i, r in enumerate(self.replicas):
            busy = r.busy_s + (time.perf_counter() - r.busy_since if r.busy_since is not None else 0.0)
            for name, value in (
                ("episodes", r.episodes),
                ("requests", r.requests),
                ("gen_tokens", r.gen_tokens),
                ("tokens", r.tokens),
                ("max_outstanding", r.max_outstanding),
                ("busy_s", busy),
                ("retried", r.retried),
            ):
                out[f"{prefix}worker{i}/{name}"] = float(value)
        return out

    def reset_counters(self) -> None:
        """Zero the per-step counters (outstanding episodes are kept)."""
        for r in self.replicas:
            keep = r.outstanding
            r.__init__()  # type: ignore[misc]
            r.outstanding = r.max_outstanding = keep
            if keep:
                r.busy_since = time.perf_counter()
