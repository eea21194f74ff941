"""The SQLite results store: schema, migration of a v1 file, idempotent inserts; identities."""

from __future__ import annotations

import shutil
import sqlite3
import traceback

import pytest
from leaderboard_helpers import store_row

from chatgym.trainer.eval.identity import dataset_hash, env_version, short_hash, weights_hash
from chatgym.trainer.eval.store import (
    EPISODE_FIELDS,
    MIGRATIONS,
    SCHEMA_VERSION,
    ResultsStore,
    schema_version,
)


def _row(**over):
    return store_row(**{"sampling": "{}", "trace_path": "/x.jsonl", **over})


def test_fresh_store_has_current_schema_and_ignores_duplicates(tmp_path):
    with ResultsStore(tmp_path / "sub" / "r.sqlite") as store:
        assert schema_version(store.conn) == SCHEMA_VERSION == 2
        session = store.start_session("k1", ["chatgym", "eval"])
        assert store.add_episode(_row(session_id=session)) is True
        # Same (run_key, task, sample): not written again, whatever its values.
        assert store.add_episode(_row(session_id=session, reward=0.0)) is False
        assert store.add_episode(_row(sample_index=1, session_id=session)) is True
        assert store.done("k1") == {(0, 0), (0, 1)} and store.done("other") == set()
        rows = store.episodes()
        assert [r["reward"] for r in rows] == [1.0, 1.0]
        with pytest.raises(KeyError, match="reward"):
            store.add_episode({k: v for k, v in _row(task_index=5).items() if k != "reward"})


def test_only_a_true_duplicate_is_ignored(tmp_path):
    # Regression: INSERT OR IGNORE also swallowed NOT NULL failures (SQLite stores a NaN reward as
    # NULL): add_episode returned False and the episode vanished from the store.
    with ResultsStore(tmp_path / "r.sqlite") as store:
        with pytest.raises(ValueError, match="finite number, got nan"):
            store.add_episode(_row(reward=float("nan")))
        with pytest.raises(ValueError, match="finite number, got inf"):
            store.add_episode(_row(reward=float("inf")))
        with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
            store.add_episode(_row(model_name=None))
        assert store.episodes() == []
        assert store.add_episode(_row()) is True
        assert store.add_episode(_row(reward=0.0)) is False
        assert [r["reward"] for r in store.episodes()] == [1.0]


def test_migrating_a_v1_file_keeps_its_rows(tmp_path):
    path = tmp_path / "v1.sqlite"
    # A file as chatgym's first schema wrote it: v1 tables, version 1, one episode.
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (1)")
    v1_fields = [f for f in EPISODE_FIELDS if f != "session_id"]
    row = _row(created_at=1000.0, wall_s=2.25)
    conn.execute(
        f"INSERT INTO episodes ({', '.join(v1_fields)}) VALUES ({', '.join('?' * len(v1_fields))})",
        [row[f] for f in v1_fields],
    )
    conn.commit()
    conn.close()

    with ResultsStore(path) as store:
        assert schema_version(store.conn) == 2
        [old] = store.episodes()
        assert old["session_id"] is None and old["reward"] == 1.0 and old["created_at"] == 1000.0
        # New rows go next to it; a v1 row's wall time is its own seconds.
        session = store.start_session("k1")
        store.add_episode(_row(task_index=1, session_id=session))
        assert store.done("k1") == {(0, 0), (1, 0)}
        assert store.wall_seconds([old]) == 2.25
    with ResultsStore(path) as store:  # reopening does not migrate again
        assert schema_version(store.conn) == 2 and len(store.episodes()) == 2


def test_newer_file_is_refused(tmp_path):
    path = tmp_path / "new.sqlite"
    ResultsStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        ResultsStore(path)


def test_wall_seconds_from_sessions(tmp_path):
    with ResultsStore(tmp_path / "w.sqlite") as store:
        s1 = store.start_session("k1")
        store.conn.execute("UPDATE sessions SET started_at = 100.0 WHERE session_id = ?", (s1,))
        s2 = store.start_session("k1")
        store.conn.execute("UPDATE sessions SET started_at = 500.0 WHERE session_id = ?", (s2,))
        store.add_episode(_row(task_index=0, session_id=s1, created_at=103.0))
        store.add_episode(_row(task_index=1, session_id=s1, created_at=107.5))
        store.add_episode(_row(task_index=2, session_id=s2, created_at=502.0))
        # Session 1: 107.5 - 100 = 7.5 s; session 2: 2 s (the gap between them is not counted).
        assert store.wall_seconds(store.episodes()) == pytest.approx(9.5)


def test_identities(tmp_path):
    assert env_version("Math-v0") == "v0" and env_version("Foo-v12") == "v12" and env_version("Foo") == "v?"
    rows = [{"q": "1+1", "a": "2"}, {"q": "2+2", "a": "4"}]
    assert dataset_hash(rows) == dataset_hash([dict(r) for r in rows])
    assert dataset_hash(rows) != dataset_hash(rows[::-1]) != dataset_hash([*rows, {"q": "x", "a": "y"}])
    assert short_hash({"b": 1, "a": 2}) == short_hash({"a": 2, "b": 1})

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\x00" * 1000 + b"weights")
    (model / "config.json").write_text('{"hidden": 8}')
    (model / "README.md").write_text("not hashed")
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    (copy / "README.md").write_text("changed")
    assert weights_hash(model) == weights_hash(copy)  # by content, wherever it lives
    (copy / "model.safetensors").write_bytes(b"\x00" * 1000 + b"weightz")
    assert weights_hash(model) != weights_hash(copy)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no weights"):
        weights_hash(tmp_path / "empty")


# ---- several processes opening one store at once ------------------------------------------------
# Parallel `chatgym eval` runs into one results file are the normal way to fill a leaderboard. Each
# worker waits at a barrier so that all of them open the file in the same instant, then stores 20
# episodes with its own task indices (worker * 20 + i): 80 distinct keys in all.


def _open_and_add(path, barrier, worker, results):
    try:
        barrier.wait(timeout=60)
        with ResultsStore(path) as store:
            session = store.start_session("k1", ["worker", str(worker)])
            for i in range(20):
                assert store.add_episode(_row(task_index=worker * 20 + i, session_id=session)) is True
        results.put((worker, "ok"))
    except BaseException as exc:  # reported to the parent, which asserts every worker said "ok"
        results.put((worker, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _race(path, workers: int) -> dict[int, str]:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # fork: no re-import per worker, the test stays ~1 s
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_open_and_add, args=(path, barrier, w, results)) for w in range(workers)]
    for p in procs:
        p.start()
    out = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return out


def _write_v1_file(path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (1)")
    v1_fields = [f for f in EPISODE_FIELDS if f != "session_id"]
    row = _row(run_key="old", created_at=1000.0)
    conn.execute(
        f"INSERT INTO episodes ({', '.join(v1_fields)}) VALUES ({', '.join('?' * len(v1_fields))})",
        [row[f] for f in v1_fields],
    )
    conn.commit()
    conn.close()


@pytest.mark.parametrize("trial", range(3))
def test_four_processes_create_one_new_store_at_once(tmp_path, trial):
    # Before: 3 of the 4 failed with "OperationalError: table episodes already exists" (each read
    # version 0 and ran the v1 migration) and 20 of 80 rows were stored.
    path = tmp_path / "results.sqlite"
    assert _race(path, 4) == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}
    with ResultsStore(path) as store:
        rows = store.episodes()
        assert schema_version(store.conn) == SCHEMA_VERSION
        assert len(rows) == 80
        assert store.done("k1") == {(t, 0) for t in range(80)}  # 80 distinct keys
        assert len({r["session_id"] for r in rows}) == 4


@pytest.mark.parametrize("trial", range(3))
def test_two_processes_migrate_one_v1_store_at_once(tmp_path, trial):
    path = tmp_path / "v1.sqlite"
    _write_v1_file(path)
    assert _race(path, 2) == {0: "ok", 1: "ok"}
    with ResultsStore(path) as store:
        assert schema_version(store.conn) == SCHEMA_VERSION
        assert store.done("old") == {(0, 0)}  # the v1 row survives the migration, once
        assert store.done("k1") == {(t, 0) for t in range(40)}
        assert len(store.episodes()) == 41
        cols = [r[1] for r in store.conn.execute("PRAGMA table_info(episodes)")]
        assert cols.count("session_id") == 1  # ALTER TABLE ran once
