"""Math-v0: arithmetic and grade-school word problems from reasoning-gym's seeded generators.

Tasks come from ``reasoning-gym`` (``pip install reasoning-gym==0.1.25``; generators such as
``basic_arithmetic``, ``gsm_symbolic`` — GSM8K templates — or ``countdown``), generated
deterministically from a seed, so there is nothing to download. Splits use different seeds: the test
split is the first ``size`` tasks of its seed whose question is not a question of the (5,000-task)
train split, drawing on until there are ``size`` of them.

The model answers in ``<answer>…</answer>`` tags (the last such tag counts); without tags the last
``\\boxed{}``, else the last "answer is …" phrase, else the last number in the reply is taken, and
``info["reward_components"]["format"]`` is 0. The answer is normalised the same way wherever it was
found (``chatgym.envs.math.answer``: ``\\boxed{$9{,}500}``, ``9\\,500``, ``$9,500.`` and
``9500 dollars`` are all ``9500``). The reward is reasoning-gym's own scorer for the generator
(1.0 for an exact answer on ``basic_arithmetic``; its partial values, such as ``gsm_symbolic``'s
0.01 for a wrong number, are kept), given the normalised answer and the answer as written, the
better of the two; it is raised to 1.0 when the answer is the gold by value
(:func:`~chatgym.envs.math.answer.answers_equal`: exact for numbers, a fraction for a decimal unless
the question asks for a decimal form, guarded ``math-verify`` for other answers).
With ``calculator=True`` the model may call a ``calculate`` tool before answering.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from typing import Any

from chatgym.envs import messages as M
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome, load_prompt
from chatgym.envs.math.answer import answers_equal, extract_answer, written_answer
from chatgym.envs.math.calculator import calculate
from chatgym.envs.tools import Tool

__all__ = ["MathEnv", "extract_answer"]

DEFAULT_CONFIG: dict[str, dict[str, Any]] = {
    # Two small terms, + and - only: SmolLM2-135M gets some right, so RL has signal.
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 2,
        "operators": ("+", "-"),
        "allow_parentheses": False,
        "allow_negation": False,
    },
}
SPLIT_SEEDS = {"train": 0, "test": 1_000_003}
SPLIT_SIZES = {"train": 5000, "test": 200}
# A test split draws candidates until it has `size` non-train tasks; this many train questions in a row
# means the generator has (almost surely) no other question left. basic_arithmetic's default config
# went at most 16 in a row in 20,000 candidates (seeds 0 and 1); a 1-digit config has no new question
# at all (its 242 questions are all in the train split). Reaching it costs ~0.3 s on basic_arithmetic.
MAX_TRAIN_RUN = 10_000


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError("Math-v0 needs reasoning-gym: pip install 'chatgym[math]'") from exc
    return reasoning_gym


@functools.cache
def _scorer(source: str) -> Any:
    """reasoning-gym's ``score_answer`` of dataset ``source``, built once: each build makes and seeds a
    dataset, twice an episode (reset's check and the score), 0.04 ms of the GIL each."""
    return _reasoning_gym().get_score_answer_fn(source)


def _generate(dataset: str, config: str, size: int, seed: int) -> list[dict[str, Any]]:
    return list(_reasoning_gym().create_dataset(dataset, size=size, seed=seed, **json.loads(config)))


def _candidates(dataset: str, config: str, first: int, seed: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows ``(index, row)`` of one seed in index order, without end.

    The first ``first`` come from one dataset of that size, exactly as the test split drew them before
    it could draw more, so splits that were already full keep their tasks. The rest come in chunks of
    larger datasets, whose row ``i`` is the same row whatever the dataset's size (``basic_arithmetic``
    and ``countdown`` make it from ``Random(seed + i)``; ``gsm_symbolic``'s template choices are one
    seeded sequence), so the rows stay one deterministic sequence.
    """
    yield from enumerate(_generate(dataset, config, first, seed))
    start = first
    while True:
        end = start + max(first, 1024)
        rows = _reasoning_gym().create_dataset(dataset, size=end, seed=seed, **json.loads(config))
        for i in range(start, end):
            yield i, rows[i]
        start = end


# Envs are made per episode by the collector: generating 5,000 tasks each time would cost ~0.2 s per
# episode, so each split is generated once per process. Rows are shared: treat them as read-only.
@functools.lru_cache(maxsize=8)
def _split_rows(dataset: str, config: str, size: int, seed: int, split: str) -> tuple[dict[str, Any], ...]:
    if split == "train":
        rows = _generate(dataset, config, size, seed + SPLIT_SEEDS["train"])
        return tuple(dict(e, task_id=f"{dataset}/train/{i}") for i, e in enumerate(rows))
    # Test: keep the first `size` candidates whose question is not a train question, so a held-out
    # score never rewards memorised training items. Candidates used to stop at 4 * size, which left
    # tiny splits short (size=3 gave 2 tasks, size=1 none); the first 4 * size are drawn as before and
    # only a short split draws on, so full splits keep their tasks, in order.
    seen = {e["question"] for e in _split_rows(dataset, config, SPLIT_SIZES["train"], seed, "train")}
    rows: list[dict[str, Any]] = []
    last_new = -1
    for i, e in _candidates(dataset, config, size * 4, seed + SPLIT_SEEDS[split]):
        if e["question"] not in seen:
            rows.append(dict(e, task_id=f"{dataset}/{split}/{i}"))
            last_new = i
            if len(rows) == size:
                return tuple(rows)
        elif i - last_new >= MAX_TRAIN_RUN:
            raise ValueError(
                f"Math-v0: the {split} split cannot hold size={size} tasks: {dataset} (seed {seed}) gave "
                f"{len(rows)} question(s) not in the train split, then {MAX_TRAIN_RUN:,} train questions in "
                "a row; ask for a smaller size or a dataset_config with more distinct questions"
            )
    raise AssertionError("unreachable: _candidates does not end")


class MathEnv(ChatEnv):
    """Math-v0 (see the module docstring).

    Args:
        dataset: a reasoning-gym generator name (``basic_arithmetic``, ``gsm_symbolic``, ...).
        dataset_config: keyword settings of the generator (defaults: ``DEFAULT_CONFIG``).
        split: ``train`` or ``test``.
        size: number of tasks in the split, exactly (default 5000 train / 200 test).
        seed: base seed; the split's seed is ``seed + SPLIT_SEEDS[split]``.
        calculator: offer the ``calculate`` tool (then ``max_turns`` defaults to 4, else 1).

    Raises:
        ValueError: unknown split, a size that is not an int >= 1 (or None), a seed that is not an int.
            When the tasks are first loaded (``tasks``, ``reset``): ValueError naming ``size`` when the
            generator has too few questions outside the train split to fill a test split of that size
            (``MAX_TRAIN_RUN`` train questions in a row end the search), and ImportError naming the
            package when reasoning-gym is missing.
    """

    def __init__(
        self,
        *,
        dataset: str = "basic_arithmetic",
        dataset_config: dict[str, Any] | None = None,
        split: str = "train",
        size: int | None = None,
        seed: int = 0,
        calculator: bool = False,
        max_turns: int | None = None,
        **kwargs: Any,
    ):
        if split not in SPLIT_SEEDS:
            raise ValueError(f"Math-v0: split must be one of {sorted(SPLIT_SEEDS)}, got {split!r}")
        # Checked here: reasoning-gym's own errors for these read as Python's ('>=' not supported ...).
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"Math-v0: size must be an int >= 1 (tasks in the split) or None, got {size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):  # the generators' random.Random takes int
            raise ValueError(f"Math-v0: seed must be an int, got {seed!r}")
        tools = [Tool.from_function(calculate)] if calculator else []
        super().__init__(split=split, tools=tools, max_turns=max_turns or (4 if calculator else 1), **kwargs)
        self.dataset_name = dataset
        self.dataset_config = dict(
            DEFAULT_CONFIG.get(dataset, {}) if dataset_config is None else dataset_config
        )
        self.size = size
        self.seed = seed
        self.system_prompt = load_prompt(__package__, "math_system_calculator.txt" if calculator else "math_system.txt")

    def load_tasks(self, split: str) -> Sequence[dict[str, Any]]:
        config = json.dumps(self.dataset_config, sort_keys=True)
        return _split_rows(self.dataset_name, config, self.size or SPLIT_SIZES[split], self.seed, split)

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [M.system(self.system_prompt), M.user(task["question"])]

    async def on_reset(self, task: dict[str, Any]) -> None:
        """Check a task row (``options={"task": row}`` may give any) at reset, not at the scoring step.

        Raises:
            ValueError: naming the field: no non-empty ``question`` string, no ``answer``, or a
                ``metadata.source_dataset`` that is no reasoning-gym dataset (its scorer grades).
        """
        if not isinstance(task.get("question"), str) or not task["question"].strip():
            raise ValueError("task['question'] must be a non-empty string")
        if task.get("answer") is None:
            raise ValueError("task['answer'] is missing (the gold answer)")
        source = (task.get("metadata") or {}).get("source_dataset") if isinstance(task.get("metadata"), dict) else None
        try:
            _scorer(source)
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                "task['metadata']['source_dataset'] must name the reasoning-gym dataset whose scorer grades "
                f"the answer (e.g. 'basic_arithmetic'), got {source!r}"
            ) from None

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        answer, tagged = extract_answer(turn.raw_text)
        score_answer = _scorer(self.task["metadata"]["source_dataset"])
        correct = 0.0
        if answer is not None:
            # The scorer sees the normalised answer and the same answer as written (what it saw before
            # normalisation existed), so its own partial values stay and no right answer loses.
            candidates = dict.fromkeys([answer, written_answer(turn.raw_text)])
            correct = max(float(score_answer(c, self.task)) for c in candidates if c is not None)
            if correct < 1.0 and answers_equal(
                answer, str(self.task["answer"]), self.task.get("question", "")
            ):
                correct = 1.0
        info = {
            "answer": answer,
            "expected": self.task["answer"],
            "correct": correct == 1.0,
            "success": correct == 1.0,
            "reward_components": {"correct": correct, "format": float(tagged)},
        }
        return StepOutcome(reward=correct, terminated=True, info=info)

    def reference_action(self) -> str:
        """The gold answer in ``<answer>`` tags (what the scorer reads); no calculator call needed.

        Raises:
            RuntimeError: called before ``reset``.
        """
        if self.task is None:
            raise RuntimeError("call reset() before reference_action()")
        return f"<answer>{self.task['answer']}</answer>"
