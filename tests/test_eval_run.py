"""``chatgym eval`` end to end with the scripted reference policy (real envs, real sandbox, real
SQLite): rows and identities, every registered env id, skipping envs without a reference policy,
resuming, and a SIGKILLed ``chatgym eval`` process that is restarted and ends with the totals of an
uninterrupted run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from typing import Any

import gymnasium as gym
import pytest
from leaderboard_helpers import report_json

import chatgym  # noqa: F401
from chatgym.envs import messages as M
from chatgym.envs.core import ChatEnv, StepOutcome
from chatgym.envs.registration import ENV_SPECS
from chatgym.trainer.eval.config import EvalConfig
from chatgym.trainer.eval.leaderboard import build_leaderboard
from chatgym.trainer.eval.run import evaluate
from chatgym.trainer.eval.store import ResultsStore
from chatgym.trainer.rollout.config import RolloutConfig
from chatgym.trainer.rollout.trace import read_trace


def run_eval(**kwargs: Any):
    return asyncio.run(evaluate(EvalConfig(engine="reference", **kwargs), progress=False, log=lambda m: None))


def test_reference_rows_and_identity(tmp_path):
    db = tmp_path / "r.sqlite"
    reports = run_eval(envs=("Math-v0", "CodeSandbox-v0"), max_tasks=3, n_samples=2, db=str(db))
    assert [(r.env_id, r.grid, r.ran, r.failed, r.skipped) for r in reports] == [
        ("Math-v0", 6, 6, 0, None),
        ("CodeSandbox-v0", 6, 6, 0, None),
    ]
    with ResultsStore(db) as store:
        rows = store.episodes()
    assert len(rows) == 12
    math_rows = [r for r in rows if r["env_id"] == "Math-v0"]
    # Identity columns: the dataset hash is the hash of the split's rows, the split is "test" (auto).
    from chatgym.trainer.eval.identity import dataset_hash

    assert {r["dataset_hash"] for r in math_rows} == {
        dataset_hash(gym.make("Math-v0", split="test").unwrapped.tasks)
    }
    assert {(r["split"], r["env_version"], r["model_name"], r["model_hash"], r["engine"]) for r in rows} == {
        ("test", "v0", "reference", "scripted", "reference")
    }
    assert sorted((r["task_index"], r["sample_index"]) for r in math_rows) == [
        (t, s) for t in range(3) for s in range(2)
    ]
    assert all(r["reward"] == 1.0 and r["success"] == 1 and r["turns"] == 1 for r in rows)
    code = sorted((r for r in rows if r["env_id"] == "CodeSandbox-v0"), key=lambda r: r["task_index"])
    # The reference submits through the submit tool: one tool call per episode, no tool error.
    assert [(r["tool_calls"], r["tool_errors"]) for r in code] == [(1, 0)] * 6
    assert [r["task_id"] for r in code if r["sample_index"] == 0] == [
        t["task_id"] for t in gym.make("CodeSandbox-v0", split="test").unwrapped.tasks[:3]
    ]
    # Each row points at its trace, which holds the episode's messages.
    trace = read_trace(code[0]["trace_path"])
    assert len(trace) == 6 and trace[0]["messages"][0]["role"] == "system"

    # Running the same command again finds everything stored and runs nothing.
    again = run_eval(envs=("Math-v0", "CodeSandbox-v0"), max_tasks=3, n_samples=2, db=str(db))
    assert [(r.already_done, r.ran) for r in again] == [(6, 0), (6, 0)]
    # A larger --max-tasks extends the same grid.
    more = run_eval(envs=("Math-v0",), max_tasks=4, n_samples=2, db=str(db))
    assert (more[0].already_done, more[0].ran, more[0].run_key) == (6, 2, reports[0].run_key)


def test_another_success_threshold_is_another_grid_and_a_nan_one_is_refused(tmp_path):
    # Regression (fresh-user walk): --success-threshold 0.5 after 2 found Judge-v0's episodes done and
    # kept their success (pass@1 0 at mean reward 1.0); nan was taken and scored every episode a fail.
    db = tmp_path / "r.sqlite"
    strict = run_eval(envs=("Judge-v0",), max_tasks=2, success_threshold=2.0, db=str(db))
    loose = run_eval(envs=("Judge-v0",), max_tasks=2, success_threshold=0.5, db=str(db))
    assert [(r.already_done, r.ran) for r in strict + loose] == [(0, 2), (0, 2)]
    with ResultsStore(db) as store:
        rows = store.episodes()
    by = {json.loads(r["sampling"]).get("success_threshold"): [] for r in rows}
    for r in rows:
        by[json.loads(r["sampling"]).get("success_threshold")].append((r["reward"], r["success"]))
    assert by == {2.0: [(1.0, 0), (1.0, 0)], 0.5: [(1.0, 1), (1.0, 1)]}
    with ResultsStore(db) as store:  # two leaderboard rows, each named by its threshold
        board = build_leaderboard(store)
    assert sorted(board.row_labels.values()) == ["reference (scripted success>=0.5)", "reference (scripted success>=2.0)"]
    assert "success_threshold" not in EvalConfig(engine="reference").sampling()  # 1.0: the keys stored before
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"^success_threshold must be a finite number, got (nan|inf)$"):
            EvalConfig(engine="reference", success_threshold=bad)


class NoReferenceEnv(ChatEnv):
    def load_tasks(self, split):
        return [{"task_id": "only", "q": "hi"}]

    def initial_messages(self, task):
        return [M.user(task["q"])]

    async def score(self, turn):
        return StepOutcome(reward=1.0, terminated=True)


class CrashOnTaskOneEnv(ChatEnv):
    """Three tasks; the reference answers "ok"; scoring task 1 raises."""

    def load_tasks(self, split):
        return [{"task_id": f"t{i}", "i": i} for i in range(3)]

    def initial_messages(self, task):
        return [M.user("say ok")]

    def reference_action(self):
        return "ok"

    async def score(self, turn):
        if self.task["i"] == 1:
            raise RuntimeError("boom")
        return StepOutcome(reward=1.0, terminated=True)


def test_a_crashing_episode_fails_alone(tmp_path):
    gym.register("EvalTestCrash-v1", entry_point=CrashOnTaskOneEnv, disable_env_checker=True)
    try:
        [report] = run_eval(envs=("EvalTestCrash-v1",), n_samples=2, db=str(tmp_path / "c.sqlite"))
    finally:
        del gym.registry["EvalTestCrash-v1"]
    assert (report.grid, report.ran, report.failed) == (6, 6, 2)
    with ResultsStore(tmp_path / "c.sqlite") as store:
        rows = sorted(store.episodes(), key=lambda r: (r["task_index"], r["sample_index"]))
        board = build_leaderboard(store)
    assert [(r["task_index"], r["failed"], r["success"], r["reward"]) for r in rows] == [
        (0, 0, 1, 1.0), (0, 0, 1, 1.0), (1, 1, 0, 0.0), (1, 1, 0, 0.0), (2, 0, 1, 1.0), (2, 0, 1, 1.0)
    ]  # fmt: skip
    assert "RuntimeError: boom" in rows[2]["error"] and rows[2]["env_version"] == "v1"
    [cell] = board.cells.values()
    assert cell.metrics.failure_rate == pytest.approx(2 / 6)
    assert cell.metrics.pass_at_1 == pytest.approx(2 / 3)

    # A failed episode is a stored result (a resume keeps it) unless asked to run it again.
    db = str(tmp_path / "c.sqlite")
    gym.register("EvalTestCrash-v1", entry_point=CrashOnTaskOneEnv, disable_env_checker=True)
    try:
        [kept] = run_eval(envs=("EvalTestCrash-v1",), n_samples=2, db=db)
        [again] = run_eval(envs=("EvalTestCrash-v1",), n_samples=2, db=db, retry_failed=True)
    finally:
        del gym.registry["EvalTestCrash-v1"]
    assert (kept.already_done, kept.ran) == (6, 0)
    assert (again.already_done, again.ran, again.failed) == (4, 2, 2)
    with ResultsStore(db) as store:
        assert len(store.episodes()) == 6


class NanOnTaskOneEnv(CrashOnTaskOneEnv):
    """Three tasks; scoring task 1 returns a NaN reward."""

    async def score(self, turn):
        return StepOutcome(reward=float("nan") if self.task["i"] == 1 else 1.0, terminated=True)


def test_a_nan_reward_is_stored_as_a_failed_episode(tmp_path):
    # Regression: SQLite stores NaN as NULL, INSERT OR IGNORE dropped the row silently (report said
    # ran 6, the store held 4), and every rerun ran those episodes again and lost them again.
    db = str(tmp_path / "nan.sqlite")
    gym.register("EvalTestNan-v1", entry_point=NanOnTaskOneEnv, disable_env_checker=True)
    try:
        [report] = run_eval(envs=("EvalTestNan-v1",), n_samples=2, db=db)
        [again] = run_eval(envs=("EvalTestNan-v1",), n_samples=2, db=db)
    finally:
        del gym.registry["EvalTestNan-v1"]
    assert (report.grid, report.ran, report.failed) == (6, 6, 2)
    assert (again.already_done, again.ran) == (6, 0)
    with ResultsStore(db) as store:
        rows = sorted(store.episodes(), key=lambda r: (r["task_index"], r["sample_index"]))
    assert [(r["task_index"], r["failed"], r["success"], r["reward"]) for r in rows] == [
        (0, 0, 1, 1.0), (0, 0, 1, 1.0), (1, 1, 0, 0.0), (1, 1, 0, 0.0), (2, 0, 1, 1.0), (2, 0, 1, 1.0)
    ]  # fmt: skip
    assert rows[2]["error"] == "reward is nan: the env's score must be a finite number"


@pytest.mark.parametrize("kind", ["not sqlite", "directory", "unwritable"])
def test_bad_db_path_is_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys, kind):
    # Regression: these were tracebacks (DatabaseError, OperationalError, and FileNotFoundError
    # only once the model had loaded).
    from chatgym.trainer.eval import cli, run

    def no_start(self):
        raise AssertionError("the model loaded before --db was checked")

    monkeypatch.setattr(run._Backend, "start", no_start)
    db = {"not sqlite": tmp_path / "notdb", "directory": tmp_path, "unwritable": "/proc/x/y.sqlite"}[kind]
    if kind == "not sqlite":
        db.write_text("hello, not a database\n" * 100)
    argv = ["--engine", "reference", "--env", "Math-v0", "--max-tasks", "1", "--no-progress", "--db", str(db)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    expected = {
        "not sqlite": f"chatgym eval: --db: {db} is not a usable results file: file is not a database\n",
        "directory": f"chatgym eval: --db: {db} is a directory, not a results file\n",
        "unwritable": "chatgym eval: --db: cannot create /proc/x/y.sqlite (in /proc: No such file or directory)\n",
    }[kind]
    assert err == expected


def test_every_registered_env_appears_and_missing_reference_is_skipped(tmp_path):
    gym.register("EvalTestNoReference-v3", entry_point=NoReferenceEnv, disable_env_checker=True)
    try:
        reports = run_eval(envs=("EvalTestNoReference-v3",), max_tasks=1, db=str(tmp_path / "a.sqlite"))
    finally:
        del gym.registry["EvalTestNoReference-v3"]
    [r] = reports
    assert r.skipped is not None and "no scripted reference policy" in r.skipped and r.ran == 0
    # `all` enumerates ENV_SPECS: every id gets a report, evaluated or skipped with its reason.
    reports = run_eval(envs=("all",), max_tasks=1, db=str(tmp_path / "b.sqlite"), rollout=RolloutConfig(episode_timeout_s=120.0))
    assert [r.env_id for r in reports] == list(ENV_SPECS)
    for r in reports:
        assert r.skipped or r.ran == 1, r
    done = {r.env_id for r in reports if not r.skipped}
    assert {"Math-v0", "MathCalculator-v0", "CodeSandbox-v0", "Search-v0"} <= done


def test_unknown_env_and_bad_config_fail_at_start(tmp_path):
    with pytest.raises(ValueError, match="unknown env id 'Nope-v0'"):
        run_eval(envs=("Nope-v0",), db=str(tmp_path / "x.sqlite"))
    with pytest.raises(ValueError, match="n_samples"):
        EvalConfig(engine="reference", n_samples=0)
    with pytest.raises(ValueError, match="engine must be one of"):
        EvalConfig(engine="gpt")


# ---- interrupted evaluation --------------------------------------------------------------------

GRID = 60 * 2  # tasks x samples of the kill test


def _cmd(db) -> list[str]:
    return [
        sys.executable, "-m", "chatgym.cli", "eval", "--engine", "reference", "--env", "CodeSandbox-v0",
        "--split", "all", "--max-tasks", "60", "-n", "2", "--max-concurrent", "2", "--db", str(db),
        "--no-progress",
    ]  # fmt: skip


def _count(db) -> int:
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute("SELECT COUNT(*) FROM episodes").fetchone()[0]
    except sqlite3.OperationalError:  # the table is not created yet
        return 0
    finally:
        conn.close()


def _summary(db) -> tuple[list[tuple], dict]:
    with ResultsStore(db) as store:
        rows = sorted(
            (r["task_index"], r["sample_index"], r["task_id"], r["reward"], r["success"], r["turns"], r["tool_calls"],
             r["tool_errors"], r["failed"])
            for r in store.episodes()
        )  # fmt: skip
        board = build_leaderboard(store)
    [cell] = board.cells.values()
    metrics = cell.metrics.as_dict()
    metrics.pop("wall_s")
    return rows, metrics


def test_sigkill_mid_run_then_restart_matches_an_uninterrupted_run(tmp_path):
    db = tmp_path / "killed.sqlite"
    proc = subprocess.Popen(_cmd(db), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while _count(db) < 10 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, "the eval ended before it could be interrupted"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything the killed eval left in its own session
        except ProcessLookupError:
            pass
    assert proc.returncode == -signal.SIGKILL
    at_kill = _count(db)
    assert 10 <= at_kill < GRID

    resumed = subprocess.run(_cmd(db), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    [report] = json.loads(report_json(resumed.stdout))
    assert (report["already_done"], report["ran"], report["grid"]) == (at_kill, GRID - at_kill, GRID)
    assert _count(db) == GRID

    clean = tmp_path / "clean.sqlite"
    once = subprocess.run(_cmd(clean), capture_output=True, text=True, timeout=300)
    assert once.returncode == 0, once.stderr[-2000:]
    rows_killed, metrics_killed = _summary(db)
    rows_clean, metrics_clean = _summary(clean)
    assert len(rows_killed) == GRID and len({r[:2] for r in rows_killed}) == GRID  # nothing twice
    assert rows_killed == rows_clean
    assert metrics_killed == metrics_clean
    assert metrics_clean["episodes"] == GRID and metrics_clean["pass_at_1"] == 1.0
