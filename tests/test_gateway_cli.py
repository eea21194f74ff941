"""``chatgym gateway`` as a real subprocess (a tiny random-init model on the hf engine) driven by the
real ``openai`` client: sessions opened over HTTP, ended sessions appended to the JSONL file."""

from __future__ import annotations

import json
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from train_helpers import TINY_LLAMA

openai = pytest.importorskip("openai")
ROOT = Path(__file__).resolve().parent.parent
TINY = ["model.path=smollm2", "model.random_init=true", "model.config_overrides=" + json.dumps(TINY_LLAMA),
        "engine.backend=hf", "rollout.max_tokens=6", "rollout.temperature=1.0"]


def _lines(stream, out: queue.Queue) -> None:
    for line in stream:
        out.put(line)


@pytest.fixture
def served(tmp_path):
    """The running server: (process, base_url, the JSONL path)."""
    out = tmp_path / "trajs.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chatgym.cli", "gateway", *TINY, "--port", "0", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        first = lines.get(timeout=240)
        match = re.search(r"serving (http://127\.0\.0\.1:\d+/v1) ", first)
        assert match, first
        yield proc, match.group(1), out, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_session_opened_over_http_is_written_as_a_token_exact_jsonl_line(served):
    proc, base_url, out, lines = served
    opened = httpx.post(base_url + "/sessions", json={"task_id": "t1", "meta": {"run": 3}, "sampling_seed": 5})
    assert opened.status_code == 200
    sid = opened.json()["session_id"]
    assert opened.json()["base_url"] == base_url.replace("/v1", f"/s/{sid}/v1")
    client = openai.OpenAI(base_url=base_url, api_key=sid, max_retries=0, timeout=60)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], logprobs=True)
    assert httpx.post(f"{base_url}/sessions/{sid}/reward", json={"reward": 0.5}).json() == {"ok": True}
    ended = httpx.post(f"{base_url}/sessions/{sid}/end").json()["trajectories"]
    # A second session, left open: written at shutdown.
    other = httpx.post(base_url + "/sessions").json()["session_id"]
    openai.OpenAI(base_url=base_url, api_key=other, max_retries=0, timeout=60).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Bye"}])
    httpx.post(base_url + "/sessions")  # a third, left open without a turn: nothing to write
    bad = httpx.post(base_url + "/sessions", json={"group_id": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "group_id"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    # Regression (fresh user): "1 open sessions ended and written" for a session that wrote nothing.
    assert "stopped (2 open sessions ended, 1 with turns written)" in lines.get(timeout=5)

    first, second = [json.loads(line) for line in out.read_text().splitlines()]
    assert first == ended[0]  # the line is the session's Trajectory.to_json(), as the end route returned it
    assert (first["task_id"], first["info"]["meta"], first["reward"]) == ("t1", {"run": 3}, 0.5)
    assert first["info"]["ended_by"] == "end" and second["info"]["ended_by"] == "shutdown"
    n, p = len(first["token_ids"]), first["prompt_len"]
    assert len(first["loss_mask"]) == len(first["engine_logprobs"]) == len(first["weight_versions"]) == n
    assert p == reply.usage.prompt_tokens and first["loss_mask"] == [0] * p + [1] * (n - p)
    assert n - p == reply.usage.completion_tokens == len(reply.choices[0].logprobs.content)
    # The logprobs the agent got are the recorded ones, token by token.
    assert [t.logprob for t in reply.choices[0].logprobs.content] == pytest.approx(first["engine_logprobs"][p:])


def test_a_bad_config_is_one_line_and_exit_status_2(capsys):
    from chatgym.trainer.gateway.cli import main

    assert main(["trainer.gateway.tool_parser=nope", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("chatgym gateway: trainer.gateway.tool_parser: unknown 'nope'")
    assert main(["--port", "70000"]) == 2
    assert capsys.readouterr().err.strip() == "chatgym gateway: --port must be in 0..65535, got 70000"


def test_an_engine_option_the_backend_does_not_take_is_one_line_and_status_2(tmp_path):
    # The vLLM config's engine.options under engine.backend=hf: refused when the engine is built
    # (after the model path resolves), which was a traceback with status 1.
    done = subprocess.run(
        [sys.executable, "-m", "chatgym.cli", "gateway", "examples/configs/gateway_math.yaml", "engine.backend=hf",
         "--port", "0", "--out", str(tmp_path / "t.jsonl")],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "chatgym gateway: engine.options: 'gpu_memory_utilization', 'kv_cache_gib' not taken by the 'hf' engine"
    )
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "t.jsonl").exists()


def gateway_refusal(tmp_path, monkeypatch, capsys, *args: str) -> str:
    """What ``chatgym gateway`` of the math config on the hf engine prints when it refuses ARGS: one
    line, status 2, before the gateway (its engine) is built and with no ``--out`` file made."""
    from chatgym.trainer.gateway import cli

    def no_engine(*a, **k):
        raise AssertionError("the gateway's engine was built before the refusal")

    monkeypatch.setattr(cli, "build_gateway", no_engine)
    out = tmp_path / "t.jsonl"
    config = str(ROOT / "examples" / "configs" / "gateway_math.yaml")
    assert cli.main([config, "engine.backend=hf", "engine.options={}", *args, "--port", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists(), err
    return err


def test_chatgym_train_start_up_checks_run_before_the_engine_is_built(tmp_path, monkeypatch, capsys):
    # Regression: a chat template that raises was refused once vLLM had started (44 lines, the
    # message prefixed `TemplateError:` and naming no field), the --out file left behind.
    from cli_refusals import assert_eos_refusals

    template = tmp_path / "raises.jinja"
    template.write_text("{{ raise_exception('no') }}")
    raised = "the chat template raised TemplateError: no"
    assert gateway_refusal(tmp_path, monkeypatch, capsys, f"rollout.chat_template={template}") == (
        f"chatgym gateway: rollout.chat_template: {raised}; and new messages rendered after a fixed base "
        f"conversation do not match the full rendering either: {raised}\n"
    )
    assert_eos_refusals(
        "gateway", lambda *a: gateway_refusal(tmp_path, monkeypatch, capsys, *a), "engine.options.eos_token_ids",
        lambda ids: (f"engine.options.eos_token_ids={ids}",), tmp_path,
    )  # fmt: skip


IN_USE = "Address already in use"


@pytest.fixture
def port_in_use():
    """``127.0.0.1:<port>`` of a port another server listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_port_in_use_is_one_line_before_the_engine_is_built_and_leaves_no_out_file(
    tmp_path, monkeypatch, capsys, port_in_use
):
    # Regression: the model loaded, then the bind failed ("OSError: [Errno 98] ...") and left an empty
    # --out file (and its directory) behind.
    from chatgym.trainer.gateway import cli

    def no_engine(*a, **k):
        raise AssertionError("the gateway's engine was built before the refusal")

    monkeypatch.setattr(cli, "build_gateway", no_engine)
    out = tmp_path / "new" / "t.jsonl"
    assert cli.main([*TINY, "--port", port_in_use.split(":")[1], "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"chatgym gateway: --port: cannot listen on {port_in_use}: {IN_USE}\n"
    assert list(tmp_path.iterdir()) == []


def test_a_port_taken_after_the_check_is_the_same_line_and_leaves_no_out_file(
    tmp_path, monkeypatch, capsys, port_in_use
):
    # Another process may take the port between the check and the server's start (here: the check
    # skipped), once the engine has loaded: the same refusal, still no --out file.
    from chatgym.trainer.gateway import cli

    monkeypatch.setattr(cli, "check_port", lambda port: None)
    out = tmp_path / "new" / "t.jsonl"
    assert cli.main([*TINY, "--port", port_in_use.split(":")[1], "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"chatgym gateway: --port: cannot listen on {port_in_use}: {IN_USE}"
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_an_engine_without_token_ids_is_refused_naming_engine_backend(tmp_path, monkeypatch, capsys):
    # Regression: engine.backend=openai started serving, then answered every request with a 500
    # (NotImplementedError: the openai engine gives no token ids).
    assert gateway_refusal(tmp_path, monkeypatch, capsys, "engine.backend=openai") == (
        "chatgym gateway: engine.backend: 'openai' is an API chat engine without token ids; the gateway needs "
        "a token engine (auto, hf, sglang, vllm, vllm-server)\n"
    )


def test_a_max_model_len_below_2_is_refused_naming_it_before_the_engine_is_built(tmp_path, monkeypatch, capsys):
    # Regression: RolloutConfig took 1 and the Gateway refused it after the model loaded, a traceback
    # with exit status 1.
    assert gateway_refusal(tmp_path, monkeypatch, capsys, "rollout.max_model_len=1") == (
        "chatgym gateway: rollout.max_model_len must be an int >= 2 (a prompt token and a generated one), got 1\n"
    )
