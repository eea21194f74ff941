"""Which tasks each step trains on: a pure function of (seed, step), so a resumed run draws the same
batch at step k as an uninterrupted one, without saving any sampler state."""

from __future__ import annotations

import numpy as np


def tasks_for_step(step: int, per_step: int, num_tasks: int, seed: int) -> list[int]:
    """Task indices of training step ``step`` (0-based): consecutive slices of seeded permutations.

    Every task is used once per epoch (a fresh permutation of ``range(num_tasks)`` per epoch,
    seeded by ``(seed, epoch)``); a step that straddles two epochs takes the end of one and the start
    of the next. ``per_step`` may exceed ``num_tasks`` (tasks then repeat within a step).

    Raises:
        ValueError: ``num_tasks`` or ``per_step`` < 1, or ``step`` < 0.
    """
    if num_tasks < 1 or per_step < 1 or step < 0:
        raise ValueError(
            f"need num_tasks >= 1, per_step >= 1, step >= 0; got {num_tasks}, {per_step}, {step}"
        )
    out: list[int] = []
    position = step * per_step
    while len(out) < per_step:
        epoch, offset = divmod(position, num_tasks)
        perm = np.random.default_rng([seed, epoch]).permutation(num_tasks)
        take = min(per_step - len(out), num_tasks - offset)
        out.extend(int(i) for i in perm[offset : offset + take])
        position += take
    return out
