"""Slow: ``chatgym eval`` with SmolLM2-135M on two envs through vLLM on CPU (in-process, as a
subprocess of the real CLI), and the OpenAI-compatible path against a real vLLM server; the leaderboard
page of the result opened in headless Chromium and checked against the SQLite rows."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from leaderboard_helpers import CHROMIUM, page_matches_sqlite, report_json

from chatgym.trainer.eval import leaderboard_cli
from chatgym.trainer.eval.config import EvalConfig
from chatgym.trainer.eval.identity import weights_hash
from chatgym.trainer.eval.run import evaluate
from chatgym.trainer.eval.store import ResultsStore
from chatgym.trainer.rollout.config import RolloutConfig

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="needs vLLM: pip install 'chatgym[vllm]' (see scripts/setup.sh)")

TASKS = 4


def test_smollm2_vllm_on_two_envs_and_page(tmp_path):
    from chatgym.trainer.models.packaged import load_model_path

    db = tmp_path / "results.sqlite"
    cmd = [
        sys.executable, "-m", "chatgym.cli", "eval", "--engine", "vllm", "--model", "smollm2",
        "--env", "Math-v0", "CodeSandbox-v0", "--max-tasks", str(TASKS), "--max-tokens", "128",
        "--max-response-tokens", "256", "--max-model-len", "2048", "--db", str(db), "--no-progress",
        "--engine-arg", "kv_cache_gib=1",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    reports = json.loads(report_json(res.stdout))
    assert [(r["env_id"], r["ran"], r["skipped"]) for r in reports] == [
        ("Math-v0", TASKS, None),
        ("CodeSandbox-v0", TASKS, None),
    ]
    with ResultsStore(db) as store:
        rows = store.episodes()
    assert len(rows) == 2 * TASKS
    assert {r["model_hash"] for r in rows} == {weights_hash(load_model_path("smollm2"))}
    assert {json.loads(r["sampling"])["temperature"] for r in rows} == {0.0}  # greedy with -n 1
    for r in rows:
        assert r["failed"] == 0, r["error"]
        assert 0 < r["generated_tokens"] <= 256 and r["total_tokens"] > r["generated_tokens"]
        assert r["success"] == int(r["reward"] >= 1.0)
    # Reference rows next to the model's, then the page in Chromium against the SQLite rows.
    asyncio.run(
        evaluate(
            EvalConfig(engine="reference", envs=("Math-v0", "CodeSandbox-v0"), max_tasks=TASKS, db=str(db)),
            progress=False,
        )
    )
    page = tmp_path / "leaderboard.html"
    assert leaderboard_cli.main(["--db", str(db), "--html", str(page)]) == 0
    if CHROMIUM is None:
        pytest.skip("chromium is not installed")
    parsed = page_matches_sqlite(db, page, tmp_path)
    assert {model for model, _ in parsed.cells} == {"smollm2", "reference"}


def test_openai_engine_against_a_vllm_server(tmp_path):
    from chatgym.trainer.engines.vllm_server import start_vllm_server

    server = start_vllm_server(
        "smollm2",
        args=[
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            "2048",
            "--served-model-name",
            "smollm2",
        ],
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        startup_timeout_s=900,
    )
    try:
        config = EvalConfig(
            engine="openai",
            model="smollm2",
            envs=("Math-v0",),
            max_tasks=3,
            rollout=RolloutConfig(temperature=0.0, max_tokens=64),
            db=str(tmp_path / "api.sqlite"),
            engine_kwargs={"base_url": f"{server.url}/v1", "api_key": "unused"},
        )
        [report] = asyncio.run(evaluate(config, progress=False))
    finally:
        server.stop()
    assert (report.ran, report.failed) == (3, 0)
    with ResultsStore(tmp_path / "api.sqlite") as store:
        rows = store.episodes()
    # Tokens per episode come from the API's usage; the weights are not visible through an API.
    assert all(0 < r["generated_tokens"] <= 64 and r["total_tokens"] is None for r in rows)
    assert {(r["model_name"], r["model_hash"], r["engine"]) for r in rows} == {
        ("smollm2", "api:openai", "openai")
    }
