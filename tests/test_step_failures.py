"""The one-line warnings of a training step whose episodes failed (trainer/logging/step_metrics.py)."""

from __future__ import annotations

from chatgym.trainer.logging.step_metrics import all_failed, failure_counts, some_failed
from chatgym.trainer.rollout.types import Trajectory


def traj(error):
    return Trajectory(env_id="E-v0", task_id=0, error=error)


def test_all_failed_names_each_error_and_its_count():
    assert all_failed([], 3) is None
    assert all_failed([traj("env_error: x"), traj(None)], 3) is None
    assert all_failed([traj("env_error: x\nmore"), traj("timeout: 5 s"), traj("env_error: x")], 3) == (
        "chatgym: step 3: all 3 episodes failed, nothing was trained (2 of them: env_error: x; 1: timeout: 5 s)"
    )
    # Regression: an empty error string (a failure with no message) raised IndexError in the step's metrics.
    assert all_failed([traj(""), traj("")], 4) == "chatgym: step 4: all 2 episodes failed, nothing was trained (2 of them: )"


def test_some_failed_speaks_only_when_some_but_not_all_failed():
    assert some_failed([], 0) is None
    assert some_failed([traj(None), traj(None)], 0) is None
    assert some_failed([traj("a: 1"), traj("a: 1")], 0) is None  # all failed: all_failed's line
    assert some_failed([traj(None), traj("timeout: 5 s"), traj(None)], 7) == (
        "chatgym: step 7: 1 of 3 episodes failed and were left out of the update (1 of them: timeout: 5 s)"
    )


def test_failure_counts_orders_errors_by_first_occurrence_and_folds_the_rest():
    trajs = [traj(e) for e in ("b: 2", None, "a: 1", "b: 2", "c: 3", "d: 4", "d: 4", "e: 5")]
    # b first (2), then a (1), c (1); d and e are the 2 left over.
    assert failure_counts(trajs) == "2 of them: b: 2; 1: a: 1; 1: c: 3; and 2 other errors"
    assert failure_counts(trajs, shown=5) == "2 of them: b: 2; 1: a: 1; 1: c: 3; 2: d: 4; 1: e: 5"
    assert failure_counts(trajs[:7]) == "2 of them: b: 2; 1: a: 1; 1: c: 3; and 1 other error"
    assert failure_counts([traj(None)]) == ""
    assert failure_counts([traj("x" * 300)]) == "1 of them: " + "x" * 200
