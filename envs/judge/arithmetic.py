"""Judge-v0's ``questions="arithmetic"``: Math-v0's seeded reasoning-gym tasks as Judge-v0 rows, so a
judge can learn to verify an answer against its reference (a generative verifier: GenRM, Zhang et
al. 2024, arXiv:2408.15240; co-trained with the policy as in RL Tango, Zha et al. 2025,
arXiv:2505.15034).

Why: a SmolLM2-135M judge on MT-bench's rubric became a constant rating in every co-training run
(examples/recipes/judge_cotrain/). Comparing a final answer with a reference is within its reach: in
a CPU probe of GRPO over its rating (examples/recipes/verifier_cotrain/), it went from no
discrimination (mean rating 3.564 of right answers, 3.562 of wrong ones) to 0.98 held-out agreement
in 30 steps of 16 prompts (two seeds).

Rows have MT-bench's fields (one question turn), so the episode, the judge's traces and the
co-training calibration answers work unchanged; the reference answer is the task's gold answer.
"""

from __future__ import annotations

from typing import Any

SPLITS = ("train", "test")
CATEGORY = "arithmetic"


def load_arithmetic(split: str, size: int | None = None, dataset: str = "basic_arithmetic") -> list[dict[str, Any]]:
    """Math-v0's tasks of ``split`` as Judge-v0 rows: ``task_id`` (``arithmetic/<split>/<i>``),
    ``category`` (``"arithmetic"``), ``turns`` (the question), ``reference`` (the gold answer, as text).

    Args:
        split: ``"train"`` or ``"test"`` (Math-v0's splits: different seeds, no shared question).
        size: tasks in the split (None: Math-v0's default, 5,000 / 200).
        dataset: the reasoning-gym generator (Math-v0's default config for it).

    Raises:
        ValueError: unknown split, or Math-v0's own errors for ``size``.
        ImportError: reasoning-gym is missing.
    """
    from chatgym.envs.math.env import MathEnv

    if split not in SPLITS:
        raise ValueError(f"Judge-v0 questions='arithmetic': split must be one of {list(SPLITS)}, got {split!r}")
    tasks = MathEnv(dataset=dataset, split=split, size=size).load_tasks(split)
    return [
        {
            "task_id": f"{CATEGORY}/{split}/{i}",
            "category": CATEGORY,
            "turns": [task["question"]],
            "reference": [str(task["answer"])],
        }
        for i, task in enumerate(tasks)
    ]
