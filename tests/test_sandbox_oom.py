"""``oom`` exactly when a run hit its memory limit, as the sandbox observed it, on every backend here.

Real processes: Python, bash, perl, awk and a C program (built with gcc) growing past the limit, a
Python parent whose bash child does, and programs that only *print* an allocation failure (which
must not be ``oom``). Backends: ``local`` (LocalSandbox: a memory cgroup per run as root), ``bwrap``,
``session`` (a LocalSession), ``service`` (the SandboxFusion client -> ``chatgym serve-sandbox``),
``docker`` (the container's cgroup; skipped where no engine runs). Where a backend cannot observe
the limit (no cgroup: RLIMIT_AS only; a run's own ``memory_mb`` on Docker), the documented
behaviour is asserted: the program's own exit, never ``oom``.
"""

import asyncio
import shutil
import subprocess

import pytest

from chatgym.sandboxes.fusion.client import SandboxFusionSandbox
from chatgym.sandboxes.fusion.service import start_service, stop_service
from chatgym.sandboxes.local.bwrap import BwrapSandbox, bwrap_args, probe
from chatgym.sandboxes.local.sandbox import LocalSandbox

LIMIT_MB = 128
PY_HOG = "x = bytearray(400 << 20)\nprint('unreachable')"  # bytearray(n) zero-fills: 400 MiB touched
BASH_HOG = "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo ${#x}"
PERL_HOG = "perl -e '$x = \"a\" x 300_000_000; print length $x'"
AWK_HOG = "awk 'BEGIN { s = \"a\"; while (1) s = s s }'"
BASH_DOUBLING = "x=a; while :; do x=$x$x; done"  # bash alone (the Docker image has no tr)
CHILD_HOG = f"import subprocess, sys\nsys.exit(subprocess.call(['bash', '-c', {BASH_HOG!r}]))"
FAKE_PY = "print('MemoryError')\nraise SystemExit(3)"
FAKE_STDERR = (
    "import sys\nsys.stderr.write('Traceback (most recent call last):\\nMemoryError\\n')\nsys.exit(1)"
)
FAKE_BASH = (
    "echo 'bash: xrealloc: cannot allocate 262594560 bytes' >&2; echo 'Cannot allocate memory'; exit 2"
)
C_HOG = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    for (size_t n = 0;; n++) {
        char *p = malloc(1 << 20);
        if (!p) { fprintf(stderr, "malloc failed after %zu MiB\n", n); return 1; }
        memset(p, 1, 1 << 20);
    }
}
"""

# (name, language, code, status, exit code or None for "any"): the limit hit, observed
HOGS = [
    ("python", "python", PY_HOG, "oom", -9),
    ("bash", "bash", BASH_HOG, "oom", -9),
    ("perl", "bash", PERL_HOG, "oom", -9),
    ("awk", "bash", AWK_HOG, "oom", -9),
    ("bash_doubling", "bash", BASH_DOUBLING, "oom", -9),
    ("child", "python", CHILD_HOG, "oom", 256 - 9),  # the parent exits with its child's -9 (& 0xff)
]
# a program's own words are not the sandbox's observation
FAKES = [
    ("print", "python", FAKE_PY, "error", 3),
    ("traceback", "python", FAKE_STDERR, "error", 1),
    ("bash_text", "bash", FAKE_BASH, "error", 2),
    ("normal", "python", "print(sum(range(10)))", "ok", 0),
]


def bwrap_why() -> str:
    exe = shutil.which("bwrap")
    return probe(bwrap_args(exe, network=False, keep=[])) if exe else "no bwrap on PATH"


@pytest.fixture(scope="module")
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def c_hog(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("no gcc here")
    d = tmp_path_factory.mktemp("c_hog")
    (d / "hog.c").write_text(C_HOG)
    subprocess.run(["gcc", "-O0", "-o", str(d / "hog"), str(d / "hog.c")], check=True)
    return (d / "hog").read_bytes()


@pytest.fixture(scope="module", params=["local", "bwrap", "service"])
def backend(request, loop):
    name = request.param
    if name == "bwrap" and (why := bwrap_why()):
        pytest.skip(f"bwrap cannot run here: {why}")
    proc = None
    if name == "service":
        proc, url = start_service("--max-concurrency", "2")
        sb = SandboxFusionSandbox(url)
        info = loop.run_until_complete(_health(url))["isolation"]
    else:
        sb = (LocalSandbox if name == "local" else BwrapSandbox)(max_concurrency=2)
        info = loop.run_until_complete(sb.start())
    if not info.get("memory_cgroup"):
        pytest.skip(f"{name}: no memory cgroup here (not root?): test_no_cgroup_never_oom covers it")
    yield sb
    loop.run_until_complete(sb.close())
    if proc is not None:
        stop_service(proc)


async def _health(url: str) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(url + "/health") as resp:
        return await resp.json()


def run(loop, sb, language, code, **kw):
    kw.setdefault("memory_mb", LIMIT_MB)
    return loop.run_until_complete(sb.run(code, language, timeout_s=30, **kw))


@pytest.mark.parametrize(
    "name,language,code,status,exit_code", HOGS + FAKES, ids=[h[0] for h in HOGS + FAKES]
)
def test_status_is_what_the_sandbox_observed(loop, backend, name, language, code, status, exit_code):
    res = run(loop, backend, language, code)
    assert (res.status, res.exit_code) == (status, exit_code), res
    assert "unreachable" not in res.stdout


def test_c_malloc_loop_is_oom(loop, backend, c_hog):
    res = run(loop, backend, "bash", "chmod +x hog && ./hog", files={"hog": c_hog})
    assert (res.status, res.exit_code) == ("oom", -9), res


def test_limit_is_per_run_and_released(loop, backend):
    # 100 MiB fits a 256 MiB run; the next run has its own fresh cgroup (a previous oom does not stick)
    fits = "x = bytearray(100 << 20)\nprint(len(x) >> 20)"
    assert run(loop, backend, "python", PY_HOG).status == "oom"
    res = run(loop, backend, "python", fits, memory_mb=256)
    assert (res.status, res.stdout) == ("ok", "100\n"), res


def test_session_calls(loop):
    sb = LocalSandbox(max_concurrency=1)
    try:
        if not loop.run_until_complete(sb.start()).get("memory_cgroup"):
            pytest.skip("no memory cgroup here (not root?)")
        s = loop.run_until_complete(sb.open_session(memory_mb=LIMIT_MB))
        got = [
            (r.status, r.exit_code)
            for code in ("a = 1", PY_HOG, "b = 2", FAKE_PY, CHILD_HOG, "print(b)")
            for r in [loop.run_until_complete(s.run(code, timeout_s=30))]
        ]
        # the hog's interpreter is OOM-killed (the next call gets a fresh one); a child's OOM kill
        # counts for the call that spawned it
        assert got == [("ok", 0), ("oom", -9), ("ok", 0), ("error", 3), ("oom", 256 - 9), ("ok", 0)]
        loop.run_until_complete(s.close())
    finally:
        loop.run_until_complete(sb.close())


def test_no_cgroup_never_oom(loop):
    """Documented: without a memory cgroup, memory_mb is RLIMIT_AS and its refusals are not
    observable: the program ends as it chooses (Python: MemoryError, exit 1), status error."""
    sb = LocalSandbox(max_concurrency=1, memory_cgroup=False)
    try:
        assert loop.run_until_complete(sb.start())["memory_cgroup"] == 0
        res = run(loop, sb, "python", PY_HOG)
        assert (res.status, res.exit_code) == ("error", 1) and res.stderr.endswith("MemoryError\n"), res
        res = run(loop, sb, "python", FAKE_PY)
        assert (res.status, res.exit_code) == ("error", 3)
    finally:
        loop.run_until_complete(sb.close())


def test_memory_cgroup_required_fails_clearly(loop, monkeypatch):
    import os

    if os.geteuid() == 0:
        pytest.skip("as root a cgroup can be made here")
    sb = LocalSandbox(max_concurrency=1, memory_cgroup=True)
    with pytest.raises(Exception, match="memory_cgroup=True"):
        loop.run_until_complete(sb.start())
    loop.run_until_complete(sb.close())


def test_docker(loop, docker_engine):
    """Docker: oom when the container's cap (memory_limit_mb) is hit; a run's memory_mb is an
    RLIMIT_AS there, whose refusal is not observable (documented): the program's own error."""
    from chatgym.sandboxes.docker.sandbox import DockerSandbox

    sb = DockerSandbox(max_concurrency=1, memory_limit_mb=192)
    try:
        child = f"import subprocess, sys\nsys.exit(subprocess.call(['bash', '-c', {BASH_DOUBLING!r}]))"
        programs = [("python", "python", PY_HOG), ("bash", "bash", BASH_DOUBLING),
                    ("child", "python", child), ("print", "python", FAKE_PY)]  # fmt: skip
        got = {
            name: (r.status, r.exit_code)
            for name, language, code in programs
            for r in [loop.run_until_complete(sb.run(code, language, timeout_s=30, memory_mb=1024))]
        }
        assert got == {
            "python": ("oom", -9),
            "bash": ("oom", -9),
            "child": ("oom", 247),
            "print": ("error", 3),
        }
        res = loop.run_until_complete(sb.run(PY_HOG, timeout_s=30, memory_mb=64))
        assert (res.status, res.exit_code) == ("error", 1) and res.stderr.endswith("MemoryError\n"), res
    finally:
        loop.run_until_complete(sb.close())


def _our_cgroup_dirs() -> set[str]:
    """The zygotes' ``chatgym-*`` directories under this process's memory cgroup (where a zygote
    started from here makes its own)."""
    import glob
    import os

    from chatgym.sandboxes.local.memcg import own_cgroup_dirs

    return {p for _, d in own_cgroup_dirs() for p in glob.glob(os.path.join(d, "chatgym-*"))}


def test_closing_mid_run_leaves_no_cgroup(loop):
    # Regression: close() during a run (or with a session open) left the run's and the session's
    # cgroups, and so the zygote's own directory, on the host.
    before = _our_cgroup_dirs()
    sb = LocalSandbox(max_concurrency=2)
    info = loop.run_until_complete(sb.start())
    if not info.get("memory_cgroup"):
        loop.run_until_complete(sb.close())
        pytest.skip("no memory cgroup here (not root?)")

    async def close_mid_run():
        running = asyncio.ensure_future(sb.run("import time; time.sleep(20)", "python", timeout_s=30))
        session = await sb.open_session()
        await session.run("x = 1")
        await asyncio.sleep(1.0)
        assert _our_cgroup_dirs() - before  # the zygote's directory exists while it runs
        await sb.close()
        return await running

    res = loop.run_until_complete(close_mid_run())
    assert res.status == "killed"
    assert _our_cgroup_dirs() - before == set()


def test_bwrap_without_memory_cgroup_runs(loop):
    # Regression: BwrapSandbox(memory_cgroup=False) raised UnboundLocalError at construction.
    sb = BwrapSandbox(max_concurrency=1, memory_cgroup=False)
    if why := bwrap_why():
        pytest.skip(f"bwrap cannot run here: {why}")
    try:
        info = loop.run_until_complete(sb.start())
        assert info["memory_cgroup"] == 0
        assert run(loop, sb, "python", "print(1)").stdout == "1\n"
    finally:
        loop.run_until_complete(sb.close())
