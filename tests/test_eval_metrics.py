"""pass@k (Chen et al. 2021), the mean-reward CI and a cell's metrics, against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from chatgym.trainer.eval.scores import Z_95, cell_metrics, mean_ci, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (4, 1, 1, 0.25),  # pass@1 = c/n
        (6, 2, 3, 0.8),  # 1 - C(4,3)/C(6,3) = 1 - 4/20
        (3, 0, 1, 0.0),
        (3, 3, 3, 1.0),
        (5, 4, 2, 1.0),  # n - c = 1 < k: every pair holds a correct sample
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_mean_ci_hand_values():
    # [0, 0.5, 1, 0.5]: mean 0.5, sample sd sqrt((0.25 + 0 + 0.25 + 0) / 3) = sqrt(1/6), half z * sd / 2.
    mean, lo, hi = mean_ci([0.0, 0.5, 1.0, 0.5])
    half = Z_95 * math.sqrt(1 / 6) / 2
    assert mean == 0.5 and lo == pytest.approx(0.5 - half) and hi == pytest.approx(0.5 + half)
    assert half == pytest.approx(0.400076, abs=1e-6)
    assert mean_ci([0.25]) == (0.25, None, None)
    # Rewards in [0, 1]: [0, 0.25] has mean 0.125, sd 0.25 / sqrt(2), half z * 0.125 = 0.244995 -> the low
    # end is clipped at 0 (regression: the leaderboard printed [-0.024, 0.302] for Judge-v0).
    mean, lo, hi = mean_ci([0.0, 0.25])
    assert (mean, lo) == (0.125, 0.0) and hi == pytest.approx(0.125 + Z_95 * 0.125)
    _, lo, _ = mean_ci([-1.0, 0.25])  # outside [0, 1]: no clipping
    assert lo == pytest.approx(-0.375 - Z_95 * 1.25 / math.sqrt(2) / math.sqrt(2))


def test_mean_ci_of_pass_fail_tasks_is_wilson():
    # Regression: 2 of 10 tasks solved gave the normal interval [-0.061, 0.461] (below 0) on the
    # leaderboard. Wilson, by hand with z^2 = 3.841459: center (0.2 + 0.192073) / 1.384146 = 0.283260,
    # half 1.959964 / 1.384146 * sqrt(0.016 + 0.009604) = 0.226578 -> [0.056682, 0.509838].
    mean, lo, hi = mean_ci([1.0, 1.0] + [0.0] * 8)
    assert mean == 0.2 and lo == pytest.approx(0.056682, abs=1e-6) and hi == pytest.approx(0.509838, abs=1e-6)
    # 2 of 4: [0.150038, 0.849962] (symmetric about 0.5).
    _, lo, hi = mean_ci([0.0, 1.0, 1.0, 0.0])
    assert lo == pytest.approx(0.150038, abs=1e-6) and hi == pytest.approx(0.849962, abs=1e-6)
    # 3 of 3: not the degenerate [1, 1]; low = 3 / (3 + z^2) = 0.438503.
    _, lo, hi = mean_ci([1.0, 1.0, 1.0])
    assert lo == pytest.approx(0.438503, abs=1e-6) and hi == 1.0
    with pytest.raises(ValueError):
        mean_ci([])


def _row(task, reward, success, turns=1, tokens=None, calls=0, errors=0, failed=0):
    return {
        "task_index": task,
        "reward": reward,
        "success": success,
        "turns": turns,
        "generated_tokens": tokens,
        "tool_calls": calls,
        "tool_errors": errors,
        "failed": failed,
    }


def test_cell_metrics_hand_values():
    rows = [
        _row(0, 1.0, 1, turns=2, tokens=10, calls=2, errors=1),
        _row(0, 0.0, 0, turns=1, tokens=20),
        _row(0, 1.0, 1, turns=3, tokens=30, calls=1),
        _row(1, 0.0, 0, turns=1, tokens=None, failed=1),
        _row(1, 0.5, 0, turns=1, tokens=40, calls=1, errors=1),
        _row(1, 0.0, 0, turns=4, tokens=50),
    ]
    m = cell_metrics(rows, k=2, wall_s=12.5)
    assert (m.episodes, m.tasks, m.samples_per_task, m.k) == (6, 2, 3, 2)
    # pass@1: task 0 has c/n = 2/3, task 1 has 0 -> 1/3.
    assert m.pass_at_1 == pytest.approx(1 / 3)
    # pass@2: task 0 (n=3, c=2): n - c = 1 < 2 -> 1; task 1 -> 0.  Mean 0.5.
    assert m.pass_at_k == pytest.approx(0.5)
    # Task-mean rewards 2/3 and 1/6 -> mean 5/12; sd of two values = |a - b| / sqrt(2) = 0.5 / sqrt(2).
    assert m.mean_reward == pytest.approx(5 / 12)
    half = Z_95 * (0.5 / math.sqrt(2)) / math.sqrt(2)
    # 5/12 - half = -0.073 is clipped to 0 (rewards in [0, 1]); 5/12 + half = 0.9067 stays.
    assert m.reward_ci_low == 0.0 and m.reward_ci_high == pytest.approx(5 / 12 + half)
    assert m.mean_turns == pytest.approx(12 / 6)
    assert m.tokens_per_episode == pytest.approx(150 / 5)  # the row without a count is left out
    assert (m.tool_calls, m.tool_errors) == (4, 2) and m.tool_error_rate == 0.5
    assert m.failure_rate == pytest.approx(1 / 6) and m.wall_s == 12.5


def test_cell_metrics_caps_k_and_handles_no_tools_or_tokens():
    rows = [_row(0, 1.0, 1), _row(1, 0.0, 0), _row(1, 1.0, 1)]
    m = cell_metrics(rows, k=5)
    assert m.k == 1 and m.samples_per_task == 1  # task 0 has a single sample
    assert m.pass_at_1 == pytest.approx((1.0 + 0.5) / 2) and m.pass_at_k == m.pass_at_1
    assert m.tokens_per_episode is None and m.tool_error_rate is None
    with pytest.raises(ValueError):
        cell_metrics([])
