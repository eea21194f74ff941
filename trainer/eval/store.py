"""The evaluation results store: one SQLite file (standard-library ``sqlite3``), one row per episode.

Each ``episodes`` row carries everything that makes it comparable with rows written on another day:
the model (display name, weights hash, engine), the env (id, ``-vN`` version, hash of the split's task
rows, split, extra ``gym.make`` keywords), the seed, the sampling settings, and the path of the JSONL
trace that holds the episode. ``run_key`` is a hash of all of those: rows with the same key belong to
one evaluation grid (tasks x samples), and ``UNIQUE(run_key, task_index, sample_index)`` is what makes
a resumed evaluation unable to count an episode twice.

Schema versions live in ``schema_version``; :data:`MIGRATIONS` upgrade a file step by step, each in a
transaction, so a file written by an older chatgym is upgraded in place when opened (by several
processes at once too: see :func:`migrate`):

* v1: ``episodes``.
* v2: ``sessions`` (one row per ``chatgym eval`` invocation of a grid: its start time) and
  ``episodes.session_id``, so wall time survives interruptions (rows from v1 have none; their wall time
  falls back to the sum of their episodes' seconds).
"""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import time
import uuid
from collections.abc import Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatgym.trainer.config.loader import check_writable

SCHEMA_VERSION = 2

# How long an open waits for another process's write lock (a migration, an insert), in seconds.
BUSY_TIMEOUT_S = 30.0

_V1 = """
CREATE TABLE episodes (
    id INTEGER PRIMARY KEY,
    run_key TEXT NOT NULL,
    model_name TEXT NOT NULL,
    model_hash TEXT NOT NULL,
    engine TEXT NOT NULL,
    env_id TEXT NOT NULL,
    env_version TEXT NOT NULL,
    dataset_hash TEXT NOT NULL,
    split TEXT NOT NULL,
    env_kwargs TEXT NOT NULL,
    seed INTEGER NOT NULL,
    sampling TEXT NOT NULL,
    task_index INTEGER NOT NULL,
    task_id TEXT,
    sample_index INTEGER NOT NULL,
    reward REAL NOT NULL,
    success INTEGER NOT NULL,
    turns INTEGER NOT NULL,
    generated_tokens INTEGER,
    total_tokens INTEGER,
    tool_calls INTEGER NOT NULL,
    tool_errors INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    error TEXT,
    truncated INTEGER NOT NULL,
    wall_s REAL NOT NULL,
    trace_path TEXT,
    created_at REAL NOT NULL,
    chatgym_version TEXT NOT NULL,
    UNIQUE (run_key, task_index, sample_index)
);
CREATE INDEX episodes_cell ON episodes (model_name, model_hash, env_id, dataset_hash);
"""

_V2 = """
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    run_key TEXT NOT NULL,
    started_at REAL NOT NULL,
    argv TEXT
);
ALTER TABLE episodes ADD COLUMN session_id TEXT;
"""

# MIGRATIONS[i] takes a file from version i to version i + 1 (version 0: empty file).
MIGRATIONS: tuple[str, ...] = (_V1, _V2)

EPISODE_FIELDS = (
    "run_key",
    "model_name",
    "model_hash",
    "engine",
    "env_id",
    "env_version",
    "dataset_hash",
    "split",
    "env_kwargs",
    "seed",
    "sampling",
    "task_index",
    "task_id",
    "sample_index",
    "reward",
    "success",
    "turns",
    "generated_tokens",
    "total_tokens",
    "tool_calls",
    "tool_errors",
    "failed",
    "error",
    "truncated",
    "wall_s",
    "trace_path",
    "created_at",
    "chatgym_version",
    "session_id",
)


def schema_version(conn: sqlite3.Connection) -> int:
    """The file's schema version (0 for a file chatgym never wrote to)."""
    has = conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name='schema_version'"
    ).fetchone()
    if not has:
        return 0
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Upgrade ``conn``'s file to ``target``, one migration per transaction; returns the new version.

    Safe when several processes open the same file at once (parallel ``chatgym eval`` runs into one
    store): each step runs in a ``BEGIN IMMEDIATE`` transaction, which takes SQLite's write lock
    before the version is read, so the other processes wait (the connection's busy timeout) and
    then see the version the first one wrote, instead of all reading version 0 and all creating
    the tables (``OperationalError: table episodes already exists``).

    Raises:
        RuntimeError: the file is newer than this chatgym (written by a later version).
        sqlite3.OperationalError: the write lock was not granted within the busy timeout.
    """

    def check(current: int) -> int:
        if current > SCHEMA_VERSION:
            raise RuntimeError(
                f"results store has schema version {current}, newer than this chatgym's {SCHEMA_VERSION}; "
                "upgrade chatgym to read it"
            )
        return current

    current = check(schema_version(conn))
    while current < target:  # read above without a lock: an up-to-date file takes no write lock
        # executescript would commit on its own; run the statements in one explicit transaction.
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = check(schema_version(conn))  # again, under the lock: another process may be done
            if current < target:
                for statement in filter(str.strip, MIGRATIONS[current].split(";")):
                    conn.execute(statement)
                conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                conn.execute("DELETE FROM schema_version")
                conn.execute("INSERT INTO schema_version VALUES (?)", (current + 1,))
                current += 1
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return current


def _enable_wal(conn: sqlite3.Connection, timeout_s: float = BUSY_TIMEOUT_S) -> None:
    """Put the file in WAL mode (readers never block the writer; the mode is stored in the file).

    Switching to WAL needs the file to itself, and SQLite answers "database is locked" at once,
    without waiting out the busy timeout, while another connection is switching it or migrating:
    so retry with a short random pause until ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.01, 0.05))


@dataclass
class ResultsStore:
    """An open results file (created and migrated on open).

    Args:
        path: the SQLite file (its directory is created).

    Raises:
        RuntimeError: the file was written by a newer chatgym (see :func:`migrate`).
        sqlite3.DatabaseError: the file is not a SQLite database.
    """

    path: str | os.PathLike
    conn: sqlite3.Connection = field(init=False, repr=False)

    def __post_init__(self) -> None:
        Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: autocommit; each insert is durable at once (an interrupted eval keeps
        # every finished episode), and migrate() manages its own transactions.
        self.conn = sqlite3.connect(
            os.fspath(Path(self.path).expanduser()), isolation_level=None, timeout=BUSY_TIMEOUT_S
        )
        self.conn.row_factory = sqlite3.Row
        _enable_wal(self.conn)
        migrate(self.conn)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- writing -------------------------------------------------------------------------------

    def start_session(self, run_key: str, argv: Iterable[str] = ()) -> str:
        """Record the start of an evaluation of grid ``run_key``; returns the session id."""
        session_id = uuid.uuid4().hex
        self.conn.execute(
            "INSERT INTO sessions (session_id, run_key, started_at, argv) VALUES (?, ?, ?, ?)",
            (session_id, run_key, time.time(), json.dumps(list(argv))),
        )
        return session_id

    def add_episode(self, row: Mapping[str, Any]) -> bool:
        """Insert one episode row (keys: :data:`EPISODE_FIELDS`; ``created_at`` defaults to now).

        Returns:
            False when the grid already holds this ``(run_key, task_index, sample_index)`` (the row is
            not written again), True otherwise.

        Raises:
            KeyError: a required field is missing (named).
            ValueError: the reward is not a finite number (SQLite would store NaN as NULL; the caller
                records such an episode as failed, see :func:`.run.episode_row`).
            sqlite3.IntegrityError: any other constraint failure (a NULL in a NOT NULL column).
        """
        values = {"created_at": time.time(), "session_id": None, **row}
        missing = [f for f in EPISODE_FIELDS if f not in values]
        if missing:
            raise KeyError(f"episode row lacks {missing}")
        if not math.isfinite(values["reward"]):
            raise ValueError(f"episode reward must be a finite number, got {values['reward']!r}")
        # ON CONFLICT names the grid's key: only a true duplicate is skipped. (INSERT OR IGNORE also
        # skipped a row failing NOT NULL — a NaN reward — so the episode vanished and ran again forever.)
        cur = self.conn.execute(
            f"INSERT INTO episodes ({', '.join(EPISODE_FIELDS)}) "
            f"VALUES ({', '.join('?' * len(EPISODE_FIELDS))}) "
            "ON CONFLICT (run_key, task_index, sample_index) DO NOTHING",
            [values[f] for f in EPISODE_FIELDS],
        )
        return cur.rowcount == 1

    def drop_failed(self, run_key: str) -> int:
        """Delete grid ``run_key``'s failed episodes (so a resumed evaluation runs them again);
        returns how many were deleted."""
        return self.conn.execute("DELETE FROM episodes WHERE run_key = ? AND failed = 1", (run_key,)).rowcount

    # ---- reading -------------------------------------------------------------------------------

    def done(self, run_key: str) -> set[tuple[int, int]]:
        """``(task_index, sample_index)`` of the episodes already stored for grid ``run_key``."""
        rows = self.conn.execute(
            "SELECT task_index, sample_index FROM episodes WHERE run_key = ?", (run_key,)
        ).fetchall()
        return {(int(t), int(s)) for t, s in rows}

    def distinct(self, column: str) -> set[Any]:
        """Every value ``column`` (a column name of ``episodes``: ``env_id``, ``model_name``, ...) holds."""
        with closing(self.conn.execute(f"SELECT DISTINCT {column} FROM episodes")) as cur:
            return {value for (value,) in cur.fetchall()}

    def episodes(self, where: str = "", params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """Episode rows as dicts, optionally filtered by an SQL ``where`` clause with ``?`` params."""
        sql = "SELECT * FROM episodes" + (f" WHERE {where}" if where else "") + " ORDER BY id"
        with closing(self.conn.execute(sql, list(params))) as cur:
            return [dict(r) for r in cur.fetchall()]

    def wall_seconds(self, rows: Iterable[Mapping[str, Any]]) -> float:
        """Wall time that produced ``rows``: per session, from its start to its last stored episode,
        summed; rows without a session (schema v1) add their own episode seconds."""
        rows = list(rows)
        last: dict[str, float] = {}
        total = 0.0
        for r in rows:
            sid = r.get("session_id")
            if sid is None:
                total += float(r["wall_s"])
            else:
                last[sid] = max(last.get(sid, 0.0), float(r["created_at"]))
        if last:
            marks = ",".join("?" * len(last))
            starts = dict(
                self.conn.execute(
                    f"SELECT session_id, started_at FROM sessions WHERE session_id IN ({marks})", list(last)
                ).fetchall()
            )
            total += sum(max(0.0, end - starts.get(sid, end)) for sid, end in last.items())
        return total


def checked_store(path: str | os.PathLike, flag: str = "--db") -> ResultsStore | None:
    """The store at ``path`` opened when the file exists; else None once it is known that it can be
    made there (a file is created in its nearest existing folder and deleted; nothing else is made).

    For commands to call before any model loads: a bad path is then one line naming ``flag``, not a
    traceback (a directory, a file that is not SQLite, an unwritable place such as ``/proc``).

    Raises:
        ValueError: naming ``flag``: ``path`` is a directory, is not a results store (or was written
            by a newer chatgym), or cannot be created.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(f"{flag}: {path} is a directory, not a results file")
    if p.exists():
        try:
            return ResultsStore(p)
        except (sqlite3.DatabaseError, RuntimeError, OSError) as exc:
            raise ValueError(f"{flag}: {path} is not a usable results file: {exc}") from None
    check_writable(p.parent, flag, path)
    return None
