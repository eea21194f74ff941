"""`chatgym eval` refuses set-ups that would store an outage as a model's score."""

from __future__ import annotations

import socket
import sqlite3

import pytest
from cli_refusals import (
    assert_chat_template_refusals,
    assert_engine_value_refusal,
    assert_token_engine_refusals,
    refusal,
)

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
    """What ``chatgym eval --engine hf --env Math-v0 ... ARGS`` prints when it refuses ARGS; no results
    file is made."""
    db = tmp_path / "r.sqlite"
    argv = ["--engine", "hf", "--env", "Math-v0", "--max-tasks", "1", "--db", str(db), "--no-progress"]
    err = refusal(eval_cli.main, [*argv, *args], monkeypatch, capsys)
    assert not db.exists()  # regression: a refused chat template left an empty results.sqlite
    return err


def test_chat_template_and_agent_refusals_are_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: each was a traceback (status 1); the refused template and the agent's missing
    # function only once the model had loaded.
    assert_chat_template_refusals("eval", lambda *a: eval_refusal(tmp_path, monkeypatch, capsys, *a), tmp_path)
    agent = tmp_path / "agent.py"
    agent.write_text("def other(base_url, api_key, task):\n    return None\n")
    # Regression: named `agent:` where the other messages name flags.
    assert eval_refusal(tmp_path, monkeypatch, capsys, "--agent", f"{agent}:run") == (
        f"chatgym eval: --agent: '{agent}' has no callable 'run'\n"
    )
    assert eval_refusal(tmp_path, monkeypatch, capsys, "--agent", f"{tmp_path / 'none.py'}:run") == (
        f"chatgym eval: --agent: no such file '{tmp_path / 'none.py'}'\n"
    )
    assert eval_refusal(tmp_path, monkeypatch, capsys, "--engine", "openai", "--model", "m", "--engine-arg",
                        "base_url=http://127.0.0.1:1/v1", "--agent", f"{agent}:run") == (
        "chatgym eval: --agent: a 'module:function' program on a token engine (vllm, vllm-server, sglang, hf), "
        f"got agent '{agent}:run' with engine 'openai'\n"
    )  # fmt: skip


def test_evalconfig_refusals_name_the_flags(tmp_path, monkeypatch, capsys):
    # Regression: EvalConfig's field names (n_samples, max_tasks) where the command's flags are meant.
    def refuse(*args: str) -> str:
        return eval_refusal(tmp_path, monkeypatch, capsys, *args)

    assert refuse("-n", "0") == "chatgym eval: -n/--n-samples must be an int >= 1, got 0\n"
    assert refuse("--max-tasks", "0") == "chatgym eval: --max-tasks must be >= 1, got 0\n"


def test_token_engine_arguments_are_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: `--chat-template model` on a model without one was a 32-line traceback (status 1), as
    # were an --engine-arg the engine does not take and a missing --model (rollout: one line each);
    # --engine-arg eos_token_ids=[99999] was refused as a fault of --chat-template.
    def refuse(*args: str) -> str:
        return eval_refusal(tmp_path, monkeypatch, capsys, *args)

    assert_token_engine_refusals("eval", refuse, tmp_path)
    assert refuse("--engine", "openai", "--model", "m", "--engine-arg", "base_url=http://127.0.0.1:1/v1",
                  "--engine-arg", "retrys=0") == (
        "chatgym eval: --engine-arg: 'retrys' not taken by the 'openai' engine (OpenAIChatEngine); "
        "did you mean 'retries' for 'retrys'?\n"
    )  # fmt: skip
    err = refuse("--model", str(tmp_path / "nomodel"))
    assert err.startswith(f"chatgym eval: --model: model '{tmp_path / 'nomodel'}' is neither a packaged model")


def test_a_value_the_engine_refuses_as_it_starts_is_one_line_and_leaves_no_results_file(tmp_path, capsys):
    # Regression: the engine's ValueError was a traceback with status 1, after the results file had
    # been made.
    db = tmp_path / "r.sqlite"
    assert_engine_value_refusal("eval", eval_cli.main, ["--env", "Math-v0", "--db", str(db)], capsys)
    assert not db.exists()


def test_a_misspelt_env_arg_skips_the_env_with_the_reason_rollout_gives(tmp_path, capsys):
    # eval and rollout share the check (build_env): the same words for the same mistake.
    argv = ["--engine", "reference", "--env", "Math-v0", "--env-arg", "difficulty_levl=3", "--db", str(tmp_path / "r.sqlite")]
    assert eval_cli.main(argv) == 1  # nothing evaluated
    assert capsys.readouterr().err == (
        "chatgym eval: Math-v0: skipped, cannot build the env: TypeError: ChatEnv.__init__() got an unexpected "
        "keyword argument 'difficulty_levl' was raised from the environment creator for Math-v0 with kwargs "
        "({'difficulty_levl': 3})\n"
    )
