"""``BwrapSandbox``: the layout bwrap gives (read-only minimal root, private /tmp, PID and network
namespaces) checked from inside real runs, and the fallback when bwrap cannot run."""

import asyncio
import shutil
from pathlib import Path

import pytest
from sandbox_helpers import (
    check_concurrent_runs_have_their_own_tmp,
    check_concurrent_sessions_have_their_own_tmp,
    check_output_cut_on_a_character_boundary,
)

from chatgym.sandboxes.local.bwrap import BwrapSandbox, bwrap_args, probe

REPO = Path(__file__).resolve().parents[1]
BWRAP = shutil.which("bwrap")
WHY = (
    "no bwrap on PATH (apt-get install bubblewrap)"
    if not BWRAP
    else probe(bwrap_args(BWRAP, network=False, keep=[]))
)
needs_bwrap = pytest.mark.skipif(bool(WHY), reason=f"bwrap cannot run here: {WHY}")


@pytest.fixture
async def sb():
    sandbox = BwrapSandbox(max_concurrency=2)
    yield sandbox
    await sandbox.close()


@needs_bwrap
async def test_isolation_report(sb):
    info = await sb.start()
    assert info["bwrap"] is True and info["network_isolated"] and info["mount_ns"] and info["proc_hidden"]
    assert info["pid"] == 2  # the zygote in its own PID namespace, under bwrap's init (PID 1)


@needs_bwrap
async def test_host_paths_are_absent_and_root_is_read_only(sb):
    code = f"""
import os
print(os.path.exists({str(REPO / "pyproject.toml")!r}), os.path.exists("/home"), sorted(os.listdir("/root")))
for path in ("/etc/x", "/usr/x", "/x"):
    try:
        open(path, "w")
    except OSError as e:
        print(path, e.errno)
open("/tmp/scratch", "w").write("ok")
print(open("/tmp/scratch").read(), os.getcwd().startswith("/tmp/"))
"""
    res = await sb.run(code)
    # 30 = EROFS: the root and the system binds are read-only; only the private /tmp is writable.
    # /root holds only the interpreter's prefix (~/.pyenv here) when that lives under it.
    root = sorted(
        p.name for p in [Path("/root/.pyenv")] if __import__("sys").base_prefix.startswith("/root/")
    )
    assert res.stdout == f"False False {root}\n/etc/x 30\n/usr/x 30\n/x 30\nok True\n", res.stderr


@needs_bwrap
async def test_no_network_and_no_host_processes(sb):
    code = """
import os, socket
try:
    socket.create_connection(("127.0.0.1", 22), timeout=1)
except OSError as e:
    print("net", e.errno)
print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()) == [os.getpid()])
"""
    res = await sb.run(code)
    assert res.stdout == "net 101\nTrue\n", res.stderr  # 101 = ENETUNREACH: no interface at all


@needs_bwrap
async def test_limits_and_sessions_still_apply(sb):
    tmo, oom = await asyncio.gather(
        sb.run("while True: pass", timeout_s=0.5), sb.run("b = bytearray(300 << 20)", memory_mb=100)
    )
    assert (tmo.status, oom.status) == ("timeout", "oom")
    s = await sb.open_session()
    await s.run("x = 41")
    assert (await s.run("x + 1")).stdout == "42\n"
    await s.close()


@needs_bwrap
async def test_concurrent_runs_and_sessions_have_their_own_tmp(sb):
    info = await sb.start()
    if not info["private_tmp"]:
        pytest.skip(
            f"no private /tmp per run here (not root: no mount namespace for the zygote): {info['notes']}"
        )
    await check_concurrent_runs_have_their_own_tmp(sb)
    await check_concurrent_sessions_have_their_own_tmp(sb)


@needs_bwrap
async def test_output_is_cut_on_a_character_boundary(sb):
    await check_output_cut_on_a_character_boundary(sb)


async def test_fallback_when_bwrap_cannot_run():
    sandbox = BwrapSandbox(bwrap="/bin/false")  # a real binary that fails like a bwrap without namespaces
    try:
        with pytest.warns(RuntimeWarning, match="bwrap unavailable .* falling back"):
            info = await sandbox.start()
        assert info["bwrap"] is False
        res = await sandbox.run("print(6 * 7)")
        assert (res.status, res.stdout) == ("ok", "42\n")
    finally:
        await sandbox.close()
