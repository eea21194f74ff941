"""``chatgym serve-sandbox`` as a real process on 127.0.0.1, driven by the official SandboxFusion
client (``sandbox_fusion`` from PyPI) and by our ``SandboxFusionSandbox``."""

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

sf = pytest.importorskip("sandbox_fusion", reason="pip install sandbox-fusion (the dev extra)")

from chatgym.sandboxes.base import Sandbox, Session  # noqa: E402
from chatgym.sandboxes.fusion.api import exec_result  # noqa: E402
from chatgym.sandboxes.fusion.client import SandboxFusionSandbox  # noqa: E402
from chatgym.sandboxes.fusion.service import start_service, stop_service  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def service():
    proc, url = start_service("--max-concurrency", "8", "--max-output-bytes", "65536")
    yield url
    stop_service(proc)
    assert proc.returncode == 0  # SIGTERM -> clean shutdown (backend closed)


def test_official_client_run_code(service):
    files = {"data/in.txt": base64.b64encode(b"from a file").decode()}
    code = (
        "import sys\nprint(input()[::-1])\nprint(open('data/in.txt').read())\nprint('warn', file=sys.stderr)"
    )
    r = sf.run_code(
        sf.RunCodeRequest(code=code, language="python", stdin="abc\n", files=files), endpoint=service
    )
    assert r.status == sf.RunStatus.Success
    assert r.run_result.status == sf.CommandRunStatus.Finished
    assert (r.run_result.return_code, r.run_result.stdout, r.run_result.stderr) == (
        0,
        "cba\nfrom a file\n",
        "warn\n",
    )
    assert r.compile_result is None and r.run_result.execution_time > 0


async def test_official_async_client_bash_and_timeout(service):
    r = await sf.run_code_async(sf.RunCodeRequest(code="echo hi; exit 3", language="bash"), endpoint=service)
    assert (r.status, r.run_result.return_code, r.run_result.stdout) == (sf.RunStatus.Failed, 3, "hi\n")
    t = await sf.run_code_async(
        sf.RunCodeRequest(code="while True: pass", language="python", run_timeout=0.5), endpoint=service
    )
    assert t.status == sf.RunStatus.Failed and t.run_result.status == sf.CommandRunStatus.TimeLimitExceeded
    # Upper bound loose: with no cgroup CPU share, a machine at load 15+ once delayed the kill to 16 s.
    assert 0.5 <= t.run_result.execution_time < 30


def test_official_client_run_jupyter(service):
    cells = [
        "a = 123",
        "a",
        "print(a + 1)",
        'raise RuntimeError("error message")',
        "print('p', end=''); [a, 'x\\ny']",
    ]
    r = sf.run_jupyter(sf.RunJupyterRequest(cells=cells), endpoint=service)
    assert r.status == sf.RunStatus.Failed  # one cell raised
    assert [c.stdout for c in r.cells] == ["", "", "124\n", "", "p"]
    # A cell's last value is Jupyter's execute_result: its repr in `display`, not in stdout.
    assert [c.display for c in r.cells] == [
        [],
        [{"text/plain": "123"}],
        [],
        [],
        [{"text/plain": "[123, 'x\\ny']"}],
    ]
    assert [len(c.error) for c in r.cells] == [0, 0, 0, 1, 0]
    err = r.cells[3].error[0]
    assert (err["ename"], err["evalue"]) == ("RuntimeError", "error message")
    assert r.driver.status == sf.CommandRunStatus.Finished
    files = {"m.py": base64.b64encode(b"X = 7\n").decode()}
    r = sf.run_jupyter(sf.RunJupyterRequest(cells=["import m", "m.X"], files=files), endpoint=service)
    assert r.status == sf.RunStatus.Success and [c.display for c in r.cells] == [[], [{"text/plain": "7"}]]
    r = sf.run_jupyter(
        sf.RunJupyterRequest(cells=["x = 1", "while True: pass", "x"], cell_timeout=0.5), endpoint=service
    )
    assert r.driver.status == sf.CommandRunStatus.TimeLimitExceeded and len(r.cells) == 1


def test_official_client_sees_unsupported_language(service):
    with pytest.raises(Exception, match="language 'cpp' is not supported by this service"):
        sf.run_code(sf.RunCodeRequest(code="int main(){}", language="cpp"), endpoint=service, max_attempts=1)


async def test_bad_requests_get_400_naming_the_field(service):
    async with aiohttp.ClientSession() as http:
        for body, field in [({"language": "python"}, "code"), ({"code": "1", "language": "python", "run_timeout": "x"}, "run_timeout"),
                            ({"code": "1", "language": "python", "files": {"../x": "AA=="}}, "files"),
                            ({"code": "1", "language": "python", "files": {"a": "%%%"}}, "base64"),
                            ({"cells": "x = 1"}, "cells")]:  # fmt: skip
            path = "/run_jupyter" if "cells" in body else "/run_code"
            async with http.post(service + path, json=body) as resp:
                assert resp.status == 400
                assert field in (await resp.json())["message"]
        async with http.get(service + "/v1/ping") as resp:
            assert await resp.json() == "pong"
        async with http.get(service + "/health") as resp:
            health = await resp.json()
        assert health["backend"] == "local" and health["languages"] == ["python", "bash"]
        assert health["limiter"]["max_concurrency"] == 8


async def test_our_client_statuses(service):
    sb = SandboxFusionSandbox(service, max_output_bytes=1000)
    assert isinstance(sb, Sandbox)
    try:
        await sb.start()
        ok = await sb.run("import sys; print(sys.stdin.read().upper())", stdin="hey", files={"f": b"\x00"})
        assert (ok.status, ok.stdout, ok.exit_code, ok.truncated) == ("ok", "HEY\n", 0, False)
        err = await sb.run("raise ValueError('bad')")
        assert err.status == "error" and err.exit_code == 1 and err.stderr.endswith("ValueError: bad\n")
        tmo = await sb.run("import time; time.sleep(30)", timeout_s=0.5)
        assert tmo.status == "timeout" and tmo.duration_s < 5
        oom = await sb.run("x = bytearray(400 << 20)", memory_mb=100)  # memory_limit_MB reaches the backend
        assert oom.status == "oom"
        big = await sb.run("print('x' * 5000)")  # cut here, at 1000 bytes, and flagged
        assert big.truncated and big.stdout == "x" * 1000
        huge = await sb.run("print('y' * 200_000)")  # cut by the service at 65536 bytes, flagged too
        assert huge.truncated and huge.info["stdout_bytes"] == 200_001 and len(huge.stdout) == 1000
        bash = await sb.run("echo $((6 * 7))", language="bash")
        assert bash.stdout == "42\n"
        with pytest.raises(ValueError, match="language"):
            await sb.run("x", language="cobol")
    finally:
        await sb.close()


async def test_output_cut_on_a_character_boundary_like_the_local_backend(service):
    # The service (cap 65,536) and our client (cap 65,536) apply the local backends' rule: 90,000
    # bytes of '€' come back as 21,845 whole '€' (65,535 bytes), no U+FFFD; written invalid bytes
    # are replaced. The same through /run_jupyter (a session).
    euro = "import sys; n = sys.stdout.write('€' * 30000)"
    invalid = "import sys; sys.stdout.buffer.write(b'a\\xffb'); sys.stdout.flush()"
    async with SandboxFusionSandbox(service) as sb:
        session = await sb.open_session()
        for res in (await sb.run(euro), await session.run(euro)):
            assert (res.status, res.truncated, len(res.stdout.encode())) == ("ok", True, 65535), res
            assert res.stdout == "€" * 21845
        for res in (await sb.run(invalid), await session.run(invalid)):
            assert (res.status, res.stdout, res.truncated) == ("ok", "a\ufffdb", False), res
        await session.close()
    # What the service itself answers (the official client, no cap of ours on that side).
    raw = await sf.run_code_async(sf.RunCodeRequest(code=euro, language="python"), endpoint=service)
    assert raw.run_result.stdout == "€" * 21845
    # A client cap below the service's cuts again by the same rule: 1,000 = 333 * 3 + 1 bytes.
    async with SandboxFusionSandbox(service, max_output_bytes=1000) as small:
        res = await small.run(euro)
        assert (res.stdout, res.truncated) == ("€" * 333, True)


async def test_our_client_session_replays_history(service):
    async with SandboxFusionSandbox(service) as sb:
        s = await sb.open_session()
        assert isinstance(s, Session)
        assert (await s.run("x = 20")).stdout == ""
        r = await s.run("x += 1\nx * 2")
        assert (r.status, r.stdout) == ("ok", "42\n")
        e = await s.run("1 / 0")
        assert e.status == "error" and "ZeroDivisionError" in e.stderr
        assert (await s.run("x")).stdout == "21\n"
        t = await s.run("while True: pass", timeout_s=0.5)
        assert t.status == "timeout"
        fresh = await s.run("'x' in dir()")
        assert fresh.stdout == "False\n" and fresh.info["fresh_interpreter"]
        await s.close()


async def test_our_client_when_the_service_is_gone():
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with SandboxFusionSandbox(f"http://127.0.0.1:{port}") as sb:
        res = await sb.run("print(1)")
        assert res.status == "killed" and res.info["internal"] and "service failed" in res.stderr
        with pytest.raises(ConnectionError):
            await sb.start()


def test_status_from_a_foreign_server_response():
    """A SandboxFusion server without our ``chatgym`` key: status derived from the code alone (its
    stderr is the program's text: ``MemoryError`` there is no observation of a limit)."""
    run = {
        "status": "Finished",
        "execution_time": 0.1,
        "return_code": 1,
        "stdout": "",
        "stderr": "MemoryError\n",
    }
    assert exec_result({"status": "Failed", "run_result": run}, 100).status == "error"
    run.update(return_code=-9, stderr="")
    assert exec_result({"status": "Failed", "run_result": run}, 100).status == "killed"
    run.update(status="TimeLimitExceeded")
    assert exec_result({"status": "Failed", "run_result": run}, 100).status == "timeout"
    comp = {"status": "Finished", "return_code": 1, "stdout": "", "stderr": "error: x"}
    assert (
        exec_result({"status": "Failed", "compile_result": comp, "run_result": None}, 100).status == "error"
    )
    run.update(status="Finished", return_code=0, stdout="é" * 10)  # 20 bytes cut at 5: no half characters
    r = exec_result({"status": "Success", "run_result": run}, 5)
    assert (r.status, r.stdout, r.truncated) == ("ok", "éé", True)
    assert exec_result({"status": "SandboxError", "message": "boom"}, 5).info["internal"]


def test_serve_sandbox_cli_rejects_bad_flags():
    r = subprocess.run([sys.executable, "-m", "chatgym.cli", "serve-sandbox", "--max-concurrency", "0"],
                       capture_output=True, text=True, cwd=REPO, env={**os.environ})  # fmt: skip
    assert r.returncode == 2 and "--max-concurrency must be >= 1" in r.stderr


async def test_many_concurrent_requests(service):
    async with SandboxFusionSandbox(service, max_concurrency=16) as sb:
        res = await asyncio.gather(*(sb.run(f"print({i} * {i})") for i in range(64)))
    assert [r.stdout for r in res] == [f"{i * i}\n" for i in range(64)]


def test_code_env_over_the_service(service):
    """CodeSandbox-v0 with the service as its sandbox: the tool run and the hidden-test grading both
    go through /run_code (the env steps on its own event loop; the client keeps one pool per loop)."""
    import json

    import gymnasium as gym

    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.envs.code.humaneval import load_humaneval

    task = load_humaneval("all")[0]
    solution = task["prompt"] + task["canonical_solution"]
    env = gym.make("CodeSandbox-v0", split="all", sandbox=SandboxFusionSandbox(service))
    env.reset(options={"task_index": 0})
    tool = (
        "<tool_call>"
        + json.dumps({"name": "run_python", "arguments": {"code": "print(6 * 7)"}})
        + "</tool_call>"
    )
    obs, reward, terminated, *_ = env.step(tool)
    assert obs[0]["content"] == "status: ok (exit code 0)\nstdout:\n42" and (reward, terminated) == (
        0.0,
        False,
    )
    submit = "<tool_call>" + json.dumps({"name": "submit", "arguments": {"code": solution}}) + "</tool_call>"
    obs, reward, terminated, *_ = env.step(submit)
    assert (reward, terminated, obs[0]["content"]) == (1.0, True, "Submitted. Hidden tests: passed.")
    env.close()
