"""`chatgym eval` refuses set-ups that would store an outage as a model's score."""

from __future__ import annotations

import socket
import sqlite3

import pytest
from cli_refusals import assert_chat_template_refusals, refusal

from chatgym.trainer.eval import cli as eval_cli


@pytest.fixture
def no_openai_env(monkeypatch):
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_api_engine_needs_a_model_name(tmp_path, no_openai_env, capsys):
    # Regression: --engine openai without --model evaluated "smollm2" on api.openai.com.
    assert eval_cli.main(["--engine", "openai", "--env", "Math-v0", "--db", str(tmp_path / "r.sqlite")]) == 2
    assert capsys.readouterr().err == "chatgym eval: --engine openai needs --model (the served model's name)\n"


def test_openai_engine_needs_a_url_or_key(tmp_path, no_openai_env, capsys):
    argv = ["--engine", "openai", "--model", "m", "--env", "Math-v0", "--db", str(tmp_path / "r.sqlite")]
    assert eval_cli.main(argv) == 2
    assert capsys.readouterr().err == (
        "chatgym eval: --engine openai needs $OPENAI_BASE_URL (an OpenAI-compatible server) or $OPENAI_API_KEY "
        "(api.openai.com), or --engine-arg base_url=...\n"
    )
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


def eval_refusal(tmp_path, monkeypatch, capsys, *args: str) -> str:
    """What ``chatgym eval --engine hf --env Math-v0 ... ARGS`` prints when it refuses ARGS."""
    argv = ["--engine", "hf", "--env", "Math-v0", "--max-tasks", "1", "--db", str(tmp_path / "r.sqlite"), "--no-progress"]
    return refusal(eval_cli.main, [*argv, *args], monkeypatch, capsys)


def test_chat_template_and_agent_refusals_are_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: each was a traceback (status 1); the refused template and the agent's missing
    # function only once the model had loaded.
    assert_chat_template_refusals("eval", lambda *a: eval_refusal(tmp_path, monkeypatch, capsys, *a), tmp_path)
    agent = tmp_path / "agent.py"
    agent.write_text("def other(base_url, api_key, task):\n    return None\n")
    assert eval_refusal(tmp_path, monkeypatch, capsys, "--agent", f"{agent}:run") == (
        f"chatgym eval: agent: '{agent}' has no callable 'run'\n"
    )


def test_a_misspelt_env_arg_skips_the_env_with_the_reason_rollout_gives(tmp_path, capsys):
    # eval and rollout share the check (build_env): the same words for the same mistake.
    argv = ["--engine", "reference", "--env", "Math-v0", "--env-arg", "difficulty_levl=3", "--db", str(tmp_path / "r.sqlite")]
    assert eval_cli.main(argv) == 1  # nothing evaluated
    assert capsys.readouterr().err == (
        "chatgym eval: Math-v0: skipped, cannot build the env: TypeError: ChatEnv.__init__() got an unexpected "
        "keyword argument 'difficulty_levl' was raised from the environment creator for Math-v0 with kwargs "
        "({'difficulty_levl': 3})\n"
    )
