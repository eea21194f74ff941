"""Attacks on the sandbox, each a small program in ``programs/``, run against every backend here.

Backends: ``local`` (LocalSandbox), ``bwrap`` (BwrapSandbox; skipped where bwrap cannot run),
``service`` (our SandboxFusionSandbox client -> a real ``chatgym serve-sandbox`` process with the
local backend), ``docker`` / ``docker-warm`` (DockerSandbox, a fresh container per run / containers
reset and reused, on a real engine: the ``docker_engine`` fixture of
``tests/conftest.py`` starts a private dockerd for the session as root, or uses ``DOCKER_HOST``;
skipped, with the reason, where neither can run). Each attack asserts the exact
result (status and output) and then, for every attack, that nothing is left over: no process of the
sandbox's uids (zombies included), no file of theirs in the host's /tmp, the host process and the
sandbox (and the service) still working.
"""

import asyncio
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from chatgym.envs.code.grader import grade_function
from chatgym.sandboxes.fusion.client import SandboxFusionSandbox
from chatgym.sandboxes.fusion.service import start_service, stop_service
from chatgym.sandboxes.local.bwrap import BwrapSandbox, bwrap_args, probe
from chatgym.sandboxes.local.sandbox import LocalSandbox

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).parent / "programs"
OUTPUT_CAP = 65536  # bytes per stream, every backend below
TMPFS_MB = 128  # private /tmp size, every backend below
SECRET = "chatgym-test-secret-" + secrets.token_hex(8)
ENV_ALLOWED = {"PATH", "LANG", "HOME", "TMPDIR", "PWD"} | {
    k for k in ("LC_ALL", "LC_CTYPE", "TZ") if k in os.environ
}


def program(name: str) -> str:
    return (PROGRAMS / f"{name}.py").read_text()


def bwrap_why() -> str:
    import shutil

    exe = shutil.which("bwrap")
    return probe(bwrap_args(exe, network=False, keep=[])) if exe else "no bwrap on PATH"


@dataclass
class Backend:
    name: str
    sandbox: object
    uids: list[int]
    service_url: str = ""
    expect: dict = field(default_factory=dict)
    memory_cgroup: int = 0  # the cgroup version the local zygote got (0: none)


async def get_json(url: str):
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return await resp.json()


# Per-backend outcomes where the backends honestly differ (see the isolation table in docs/sandboxes.md).
# The local sandbox's children get a private /tmp and /var/tmp and an empty /root and /home, so a
# checkout under one of those (a CI clone in /tmp) does not exist for them; elsewhere they see its
# world-readable files only.
CHECKOUT_HIDDEN = any(REPO.resolve().is_relative_to(p) for p in ("/tmp", "/var/tmp", "/root", "/home"))
LOCAL_EXPECT = {"home": "FileNotFoundError",
                "checkout_secret": "FileNotFoundError" if CHECKOUT_HIDDEN else "PermissionError",
                "checkout_public": "FileNotFoundError" if CHECKOUT_HIDDEN else "READ",
                "kill": ("PermissionError", "PermissionError", "PermissionError")}  # fmt: skip
BWRAP_EXPECT = {"home": "FileNotFoundError", "checkout_secret": "FileNotFoundError",
                "checkout_public": "FileNotFoundError",
                "kill": ("PermissionError", "PermissionError", "ProcessLookupError")}  # fmt: skip
# Docker: the image holds no host file; the parent (the runner) and init are root in the container,
# the host's PIDs are outside its PID namespace; `network_mode=none` keeps a loopback of the
# container's own (nothing listens there: refused), no route out; the runner passes a fixed env.
# Each run starts a fresh interpreter there (no warm zygote): on a loaded 2-core machine (load
# average ~29) the escape program had not printed within a 1 s limit, so its limit is 3 s there.
DOCKER_EXPECT = dict(BWRAP_EXPECT, network=("ECONNREFUSED", "ENETUNREACH"),
                     env={"PATH", "LANG", "HOME", "TMPDIR", "PWD"}, escape_timeout_s=3.0)  # fmt: skip


@pytest.fixture(scope="module", params=["local", "bwrap", "service", "docker", "docker-warm"])
def backend(request):
    name = request.param
    if name == "bwrap" and (why := bwrap_why()):
        pytest.skip(f"bwrap cannot run here: {why}")
    if name.startswith("docker"):
        request.getfixturevalue("docker_engine")  # a real engine (tests/conftest.py), or a skip saying why
    os.environ["CHATGYM_TEST_SECRET_TOKEN"] = SECRET  # a host secret in the environment
    loop = asyncio.new_event_loop()
    proc = None
    try:
        kw = {"max_concurrency": 2, "max_output_bytes": OUTPUT_CAP, "tmpfs_mb": TMPFS_MB}
        if name == "local":
            sb = LocalSandbox(**kw)
            b = Backend(name, sb, loop.run_until_complete(sb.start())["uids"], expect=LOCAL_EXPECT)
        elif name == "bwrap":
            sb = BwrapSandbox(**kw)
            b = Backend(name, sb, loop.run_until_complete(sb.start())["uids"], expect=BWRAP_EXPECT)
        elif name == "service":
            proc, url = start_service(
                "--max-concurrency", "2", "--tmpfs-mb", str(TMPFS_MB), "--max-output-bytes", str(OUTPUT_CAP)
            )
            sb = SandboxFusionSandbox(url, max_output_bytes=1 << 20)  # the service's cap is the one hit
            health = loop.run_until_complete(get_json(url + "/health"))
            b = Backend(name, sb, health["isolation"]["uids"], url, expect=LOCAL_EXPECT)
        else:
            from chatgym.sandboxes.docker.sandbox import DockerSandbox

            # docker-warm: containers reset and reused, so each attack's container serves the
            # `clean` check's next run (and the next attack) too.
            sb = DockerSandbox(max_concurrency=2, max_output_bytes=OUTPUT_CAP, tmpfs_mb=TMPFS_MB,
                               reuse=name == "docker-warm")  # fmt: skip
            # uid 65534 runs the programs; without a user namespace their processes and files show
            # on the host under that uid, so the `clean` checks below look for it host-wide.
            b = Backend(name, sb, loop.run_until_complete(sb.start())["uids"], expect=DOCKER_EXPECT)
        b.loop = loop
        iso = health["isolation"] if name == "service" else getattr(sb, "isolation", {})
        b.memory_cgroup = iso.get("memory_cgroup", 0)
        yield b
        loop.run_until_complete(sb.close())
    finally:
        del os.environ["CHATGYM_TEST_SECRET_TOKEN"]
        if proc is not None:
            stop_service(proc)
        loop.close()


def run(b: Backend, name: str, **kwargs):
    res = b.loop.run_until_complete(b.sandbox.run(program(name), **kwargs))
    # docker-warm: the attack's container was reset, the reset verified, and it went back to the pool
    assert b.name != "docker-warm" or "reset_left" not in res.info, res.info
    return res


def uid_processes(uids: list[int], skip: set[int] = frozenset()) -> list[str]:
    """``pid state`` of every process (zombies too) owned by one of ``uids`` (but not in ``skip``)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and int(pid) not in skip and os.stat(f"/proc/{pid}").st_uid in uids:
                with open(f"/proc/{pid}/stat") as f:
                    found.append(f"{pid} {f.read().split(') ', 1)[1][0]}")
        except OSError:
            pass
    return found


@pytest.fixture
def clean(backend):
    """After the attack: nothing of the sandbox's uids left, the sandbox and the service still work."""
    host_tmp_before = set(os.listdir("/tmp"))
    yield
    # Docker: uid 65534 anywhere on the host but in another engine's containers (a concurrent test
    # session's runs the same uid); escapes and this engine's leftovers count.
    if backend.name.startswith("docker"):
        from chatgym.sandboxes.docker.engine import container_pids

        scope = lambda: container_pids(others=True)  # noqa: E731
    else:
        scope = frozenset
    left = uid_processes(backend.uids, scope())
    # SIGKILLed processes vanish only once scheduled: after a fork bomb on a busy 2-core machine
    # (no cgroup CPU caps here) that took a few seconds.
    deadline = time.monotonic() + 15
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = uid_processes(backend.uids, scope())
    assert left == [], f"processes left: {left}"
    new_tmp = set(os.listdir("/tmp")) - host_tmp_before
    owned = [n for n in new_tmp if _owner(f"/tmp/{n}") in backend.uids]
    assert owned == [], f"files left in the host's /tmp: {owned}"
    after = run_code(backend, "print('still fine')")
    assert (after.status, after.stdout) == ("ok", "still fine\n")
    if backend.service_url:
        assert backend.loop.run_until_complete(get_json(backend.service_url + "/v1/ping")) == "pong"


def _owner(path: str) -> int | None:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


def run_code(b: Backend, code: str, **kwargs):
    return b.loop.run_until_complete(b.sandbox.run(code, **kwargs))


# ---- resource exhaustion ------------------------------------------------------------------------


def test_fork_bomb(backend, clean):
    res = run(backend, "fork_bomb", timeout_s=1)
    assert res.status == "timeout", res


def test_memory_bomb(backend, clean):
    res = run(backend, "memory_bomb", memory_mb=256)
    if backend.name.startswith("docker"):
        # memory_mb is an RLIMIT_AS in a container: its refusal is not observable (docs/sandboxes.md),
        # the program's MemoryError ends it as an error (the container's own cap gives oom)
        assert (res.status, res.exit_code) == ("error", 1) and res.stderr.endswith("MemoryError\n"), res
    elif backend.memory_cgroup:  # the run's memory cgroup OOM-kills it and counts it
        assert (res.status, res.exit_code, res.stderr) == ("oom", -9, ""), res
    else:  # RLIMIT_AS only (not root): not observable either
        assert (res.status, res.exit_code) == ("error", 1) and res.stderr.endswith("MemoryError\n"), res


def test_infinite_loop(backend, clean):
    res = run(backend, "infinite_loop", timeout_s=1)
    assert res.status == "timeout" and 1.0 <= res.duration_s < 4.0, res


def test_cpu_burning_threads(backend, clean):
    res = run(backend, "cpu_threads", timeout_s=1)
    assert res.status == "timeout" and res.duration_s < 4.0, res


def test_huge_file(backend, clean):
    res = run(backend, "huge_file")
    # RLIMIT_FSIZE is 64 MiB: 64 one-MiB writes succeed, the 65th fails with EFBIG.
    assert (res.status, res.stdout) == ("ok", "EFBIG 64\n"), res.stderr


def test_fill_tmp(backend, clean):
    # Its /tmp is full at ENOSPC and is a file system of TMPFS_MB MiB: the sandbox's own tmpfs, not the
    # host's /tmp. (Measured from inside: the host's free space moves with whatever else runs, such as
    # the other pytest worker, so a before/after difference of it cannot tell.)
    res = run(backend, "fill_tmp", timeout_s=20)
    assert (res.status, res.stdout) == ("ok", f"ENOSPC {TMPFS_MB}\n"), res.stderr
    host = os.statvfs("/tmp")
    assert host.f_blocks * host.f_frsize >> 20 != TMPFS_MB
    again = run_code(
        backend, "import os; print(sorted(n for n in os.listdir('/tmp') if n.startswith('fill')))"
    )
    assert again.stdout == "[]\n"  # the next run sees none of those files


def test_print_200k_characters(backend, clean):
    res = run(backend, "print_200k")
    # Never a silent cut: either the whole 200,001 bytes, or the first OUTPUT_CAP and truncated=True.
    assert res.status == "ok" and res.truncated is True and res.stdout == ("x" * 200_000 + "\n")[:OUTPUT_CAP]
    assert res.info["stdout_bytes"] == 200_001


# ---- secrets --------------------------------------------------------------------------------------


def test_environment_secrets(backend, clean):
    res = run(backend, "env_secrets")
    env = json.loads(res.stdout)
    assert set(env) == backend.expect.get("env", ENV_ALLOWED) and SECRET not in res.stdout


def test_file_secrets(backend, clean):
    home = Path(os.path.expanduser("~")) / f".chatgym-secret-{secrets.token_hex(4)}"
    checkout = REPO / f".chatgym-secret-{secrets.token_hex(4)}"
    try:
        for path in (home, checkout):
            path.write_text(SECRET)
            path.chmod(0o600)
        paths = [str(home), str(checkout), str(REPO / "pyproject.toml")]
        res = run(backend, "file_secrets", stdin=json.dumps(paths))
    finally:
        home.unlink(missing_ok=True)
        checkout.unlink(missing_ok=True)
    got = [line.split(" ", 2)[1] for line in res.stdout.splitlines()]
    e = backend.expect
    assert got == [e["home"], e["checkout_secret"], e["checkout_public"]], res.stdout + res.stderr
    assert SECRET not in res.stdout


# ---- network and signals --------------------------------------------------------------------------


def test_network(backend, clean):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    try:
        res = run(backend, "network", stdin=str(server.getsockname()[1]))
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody ever connected
    finally:
        server.close()
    local, public = backend.expect.get("network", ("ENETUNREACH", "ENETUNREACH"))
    assert (res.status, res.stdout) == ("ok", f"127.0.0.1 {local}\n1.1.1.1 {public}\n"), res.stderr


def test_kill_parent_and_others(backend, clean):
    res = run(backend, "kill_parent", stdin=str(os.getpid()))
    parent, init, host = backend.expect["kill"]
    assert (res.status, res.stdout) == ("ok", f"parent {parent}\ninit {init}\nhost {host}\nalive\n"), (
        res.stderr
    )


def test_setsid_double_fork_escape(backend, clean):
    res = run(backend, "setsid_escape", timeout_s=backend.expect.get("escape_timeout_s", 1))
    assert (res.status, res.stdout) == ("timeout", "escaped\n"), res
    # the `clean` fixture then finds no process of the sandbox uids: the escaped grandchild is gone


def test_zombies(backend, clean):
    res = run(backend, "zombies")
    assert (res.status, res.stdout) == ("ok", "left 20 zombies\n"), res


# ---- the grader -----------------------------------------------------------------------------------

TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(0, 0) == 0\n"


def grade(b: Backend, name: str):
    return b.loop.run_until_complete(
        grade_function(b.sandbox, program(name), test=TEST, entry_point="add", timeout_s=10)
    )


def test_solution_writes_grader_files(backend, clean):
    before = {
        p: os.path.exists(p) for p in ("/tmp/reward.txt", REPO / "reward.txt", REPO / "expected_output.txt")
    }
    g = grade(backend, "grader_files")
    assert (g.passed, g.status) == (False, "test_failed")
    assert {p: os.path.exists(p) for p in before} == before  # nothing written on the host


def test_solution_patches_the_harness(backend, clean):
    g = grade(backend, "harness_patch")
    assert (g.passed, g.status) == (False, "not_plain_data")


def test_solution_exits_before_the_tests(backend, clean):
    g = grade(backend, "harness_exit")
    assert (g.passed, g.status) == (False, "exited_early")
