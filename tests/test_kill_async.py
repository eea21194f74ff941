"""kill -9 under ``trainer.pipeline: async`` on a real local Ray cluster: rollout workers killed inside
Ray and the driver killed and resumed from its checkpoint, at random points of a run.

The driver is ``tests/kill_driver.py`` in a subprocess (its own Ray cluster: two rollout workers, one
learner). While it trains, this test SIGKILLs a random ``ray::RolloutWorker`` process every 0.3-2 s
(Ray restarts it; its episodes run again on the other worker) and, once the run has written a new
checkpoint, the driver itself; then starts it again with ``--resume``. When every kill is done the
last driver runs to the end (a run that ends before is resumed to more steps).

What is checked (the run's ``batches.jsonl`` lists the ``(rollout step, group)`` of every group of every
update whose weights the run ended with; the final checkpoint holds the buffer, the groups pending and
the next group never issued, the cursor):

* each update's row is there once, steps 1..N, and its task ids are the sampler's for its groups;
* no group is trained twice, and none is lost: the trained, buffered and pending groups are together
  exactly every group before the cursor (the data position advanced over the grid without a gap or a
  repeat), with nothing dropped or evicted (``stale: importance_sampling``, capacity above admission);
* each resume took up the checkpoint's buffer: the rows up to its step are the killed run's, and the
  groups that waited in the buffer (FIFO) are the first trained after the resume;
* ``max_staleness: 0``: the batches are exactly those of an uninterrupted sync run, step k's groups
  at step k (the learner waits for a whole step).

Why not "equal to an uninterrupted async run" for ``max_staleness >= 1``: which finished groups make up
a batch depends on which episodes finish first, which no seed fixes (worker speeds, kills); the run's
trained set is a prefix of the grid less what is still buffered or pending at the end, and the checks
above pin exactly that.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from kill_driver import NUM_TASKS, PROMPTS, SEED

pytest.importorskip("ray")
DRIVER = Path(__file__).parent / "kill_driver.py"
P = PROMPTS


def _checkpoint_step(out: Path) -> int:
    from chatgym.trainer.learner.checkpoint import checkpoint_step, latest_checkpoint

    ckpt = latest_checkpoint(out)
    return checkpoint_step(ckpt) if ckpt is not None else 0


def _pipeline_state(out: Path) -> dict:
    from chatgym.trainer.learner.checkpoint import latest_checkpoint, load_pipeline_state

    return load_pipeline_state(latest_checkpoint(out))


def _ledger(out: Path) -> list[dict]:
    from chatgym.trainer.logging.ledger import read_ledger

    path = out / "batches.jsonl"
    return read_ledger(path) if path.is_file() else []


class Tree:
    """Every process of a driver's tree seen while it ran, ``{pid: create_time}``; ends the ones left."""

    def __init__(self, root: int):
        self.root = root
        self.seen: dict[int, float] = {}

    def scan(self) -> list[psutil.Process]:
        try:
            procs = psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return []
        live = []
        for p in procs:
            try:
                self.seen.setdefault(p.pid, p.create_time())
                if p.status() != psutil.STATUS_ZOMBIE:
                    live.append(p)
            except psutil.Error:
                pass
        return live

    def left(self) -> list[psutil.Process]:
        out = []
        for pid, created in self.seen.items():
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - created) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def end(self) -> None:
        for p in self.left():
            try:
                p.kill()  # by PID, checked against its start time above
            except psutil.Error:
                pass


def _rollout_workers(tree: Tree) -> list[psutil.Process]:
    out = []
    for p in tree.scan():
        try:
            if p.name().startswith("ray::RolloutWorker") or "ray::RolloutWorker" in " ".join(p.cmdline()[:1]):
                out.append(p)
        except psutil.Error:
            pass
    return out


def campaign(out: Path, *, steps: int, max_staleness: int, save_every: int, worker_kills: int,
             driver_kills: int, seed: int, startup_kills: bool = False, gap_s: tuple[float, float] = (0.3, 2.0),
             continuations: int = 0, stall_s: float = 150.0) -> dict:
    """One run killed ``worker_kills`` + ``driver_kills`` times (see the module docstring); returns what
    happened: kills done, the resumes (checkpoint step, its pipeline state, the killed run's ledger),
    each driver's (seconds, start step, last checkpoint, exit status). ``startup_kills``: workers are
    killed from the driver's start on (also while the run builds), else from its first checkpoint;
    ``gap_s``: the range of seconds between two worker kills, and before the driver's;
    ``continuations``: times the finished run is then resumed to ``steps`` more steps (its final
    checkpoint, written after the pipeline closed, must hold the groups that were still running)."""
    rng = random.Random(seed)
    done = {"worker": 0, "driver": 0}
    resumes: list[dict] = []
    runs: list[tuple] = []  # (seconds, first step, last checkpoint, exit status) of each driver
    max_steps, resume = steps, False
    t_start = time.monotonic()
    while True:
        start_ckpt = _checkpoint_step(out)
        if resume:
            resumes.append({"step": start_ckpt, "state": _pipeline_state(out), "ledger": _ledger(out)})
        log = (out.parent / f"{out.name}_driver{len(resumes)}.log").open("w")
        cmd = [sys.executable, str(DRIVER), str(out), str(max_steps), str(max_staleness), str(save_every)]
        proc = subprocess.Popen(cmd + (["--resume"] if resume else []), stdout=log, stderr=subprocess.STDOUT)
        tree = Tree(proc.pid)
        kill_driver_at = None  # set once this run has written a checkpoint of its own
        # This run's share of the worker kills: all of them before its driver is killed.
        lives_left = driver_kills - done["driver"] + 1
        quota = done["worker"] + -(-(worker_kills - done["worker"]) // lives_left)
        t_run = time.monotonic()
        next_worker_kill = time.monotonic() + rng.uniform(*gap_s)
        progress = (start_ckpt, time.monotonic())
        try:
            while proc.poll() is None:
                now = time.monotonic()
                ckpt = _checkpoint_step(out)
                if ckpt != progress[0]:
                    progress = (ckpt, now)
                assert now - progress[1] < stall_s, f"no checkpoint for {stall_s} s (hang); see {log.name}"
                started = startup_kills or ckpt > start_ckpt
                if done["worker"] < quota and now >= next_worker_kill and started:
                    workers = _rollout_workers(tree)
                    if workers:
                        os.kill(rng.choice(workers).pid, signal.SIGKILL)
                        done["worker"] += 1
                        next_worker_kill = now + rng.uniform(*gap_s)
                ready = ckpt > start_ckpt and done["worker"] >= quota
                if done["driver"] < driver_kills and kill_driver_at is None and ready:
                    kill_driver_at = now + rng.uniform(0.0, gap_s[1])
                if kill_driver_at is not None and now >= kill_driver_at:
                    tree.scan()
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                    done["driver"] += 1
                    break
                time.sleep(0.1)
            rc = proc.wait()
            runs.append((round(time.monotonic() - t_run, 1), start_ckpt, _checkpoint_step(out), rc))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
            # A killed driver's Ray cluster follows it (GCS, raylet, actors at once; Ray's dashboard and
            # runtime-env agents within a minute): the ones still up are ended here, by PID.
            time.sleep(0.2)
            tree.end()
        if rc == -signal.SIGKILL:
            resume = True
            continue
        assert rc == 0, f"driver exited {rc}; see {log.name}:\n{Path(log.name).read_text()[-3000:]}"
        assert tree.left() == [], "a finished run left Ray processes behind"
        if done["worker"] < worker_kills or done["driver"] < driver_kills or continuations > 0:
            continuations -= done["worker"] >= worker_kills and done["driver"] >= driver_kills
            max_steps += steps  # every kill not done yet: continue the finished run to more steps
            resume = True
            continue
        wall_s = time.monotonic() - t_start
        return {"kills": done, "resumes": resumes, "max_steps": max_steps, "wall_s": wall_s, "runs": runs}


def check_run(out: Path, report: dict, max_staleness: int) -> None:
    """The invariants of the module docstring."""
    from chatgym.trainer.sampler import tasks_for_step

    rows = _ledger(out)
    n = report["max_steps"]
    assert [r["step"] for r in rows] == list(range(1, n + 1))
    trained = [tuple(g) for r in rows for g in r["groups"]]
    assert all(len(r["groups"]) == P for r in rows)
    assert len(set(trained)) == len(trained), "a group trained twice"
    for r in rows:
        assert r["tasks"] == [tasks_for_step(s, P, NUM_TASKS, SEED)[g] for s, g in r["groups"]]
    state = _pipeline_state(out)
    held = [(e["meta"]["step"], e["meta"]["group_id"]) for e in state["buffer"]["entries"]]
    pending = [tuple(k) for k in state["pending"]]
    cursor_step, cursor_group = state["cursor"]
    grid = [(s, g) for s in range(cursor_step + 1) for g in range(P) if (s, g) < (cursor_step, cursor_group)]
    assert sorted(trained + held + pending) == grid, "a group lost or counted twice"
    assert state["counters"]["dropped_stale"] == 0 and state["counters"]["evicted"] == 0
    for resume in report["resumes"]:
        c = resume["step"]
        assert rows[:c] == [r for r in resume["ledger"] if r["step"] <= c]
        buffered = [(e["meta"]["step"], e["meta"]["group_id"]) for e in resume["state"]["buffer"]["entries"]]
        if c < n:
            assert set(buffered[:P]) <= {tuple(g) for g in rows[c]["groups"]}, (c, buffered, rows[c])
    if max_staleness == 0:
        assert [r["groups"] for r in rows] == [[[k, g] for g in range(P)] for k in range(n)]
    # metrics.jsonl was resumed the same way: each step once.
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, n + 1))


def test_ledger_keeps_the_rows_of_the_checkpoint_a_run_resumes_from(tmp_path):
    from chatgym.trainer.logging.ledger import BatchLedger, read_ledger

    ledger = BatchLedger(tmp_path)
    for step in (1, 2, 3):
        ledger.log(step, step, [(step - 1, 0), (step - 1, 1)], [f"t{step}a", f"t{step}b"])
    with (tmp_path / "batches.jsonl").open("a") as f:
        f.write('{"step": 4, "vers')  # the writer was killed mid-line
    assert [r["step"] for r in read_ledger(tmp_path / "batches.jsonl")] == [1, 2, 3]
    assert read_ledger(tmp_path / "batches.jsonl")[1] == {
        "step": 2, "version": 2, "groups": [[1, 0], [1, 1]], "tasks": ["t2a", "t2b"]
    }
    BatchLedger(tmp_path, resume_step=2).log(3, 3, [(2, 1), (3, 0)], ["x", "y"])
    rows = read_ledger(tmp_path / "batches.jsonl")
    assert [(r["step"], r["groups"]) for r in rows] == [
        (1, [[0, 0], [0, 1]]), (2, [[1, 0], [1, 1]]), (3, [[2, 1], [3, 0]])
    ]
    BatchLedger(tmp_path)  # a fresh run starts an empty ledger
    assert read_ledger(tmp_path / "batches.jsonl") == []
    (tmp_path / "batches.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"batches\.jsonl: line 2 is not JSON"):
        BatchLedger(tmp_path, resume_step=3)


def test_kill_9_workers_and_the_driver_under_async_loses_and_repeats_no_group(tmp_path):
    """3 rollout workers and the driver killed once in a 6-step run (max_staleness 1)."""
    report = campaign(tmp_path / "run", steps=7, max_staleness=1, save_every=1, worker_kills=3,
                      driver_kills=1, seed=int(os.environ.get("KILL_SEED", "1")), gap_s=(0.2, 1.0))
    print(report["runs"], f"{report['wall_s']:.0f} s")
    for log in sorted(tmp_path.glob("*.log")):
        print(log.name, [x for x in log.read_text().splitlines() if x.startswith("kill_driver:")])
    assert report["kills"] == {"worker": 3, "driver": 1}
    check_run(tmp_path / "run", report, max_staleness=1)


@pytest.mark.slow
@pytest.mark.parametrize(
    "max_staleness,save_every,seed", [(0, 1, 7), (2, 4, 8)], ids=["staleness0", "staleness2"]
)
def test_kill_9_fifty_times_under_async(tmp_path, max_staleness, save_every, seed):
    """50 kills per run (45 rollout workers, 5 drivers); the two cases make the 100 kills. Steps come
    in chunks of 9: with `save_every: 4` every finished run writes its last checkpoint after the
    pipeline closed."""
    report = campaign(tmp_path / "run", steps=9, max_staleness=max_staleness, save_every=save_every,
                      worker_kills=45, driver_kills=5, seed=seed, startup_kills=True, continuations=1)
    assert report["kills"] == {"worker": 45, "driver": 5}
    check_run(tmp_path / "run", report, max_staleness=max_staleness)
    print(f"kills {report['kills']}, {len(report['resumes'])} resumes, {report['max_steps']} steps, "
          f"{report['wall_s']:.0f} s")
