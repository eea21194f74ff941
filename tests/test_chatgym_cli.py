"""The ``chatgym`` command's dispatcher (chatgym/cli.py): ``--version``, and the vLLM log settings every
subcommand starts with."""

from __future__ import annotations

import os

import pytest

from chatgym import __version__
from chatgym.cli import main


def test_version(capsys):
    # Regression (fresh-user walk): `chatgym --version` was an unknown subcommand.
    assert main(["--version"]) == 0 and capsys.readouterr().out == f"chatgym {__version__}\n"


def test_subcommands_quiet_vllm_and_send_its_log_to_stderr(monkeypatch):
    # Regression (fresh-user walk): `chatgym rollout/eval --engine vllm` printed vLLM's INFO lines, a
    # config dump among them, on stdout amid their JSON summaries (only `chatgym train` quieted them).
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_STREAM", raising=False)
    with pytest.raises(SystemExit):
        main(["leaderboard", "--help"])
    assert (os.environ["VLLM_LOGGING_LEVEL"], os.environ["VLLM_LOGGING_STREAM"]) == ("WARNING", "ext://sys.stderr")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # a user's own setting is kept
    with pytest.raises(SystemExit):
        main(["leaderboard", "--help"])
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"
