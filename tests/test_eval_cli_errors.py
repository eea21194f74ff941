"""`chatgym eval` refuses set-ups that would store an outage as a model's score."""

from __future__ import annotations

import socket
import sqlite3

import pytest

from chatgym.trainer.eval import cli as eval_cli


@pytest.fixture
def no_openai_env(monkeypatch):
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_api_engine_needs_a_model_name(tmp_path, no_openai_env):
    # Regression: --engine openai without --model evaluated "smollm2" on api.openai.com.
    with pytest.raises(SystemExit, match=r"^chatgym eval: --engine openai needs --model"):
        eval_cli.main(["--engine", "openai", "--env", "Math-v0", "--db", str(tmp_path / "r.sqlite")])


def test_openai_engine_needs_a_url_or_key(tmp_path, no_openai_env):
    with pytest.raises(SystemExit, match=r"needs \$OPENAI_BASE_URL .* or \$OPENAI_API_KEY"):
        eval_cli.main(["--engine", "openai", "--model", "m", "--env", "Math-v0", "--db", str(tmp_path / "r.sqlite")])
    assert not (tmp_path / "r.sqlite").exists()


def test_a_run_where_every_episode_failed_exits_1(tmp_path, no_openai_env, capsys):
    with socket.socket() as s:  # a port nobody listens on: every request is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = tmp_path / "r.sqlite"
    argv = ["--engine", "openai", "--model", "m", "--env", "Math-v0", "--max-tasks", "2", "--db", str(db),
            "--no-progress", "--engine-arg", f"base_url=http://127.0.0.1:{port}/v1",
            "--engine-arg", "retries=0"]  # fmt: skip
    assert eval_cli.main(argv) == 1
    assert "every episode failed" in capsys.readouterr().err
    with sqlite3.connect(db) as conn:  # stored as failures (visible, re-run with --retry-failed)
        assert conn.execute("SELECT COUNT(*), SUM(failed) FROM episodes").fetchone() == (2, 2)
