"""A batch's turn structure for the per-turn advantage estimators
(:mod:`chatgym.trainer.algos.turn_advantages`): which turn each token belongs to, how many turns each
row has and, for GiGPO, the anchor state each turn acted in (and how often those repeat:
:func:`anchor_stats`).

**Turn boundaries** come from the collector's turn records (``info["turns"][k]["start"]``: the position
of turn k's first sampled id). Turn k owns ``[start_k, start_{k+1})`` — its sampled tokens, then the
tokens that close it and the observation after it — the prompt belongs to turn 0 and the last turn
runs to the row's end. A trajectory without records (built by hand, loaded from elsewhere) falls back
to the runs of 1s of its loss mask when there are as many runs as turn rewards. A turn that sampled
no token has no token to train; :func:`~chatgym.trainer.algos.place_rewards` then finds fewer runs than
turn rewards and puts the whole reward on the row's last generated token (an earlier turn's).

**Anchor states** (GiGPO): the state turn k acted in is named by a string key:

- ``env:<key>`` when the env said which state it is in: a step's ``info["state_key"]`` (a string,
  :func:`chatgym.trainer.rollout.episode.record_step` keeps one per step in ``info["state_keys"]``)
  names the state after that step, i.e. the one turn k+1 acts in. An env whose observations do not
  identify its state (a tool result such as ``"6"`` can follow different histories; a database whose
  contents the reply does not show) should say it, e.g. a hash of the conversation or of its data;
- otherwise ``obs:<json>``: the observation messages the policy saw just before turn k — the opening
  messages for turn 0 (shared by the whole group, which starts from one state), the messages the env
  returned after turn k-1 otherwise — as canonical JSON (role and content; images by their sha256).
  Like the authors' code, which groups on the env's current observation rather than the prompt with
  its history, it merges turns that saw the same observation after different histories.

Keys are compared within a group only; each distinct key of the batch becomes one integer id.
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from chatgym.trainer.learner.batch import TokenBatch
from chatgym.trainer.rollout.types import Trajectory


def _name(traj: Trajectory) -> str:
    return f"trajectory (task {traj.task_id!r}, group {traj.group_id}, sample {traj.sample_index})"


def turn_starts(traj: Trajectory) -> list[int]:
    """The position of each turn's first token (one per entry of ``traj.rewards``).

    Raises:
        ValueError: naming the trajectory, when neither its turn records nor its loss mask give one
            start per turn reward.
    """
    turns = len(traj.rewards)
    records = traj.info.get("turns")
    if isinstance(records, list) and len(records) == turns and all("start" in r for r in records):
        return [int(r["start"]) for r in records]
    mask = traj.loss_mask
    starts = [p for p, m in enumerate(mask) if m and (p == 0 or not mask[p - 1])]
    if len(starts) == turns:
        return starts
    raise ValueError(
        f"{_name(traj)}: per-turn advantages need one start per turn: {turns} turn rewards, "
        f"{len(records) if isinstance(records, list) else 'no'} turn records, {len(starts)} generated runs"
    )


def _observation_keys(traj: Trajectory, turns: int) -> list[str]:
    """``obs:<json>`` of the messages before each of the first ``turns`` assistant messages."""
    keys, segment = [], []
    for message in traj.messages:
        if message.get("role") == "assistant":
            keys.append("obs:" + json.dumps(segment, sort_keys=True, default=str))
            segment = []
        else:
            segment.append({"role": message.get("role"), "content": message.get("content")})
    if len(keys) < turns:
        raise ValueError(
            f"{_name(traj)}: GiGPO needs the observation before each turn: {turns} turns but "
            f"{len(keys)} assistant messages in Trajectory.messages, and no info['state_keys']"
        )
    return keys[:turns]


def state_keys(traj: Trajectory) -> list[str]:
    """The anchor-state key of each turn (see the module docstring).

    Raises:
        ValueError: naming the trajectory, when a turn has neither an env key nor a recorded
            observation (no ``Trajectory.messages``).
    """
    turns = len(traj.rewards)
    given = list(traj.info.get("state_keys") or [])
    # The env's key after step k-1 names the state of turn k; turn 0 starts from the reset.
    env = [None, *(given[k - 1] if k - 1 < len(given) else None for k in range(1, turns))][:turns]
    if traj.messages or any(e is None for e in env[1:]):
        observed = _observation_keys(traj, turns)
    else:
        observed = ["start"] * turns  # every sample of a group starts from the same reset
    return [f"env:{e}" if e is not None else o for e, o in zip(env, observed, strict=True)]


def turn_ids(trajs: Sequence[Trajectory], batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(turn_ids, turn_counts)`` of ``batch`` (rows = ``trajs``): (B, T) long, the turn of each
    position (-1 past the row's end), and (B,) long, each row's number of turns."""
    rows, length = batch.input_ids.shape
    ids = torch.full((rows, length), -1, dtype=torch.long)
    counts = torch.zeros(rows, dtype=torch.long)
    for i, traj in enumerate(trajs):
        starts = turn_starts(traj)
        counts[i] = len(starts)
        if not starts:
            continue
        real = len(traj.token_ids)
        positions = torch.arange(real)
        owner = torch.searchsorted(torch.tensor(starts), positions, right=True) - 1
        ids[i, :real] = owner.clamp(0, len(starts) - 1)
    return ids, counts


def state_ids(trajs: Sequence[Trajectory], width: int) -> torch.Tensor:
    """(B, width) long: each turn's anchor state as an integer (equal keys, equal ids); -1 past a
    row's turns."""
    out = torch.full((len(trajs), max(width, 1)), -1, dtype=torch.long)
    interned: dict[str, int] = {}
    for i, traj in enumerate(trajs):
        for k, key in enumerate(state_keys(traj)):
            out[i, k] = interned.setdefault(key, len(interned))
    return out


def anchor_stats(state_ids: torch.Tensor, turn_counts: torch.Tensor, group_ids: torch.Tensor) -> dict[str, float]:
    """How much GiGPO's step level has to work with in a batch: its step groups seen from the turns
    after each sample's first, the ones whose anchor state can differ within a group (turn 0 acts in
    the group's shared opening, so its step group is the episode group).

    Args:
        state_ids: (B, K') integer, each turn's anchor state (:func:`state_ids`).
        turn_counts: (B,) integer, turns per row.
        group_ids: (B,) integer, samples of one task share an id.

    Returns:
        ``{"batch/anchor/later_shared_frac": share of turns k >= 1 whose anchor state another turn
        of the same group also acted in (at any turn index, as GiGPO groups them; a turn alone in
        its state gets the episode advantage only), "batch/anchor/later_group_size_mean": the mean
        size of those turns' step groups (1 when every state is new)}``; ``{}`` when no row has a
        second turn.
    """
    states, counts, groups = state_ids.tolist(), turn_counts.tolist(), group_ids.tolist()
    visits = [(groups[i], row[k], k) for i, row in enumerate(states) for k in range(counts[i])]
    sizes = Counter((group, state) for group, state, _ in visits)
    later = [sizes[group, state] for group, state, k in visits if k >= 1]
    if not later:
        return {}
    return {
        "batch/anchor/later_shared_frac": sum(size >= 2 for size in later) / len(later),
        "batch/anchor/later_group_size_mean": sum(later) / len(later),
    }


def turn_inputs(trajs: Sequence[Trajectory], batch: TokenBatch, estimator: Callable[..., Any]) -> dict:
    """The per-turn inputs ``estimator`` takes (by its signature): ``turn_ids`` and ``turn_counts``
    when it has a ``turn_ids`` parameter, ``state_ids`` when it has that one; {} for the others."""
    params = inspect.signature(estimator).parameters
    if "turn_ids" not in params:
        return {}
    ids, counts = turn_ids(trajs, batch)
    inputs = {"turn_ids": ids, "turn_counts": counts}
    if "state_ids" in params:
        inputs["state_ids"] = state_ids(trajs, int(counts.max()) if len(trajs) else 0)
    return inputs
