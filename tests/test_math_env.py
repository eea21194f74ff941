"""Math-v0: answer extraction, scoring with reasoning-gym's scorer, splits, and the calculator tool."""

import re
from fractions import Fraction

import gymnasium as gym
import pytest

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs.math.calculator import _eval, calculate
from chatgym.envs.math.env import extract_answer

pytest.importorskip("reasoning_gym")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>42</answer>", ("42", True)),
        ("first <answer>1</answer> then <answer> -7 </answer>", ("-7", True)),  # the last tag counts
        ("5 - 3 = 2", ("2", False)),  # no tag: the last number
        ("it is 1,234 apples", ("1234", False)),
        ("no idea", (None, False)),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_calculator_exact_values():
    assert calculate("(12 + 7) * 3") == "57"
    assert calculate("7 / 2") == "3.5"
    assert calculate("-2 ** 3") == "-8"  # Python precedence: -(2**3)
    assert calculate("1 / 3") == "0.3333333333"
    assert _eval(__import__("ast").parse("2 ** -2", mode="eval")) == Fraction(1, 4)
    for bad in ["__import__('os')", "2 ** 1000", "1 / 0", "x + 1", "9" * 40]:
        with pytest.raises((ValueError, ZeroDivisionError)):
            calculate(bad)


def test_math_episode_rewards_by_answer():
    env = gym.make("Math-v0", split="test")
    obs, info = env.reset(options={"task_index": 0})
    task = env.unwrapped.task
    assert obs[0]["role"] == "system" and obs[1] == {"role": "user", "content": task["question"]}
    # The generator's own expression evaluates to the expected answer (independent check).
    assert calculate(task["metadata"]["expression"]) == task["answer"]

    _, reward, terminated, truncated, info = env.step(f"<answer>{task['answer']}</answer>")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["reward_components"] == {"correct": 1.0, "format": 1.0}

    env.reset(options={"task_index": 0})
    _, reward, *_, info = env.step(f"<answer>{int(task['answer']) + 1}</answer>")
    assert reward == 0.0 and info["reward_components"] == {"correct": 0.0, "format": 1.0}

    env.reset(options={"task_index": 0})
    _, reward, *_, info = env.step(f"The result is {task['answer']}.")
    assert reward == 1.0 and info["reward_components"]["format"] == 0.0
    env.close()


def test_splits_are_deterministic_and_disjoint():
    train = gym.make("Math-v0", split="train").unwrapped.tasks
    test = gym.make("Math-v0", split="test").unwrapped.tasks
    assert len(train) == 5000 and len(test) == 200
    assert not {t["question"] for t in train} & {t["question"] for t in test}
    again = gym.make("Math-v0", split="test").unwrapped.tasks
    assert [t["question"] for t in again] == [t["question"] for t in test]


def test_calculator_env_multi_turn():
    env = gym.make("MathCalculator-v0", split="test")
    env.reset(options={"task_index": 1})
    expr = env.unwrapped.task["metadata"]["expression"]
    obs, reward, terminated, truncated, _ = env.step(
        f'<tool_call>{{"name": "calculate", "arguments": {{"expression": "{expr}"}}}}</tool_call>'
    )
    assert obs == [
        {
            "role": "tool",
            "content": env.unwrapped.task["answer"],
            "tool_call_id": "call_0",
            "name": "calculate",
        }
    ]
    assert (reward, terminated, truncated) == (0.0, False, False)
    _, reward, terminated, _, _ = env.step(f"<answer>{obs[0]['content']}</answer>")
    assert (reward, terminated) == (1.0, True)
    env.close()


def test_split_is_generated_once_per_process():
    # Regression: the collector makes an env per episode; regenerating 5,000 tasks each time cost
    # seconds per training step. Two envs with the same settings share one tuple of rows.
    a = gym.make("Math-v0", split="train").unwrapped.tasks
    b = gym.make("Math-v0", split="train").unwrapped.tasks
    assert a is b
    assert gym.make("Math-v0", split="train", seed=1).unwrapped.tasks is not a


@pytest.mark.parametrize(
    ("row", "message"),
    [
        # Regression (a fresh user): a row without metadata reset fine and raised KeyError at step.
        ({"question": "What is 6 * 7?", "answer": "42"},
         r"^task\['metadata'\]\['source_dataset'\] must name the reasoning-gym dataset whose scorer grades "
         r"the answer \(e\.g\. 'basic_arithmetic'\), got None$"),
        ({"question": "What is 6 * 7?", "answer": "42", "metadata": {"source_dataset": "nope"}}, r"got 'nope'$"),
        ({"question": " ", "answer": "42", "metadata": {"source_dataset": "basic_arithmetic"}},
         r"^task\['question'\] must be a non-empty string$"),
        ({"question": "What is 6 * 7?", "metadata": {"source_dataset": "basic_arithmetic"}},
         r"^task\['answer'\] is missing \(the gold answer\)$"),
    ],
)
def test_a_task_row_is_checked_at_reset_naming_the_field(row, message):
    env = gym.make("Math-v0")
    with pytest.raises(ValueError, match=message):
        env.reset(options={"task": row})
    env.close()
    env = gym.make("Math-v0")  # the row mended: it plays
    env.reset(options={"task": {**row, "question": "What is 6 * 7?", "answer": "42",
                                "metadata": {"source_dataset": "basic_arithmetic"}}})  # fmt: skip
    assert env.step("<answer>42</answer>")[1] == 1.0
    env.close()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"size": "abc"}, "size must be an int >= 1 (tasks in the split) or None, got 'abc'"),
        ({"size": -3}, "size must be an int >= 1 (tasks in the split) or None, got -3"),
        ({"size": 0}, "size must be an int >= 1 (tasks in the split) or None, got 0"),
        ({"size": True}, "size must be an int >= 1 (tasks in the split) or None, got True"),
        ({"seed": "x"}, "seed must be an int, got 'x'"),
    ],
)
def test_size_and_seed_are_checked_with_their_names(kwargs, message):
    # Regression (fresh user): `chatgym eval --env-arg size=abc` said "TypeError: '>=' not supported
    # between instances of 'int' and 'str'", size=-3 "ValueError: __len__() should return >= 0".
    with pytest.raises(ValueError, match=re.escape(f"Math-v0: {message}")):
        gym.make("Math-v0", split="train", **kwargs)
    assert len(gym.make("Math-v0", split="train", size=3, seed=2).unwrapped.tasks) == 3
