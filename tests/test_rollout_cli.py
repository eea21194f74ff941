"""``chatgym rollout``: argument errors (fast) and a real run on SmolLM2 as a subprocess (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from chatgym.trainer.rollout.cli import build_parser, cli_main


def test_help_lists_the_budgets():
    text = build_parser().format_help()
    for flag in (
        "--env",
        "--engine",
        "--model",
        "-n",
        "--out",
        "--max-tokens",
        "--max-response-tokens",
        "--max-model-len",
    ):
        assert flag in text


def test_bad_arguments_name_the_option(tmp_path):
    with pytest.raises(SystemExit, match="-n/--num-tasks must be >= 1"):
        cli_main(["--env", "CodeSandbox-v0", "-n", "0", "--out", str(tmp_path / "t.jsonl")])
    with pytest.raises(SystemExit, match="--engine-arg expects key=value"):
        cli_main(
            [
                "--env",
                "CodeSandbox-v0",
                "--engine",
                "hf",
                "--engine-arg",
                "dtype",
                "--out",
                str(tmp_path / "t.jsonl"),
            ]
        )
    with pytest.raises(SystemExit):  # argparse: invalid choice
        build_parser().parse_args(["--env", "X", "--engine", "nope", "--out", "t"])


@pytest.mark.slow
def test_rollout_command_writes_trajectories(tmp_path):
    out = tmp_path / "t.jsonl"
    cmd = [
        sys.executable, "-m", "chatgym.cli", "rollout", "--env", "CodeSandbox-v0", "--engine", "hf",
        "--model", "smollm2", "-n", "2", "-g", "2", "--max-tokens", "16", "--max-response-tokens", "16",
        "--temperature", "0", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert stats["episodes"] == 4 and stats["failed"] == 0
    assert stats["generated_tokens"] <= 4 * 16
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["group_id"], r["sample_index"]) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in records:
        assert r["env_id"] == "CodeSandbox-v0"
        assert len(r["token_ids"]) == len(r["loss_mask"]) == len(r["logprobs"])
        assert sum(r["loss_mask"]) == sum(t["completion_tokens"] for t in r["info"]["turns"]) <= 16
