"""The counts of one ``Collector.collect`` call (:class:`CollectStats`), from its trajectories."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from chatgym.trainer.rollout.types import Trajectory


@dataclass
class CollectStats:
    """Counts of one ``collect`` call.

    Attributes:
        episodes: trajectories returned.
        failed: trajectories with ``error`` set; ``failed_by_kind`` splits them (``timeout``,
            ``env_error``, ``engine_error``, ``engine_abort``, ``template_error``, ``image_error``,
            ``internal_error``).
        truncated: trajectories ended by a budget or the env's limit; ``truncated_by`` splits them.
        turns, generated_tokens, total_tokens: sums over trajectories.
        wall_s: seconds from the call to the last trajectory.
        generated_tokens_per_s: ``generated_tokens / wall_s``.
        mean_reward: mean ``reward`` of the trajectories that did not fail (0.0 if none).
    """

    episodes: int = 0
    failed: int = 0
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    truncated: int = 0
    truncated_by: dict[str, int] = field(default_factory=dict)
    turns: int = 0
    generated_tokens: int = 0
    total_tokens: int = 0
    wall_s: float = 0.0
    generated_tokens_per_s: float = 0.0
    mean_reward: float = 0.0


def summarize(trajectories: Sequence[Trajectory], wall_s: float) -> CollectStats:
    """:class:`CollectStats` of ``trajectories`` collected in ``wall_s`` seconds."""
    ok = [t for t in trajectories if not t.failed]
    generated = sum(t.response_tokens for t in trajectories)
    return CollectStats(
        episodes=len(trajectories),
        failed=len(trajectories) - len(ok),
        failed_by_kind=dict(Counter(t.info.get("error_kind", "unknown") for t in trajectories if t.failed)),
        truncated=sum(t.truncated for t in trajectories),
        truncated_by=dict(Counter(t.info.get("truncated_by", "env") for t in trajectories if t.truncated)),
        turns=sum(t.num_turns for t in trajectories),
        generated_tokens=generated,
        total_tokens=sum(len(t.token_ids) for t in trajectories),
        wall_s=wall_s,
        generated_tokens_per_s=generated / wall_s if wall_s > 0 else 0.0,
        mean_reward=sum(t.reward for t in ok) / len(ok) if ok else 0.0,
    )
