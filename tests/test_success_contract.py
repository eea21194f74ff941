"""The success contract: every env step states ``info["success"]``; the rollout side
copies it into ``Trajectory.success``; training accuracy, eval accuracy and the eval store's pass@k
rows read that one field."""

from __future__ import annotations

import pytest
from train_helpers import LETTERS_ENV_ID, register

from chatgym.trainer.rollout.episode import record_step
from chatgym.trainer.rollout.types import Trajectory


def test_math_env_states_success_and_a_plain_chat_env_states_none():
    pytest.importorskip("reasoning_gym")
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers the env ids)

    env = gym.make("Math-v0", split="test")
    env.reset(options={"task_index": 0})
    right = env.unwrapped.reference_action()
    *_, info = env.step(right)
    assert info["success"] is True and info["reward_components"]["correct"] == 1.0
    env.reset(options={"task_index": 0})
    *_, info = env.step("<answer>not a number</answer>")
    assert info["success"] is False
    env.close()

    register()  # the letters env defines no success: ChatEnv.astep says None
    letters = gym.make(LETTERS_ENV_ID)
    letters.reset(options={"task_index": 0})
    *_, info = letters.step("word")
    assert "success" in info and info["success"] is None


def test_trajectory_success_is_the_last_stated_value_and_tool_counters_add_up():
    traj = Trajectory(env_id="x", task_id=0)
    tool_msg = {"role": "tool", "content": "4", "tool_call_id": "c1"}
    record_step(traj, [tool_msg], 0.0, {"success": None, "tool_errors": 1})
    assert traj.success is None
    record_step(traj, [tool_msg, tool_msg], 1.0, {"success": True})
    assert traj.success is True
    assert traj.rewards == [0.0, 1.0]
    assert traj.info["tool_results_total"] == 3 and traj.info["tool_errors_total"] == 1
    record_step(traj, [], 0.0, {"success": "yes"})  # not a bool: undefined, never truthy
    assert traj.success is None
    record_step(traj, [], 0.0, {"other": 1})  # a step that says nothing leaves it
    assert traj.success is None


def _traj(success, reward=0.0, error=None) -> Trajectory:
    return Trajectory(env_id="x", task_id=0, reward=reward, success=success, error=error)


def test_training_accuracy_reads_success_only():
    from chatgym.trainer.logging.step_metrics import rollout_metrics

    # reward 1.0 with success False is not correct; a None (undefined) is left out; a failed
    # episode is left out: 1 success of 2 defined -> 0.5.
    trajs = [_traj(True), _traj(False, reward=1.0), _traj(None, reward=1.0), _traj(True, error="timeout: x")]
    assert rollout_metrics(trajs, rollout_s=1.0)["reward/accuracy"] == 0.5
    # No env defines success: no accuracy at all (rather than a misleading 0).
    assert "reward/accuracy" not in rollout_metrics([_traj(None, reward=1.0)], rollout_s=1.0)


def test_eval_rows_read_success_and_fall_back_to_the_threshold_only_when_undefined():
    from chatgym.trainer.eval.run import episode_row

    def row(traj):
        return episode_row(traj, token_level=False, success_threshold=0.5, common={})["success"]

    assert row(_traj(False, reward=1.0)) == 0  # the env said no: the reward does not overrule it
    assert row(_traj(True, reward=0.0)) == 1
    assert row(_traj(None, reward=0.7)) == 1  # judged env: reward >= --success-threshold
    assert row(_traj(None, reward=0.2)) == 0
    assert row(_traj(True, error="timeout: x")) == 0  # a failed episode is never a success
