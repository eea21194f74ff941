"""LocalSandbox: results, limits, isolation and resource hygiene, against real processes.

One sandbox (one zygote) serves most tests; it is created outside any event loop and used from each
test's own loop, which is also what a shared sandbox sees when envs step on private loops.
"""

import asyncio
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from sandbox_helpers import (
    check_concurrent_runs_have_their_own_tmp,
    check_concurrent_sessions_have_their_own_tmp,
    check_output_cut_on_a_character_boundary,
)

from chatgym.sandboxes import ExecResult, LocalSandbox, Sandbox, Session

IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def sb():
    sandbox = LocalSandbox(max_concurrency=4)
    yield sandbox
    asyncio.run(sandbox.close())


def sandbox_uids(sandbox: LocalSandbox) -> set[int]:
    return set(sandbox.isolation.get("uids", []))


def processes(pred) -> list[tuple[int, int, bytes]]:
    """(pid, real uid, cmdline) of live (non-zombie) processes matching ``pred(uid, cmdline)``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if "\nState:\tZ" in status:
            continue
        uid = int(status.split("\nUid:\t")[1].split()[0])
        if pred(uid, cmd):
            out.append((int(name), uid, cmd))
    return out


async def gone_soon(pred, timeout_s: float = 3.0) -> list:
    """Processes matching ``pred`` still there after up to ``timeout_s`` (SIGKILLed ones take a
    moment to exit and be reaped); [] when all are gone."""
    deadline = time.monotonic() + timeout_s
    while (left := processes(pred)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return left


def owner(path: str) -> int | None:
    try:
        return os.lstat(path).st_uid
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except OSError:
        return False


# ---- results ------------------------------------------------------------------------------------


async def test_protocols(sb):
    assert isinstance(sb, Sandbox)
    session = await sb.open_session()
    assert isinstance(session, Session)
    await session.close()


async def test_ok_run(sb):
    res = await sb.run("print(1 + 1)")
    assert (res.status, res.stdout, res.stderr, res.exit_code, res.truncated) == ("ok", "2\n", "", 0, False)
    assert isinstance(res, ExecResult) and 0 < res.duration_s < 5
    assert res.info["stdout_bytes"] == 2


async def test_system_exit_code(sb):
    res = await sb.run("raise SystemExit(3)")
    assert (res.status, res.exit_code, res.stderr) == ("error", 3, "")
    res = await sb.run("import sys; sys.exit('bye')")  # CPython prints a non-int code and exits 1
    assert (res.status, res.exit_code, res.stderr) == ("error", 1, "bye\n")
    res = await sb.run("raise SystemExit(None)")
    assert (res.status, res.exit_code) == ("ok", 0)


async def test_exception_traceback(sb):
    res = await sb.run("x = 1\nprint('before')\n1 / 0\n")
    assert (res.status, res.exit_code, res.stdout) == ("error", 1, "before\n")
    # The traceback is the interpreter's own, quoting the user's line, without sandbox frames.
    assert res.stderr.startswith(
        'Traceback (most recent call last):\n  File "<solution>", line 3, in <module>\n'
    )
    assert res.stderr.endswith("ZeroDivisionError: division by zero\n")
    assert "zygote" not in res.stderr and "child.py" not in res.stderr


async def test_syntax_error(sb):
    res = await sb.run("def f(:\n")
    assert (res.status, res.exit_code) == ("error", 1)
    assert res.stderr.splitlines()[-1].startswith("SyntaxError:")


async def test_stdin(sb):
    res = await sb.run("import sys\nprint(sys.stdin.read()[::-1])", stdin="abc\ndef")
    assert res.stdout == "fed\ncba\n"
    res = await sb.run("read x; read y; echo $((x * y))", language="bash", stdin="6\n7\n")
    assert (res.status, res.stdout) == ("ok", "42\n")
    res = await sb.run("import sys; print(repr(sys.stdin.read()))")  # no stdin: empty, not the host's
    assert res.stdout == "''\n"


async def test_files_in_work_dir(sb):
    files = {
        "data/in.txt": "hello",
        "blob.bin": b"\x00\xff",
        "helper.py": "def twice(x):\n    return 2 * x\n",
    }
    code = (
        "import os, helper\n"
        "print(open('data/in.txt').read(), open('blob.bin', 'rb').read(), helper.twice(21))\n"
        "print(os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'])\n"
    )
    res = await sb.run(code, files=files)
    assert (res.status, res.stdout) == ("ok", "hello b'\\x00\\xff' 42\nTrue\n")
    res = await sb.run("cat data/in.txt; wc -c < blob.bin", language="bash", files=files)
    assert res.stdout == "hello2\n"
    res = await sb.run("import os; print(sorted(os.listdir('.')))")  # a fresh dir every run
    assert res.stdout == "[]\n"


async def test_bash_exit_code(sb):
    res = await sb.run("echo out; echo err >&2; exit 7", language="bash")
    assert (res.status, res.exit_code, res.stdout, res.stderr) == ("error", 7, "out\n", "err\n")


# ---- limits -------------------------------------------------------------------------------------


async def test_python_timeout(sb):
    t0 = time.monotonic()
    res = await sb.run("while True: pass", timeout_s=0.2)
    assert (res.status, res.exit_code) == ("timeout", -9)
    assert 0.2 <= res.duration_s < 3.0 and time.monotonic() - t0 < 5.0  # generous: CI machines are busy


async def test_bash_timeout_kills_the_whole_tree(sb):
    res = await sb.run("sleep 300 & wait", language="bash", timeout_s=0.05)
    assert res.status == "timeout"
    # The result comes only after the process group was killed: nothing may remain. (Only our
    # sandbox uids are looked at: other users of this machine may well be sleeping 300 s too.)
    uids = sandbox_uids(sb)
    assert processes(lambda uid, cmd: cmd == b"sleep\x00300\x00" and (not uids or uid in uids)) == []
    assert "escaped_processes" not in res.info


async def test_escaped_background_process_is_killed(sb):
    # setsid leaves the run's process group: only the per-run uid catches it (root only).
    if not sandbox_uids(sb) and not (await sb.start())["uids"]:
        pytest.skip("needs root: without a sandbox uid an escaped session cannot be found")
    res = await sb.run("setsid sleep 301 > /dev/null 2>&1 < /dev/null & echo started", language="bash")
    assert (res.status, res.stdout) == ("ok", "started\n")
    # The escapee holds no pipe of the run, so nothing is waited for; the next run on the same uid
    # kills it first thing (kill(-1) as that uid). Four runs in a row cover every slot's uid.
    await asyncio.gather(*(sb.run("print(0)") for _ in range(4)))
    assert await gone_soon(lambda uid, cmd: cmd == b"sleep\x00301\x00") == []


FORK_BOMB = """
import os, time
while True:
    try:
        os.fork()
    except BlockingIOError:  # EAGAIN: RLIMIT_NPROC reached
        print("capped", flush=True)
        time.sleep(60)
"""


async def test_fork_bomb_is_capped():
    # Every process forks until RLIMIT_NPROC (16 here) refuses, then sleeps: the bomb can neither
    # grow past the cap nor end by itself, so the expected status is "timeout" (wall limit), after
    # which the whole group and uid are killed.
    async with LocalSandbox(max_concurrency=1, max_processes=16) as sandbox:
        t0 = time.monotonic()
        res = await sandbox.run(FORK_BOMB, timeout_s=1.0)
        assert res.status == "timeout"
        capped = res.stdout.splitlines()
        assert capped and set(capped) == {"capped"}
        if sandbox.isolation["uids"]:  # the cap counts this run's own uid only
            assert len(capped) <= 16
        assert time.monotonic() - t0 < 5
        uids = sandbox_uids(sandbox)
        assert await gone_soon(lambda uid, cmd: uid in uids) == []
        res = await sandbox.run("print('still fine')")
        assert res.stdout == "still fine\n"
    pid = os.fork()  # the host can still fork
    if pid == 0:
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


async def test_memory_hog_is_oom(sb):
    if not (await sb.start()).get("memory_cgroup"):  # started here too: run alone, it is the first
        pytest.skip("no memory cgroup here: tests/test_sandbox_oom.py::test_no_cgroup_never_oom")
    # the run's memory cgroup OOM-kills it (SIGKILL: no traceback) and counts it
    res = await sb.run("x = bytearray(2 * 1024**3)", memory_mb=256)
    assert (res.status, res.exit_code, res.stderr) == ("oom", -9, "")
    # Growing in 10 MB steps (touched: bytes(n) is calloc'd, so b"x" * n) stops at the limit.
    grow = "chunks = []\nwhile True:\n    chunks.append(b'x' * 10**7)\n"
    res = await sb.run(grow, memory_mb=256, timeout_s=10)
    assert (res.status, res.exit_code) == ("oom", -9)


async def test_output_truncation(sb):
    res = await sb.run("print('x' * 200_000)")
    assert res.status == "ok" and res.truncated
    assert res.stdout == "x" * 65536 and res.info["stdout_bytes"] == 200_001
    res = await sb.run("import sys; sys.stderr.write('e' * 70000); print('ok')")
    assert res.truncated and res.stdout == "ok\n" and len(res.stderr) == 65536
    async with LocalSandbox(max_concurrency=1, max_output_bytes=300_000) as big:
        res = await big.run("print('x' * 200_000)")
        assert not res.truncated and res.stdout == "x" * 200_000 + "\n"


async def test_output_is_cut_on_a_character_boundary(sb):
    await check_output_cut_on_a_character_boundary(sb)  # runs and sessions


async def test_file_size_limit():
    async with LocalSandbox(max_concurrency=1, max_file_mb=1) as sandbox:
        res = await sandbox.run("open('big', 'wb').write(b'0' * (2 << 20))")
        assert res.status == "error" and "File too large" in res.stderr


# ---- isolation ----------------------------------------------------------------------------------


async def test_env_allowlist(monkeypatch):
    fake = "sk-test-" + secrets.token_hex(8)
    monkeypatch.setenv("OPENAI_API_KEY", fake)
    monkeypatch.setenv("TZ", "UTC")  # on the default inherit list
    async with LocalSandbox(max_concurrency=1, env={"EXTRA": "1"}) as sandbox:
        res = await sandbox.run(
            "import os\nprint(sorted(os.environ))\nprint(open('/proc/self/environ', 'rb').read())"
        )
        names = eval(res.stdout.splitlines()[0])
        assert "OPENAI_API_KEY" not in names and fake not in res.stdout
        assert {"PATH", "HOME", "TMPDIR", "EXTRA", "TZ"} <= set(names)
        res = await sandbox.run("env; cat /proc/$$/environ", language="bash")
        assert fake not in res.stdout and "OPENAI_API_KEY" not in res.stdout


@pytest.mark.filterwarnings("ignore:LocalSandbox")  # hidden_paths=() leaves a /root stdlib unreadable
async def test_cannot_read_root_files():
    if not IS_ROOT:
        pytest.skip("needs root: without a uid drop the child reads what this user reads")
    path = f"/root/.chatgym-test-secret-{secrets.token_hex(4)}"
    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("top secret")
    try:
        code = f"print(open({path!r}).read())"
        async with LocalSandbox(max_concurrency=1) as sandbox:  # /root hidden behind an empty tmpfs
            if not sandbox.isolation["uids"]:
                pytest.skip(f"no uid drop here: {sandbox.isolation['notes']}")
            res = await sandbox.run(code)
            assert res.status == "error" and "top secret" not in res.stdout
            assert res.stderr.splitlines()[-1].startswith(("FileNotFoundError", "PermissionError"))
            # The interpreter's own prefix is bound back, so modules not pre-imported still import.
            res = await sandbox.run("import csv, zipfile; print(csv.__name__, zipfile.__name__)")
            assert res.stdout == "csv zipfile\n"
        async with LocalSandbox(max_concurrency=1, hidden_paths=()) as sandbox:  # uid drop alone
            res = await sandbox.run(code)
            assert res.status == "error" and res.stderr.splitlines()[-1].startswith("PermissionError")
    finally:
        os.unlink(path)


CONNECT = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv_port)), timeout=2).close()
    print("connected")
except OSError as e:
    print("refused", e.errno)
"""


async def test_network_is_cut(sb):
    info = await sb.start()
    if not info["network_isolated"]:
        pytest.skip(f"no network namespace here: {info['notes']}")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = CONNECT.replace("sys.argv_port", str(port))
        res = await sb.run(code)
        assert res.stdout.startswith("refused")  # ENETUNREACH: the namespace's loopback is down
        async with LocalSandbox(max_concurrency=1, network=True) as open_net:
            res = await open_net.run(code)
            assert res.stdout == "connected\n"


async def test_sandbox_uid_and_private_proc(sb):
    info = await sb.start()
    if not info["uids"]:
        pytest.skip(f"no uid drop here: {info['notes']}")
    res = await sb.run("import os; print(os.getuid(), os.getgid(), os.getgroups())")
    uid, gid, groups = res.stdout.split(" ", 2)
    assert int(uid) in info["uids"] and gid == "65534" and groups == "[]\n"
    if info["proc_hidden"]:  # hidepid: only the run's own processes are visible
        res = await sb.run(
            "import os; print([p for p in os.listdir('/proc') if p.isdigit()] == [str(os.getpid())])"
        )
        assert res.stdout == "True\n"


# ---- sessions -----------------------------------------------------------------------------------


async def test_session_keeps_state_and_restarts_after_timeout(sb):
    async with await sb.open_session() as session:
        assert (await session.run("x = 1")).stdout == ""
        res = await session.run("print(x)")
        assert (res.status, res.stdout) == ("ok", "1\n")
        res = await session.run("x + 41")  # the last expression is echoed, REPL-style
        assert res.stdout == "42\n"
        res = await session.run("1 / 0")
        assert res.status == "error" and res.stderr.endswith("ZeroDivisionError: division by zero\n")
        assert (await session.run("print(x)")).stdout == "1\n"  # an exception keeps the state
        # Regression: a cell that does not parse showed the host's ast.py frames (its path) first.
        res = await session.run("y = 2\nprint(3 * (4 + 5)")
        assert (res.status, res.stderr) == (
            "error",
            '  File "<cell 6>", line 2\n    print(3 * (4 + 5)\n         ^\nSyntaxError: \'(\' was never closed\n',
        )
        # Parsed, refused by the compiler: the line and caret as a script shows them (fresh user).
        res = await session.run("a = 1\nreturn 5")
        assert res.stderr == '  File "<cell 7>", line 2\n    return 5\n    ^^^^^^^^\nSyntaxError: \'return\' outside function\n'
        res = await session.run("compile('1 +', 'inner', 'eval')")  # raised by the cell's own code: its frames stay
        assert res.stderr.startswith('Traceback (most recent call last):\n  File "<cell 8>", line 1, in <module>\n')
        assert (await session.run("print(x)")).stdout == "1\n"
        await session.run("open('kept.txt', 'w').write('file')")

        res = await session.run("while True: pass", timeout_s=0.2)
        assert res.status == "timeout" and "next call starts a fresh one" in res.stderr

        res = await session.run("print(x)")
        assert res.status == "error" and res.info["fresh_interpreter"]
        assert "fresh interpreter" in res.stderr and res.stderr.endswith(
            "NameError: name 'x' is not defined\n"
        )
        res = await session.run("print(open('kept.txt').read())")
        assert (res.stdout, res.info["fresh_interpreter"]) == ("file\n", False)
    with pytest.raises(RuntimeError, match="closed"):
        await session.run("1")


async def test_many_session_timeouts_leave_the_zygote_serving(sb):
    # A session process's exit closes its pipes in the same event batch that may still hold their
    # EOF: those events must be skipped (reading the closed fd killed the zygote with EBADF).
    pid = (await sb.start())["pid"]
    for _ in range(3):
        sessions = [await sb.open_session() for _ in range(4)]
        try:
            outs = await asyncio.gather(*(s.run("while True: pass", timeout_s=0.1) for s in sessions))
            assert [r.status for r in outs] == ["timeout"] * 4
            again = await asyncio.gather(*(s.run("6 * 7") for s in sessions))
            assert [(r.status, r.stdout) for r in again] == [("ok", "42\n")] * 4
        finally:
            for s in sessions:
                await s.close()
    assert sb.isolation["pid"] == pid  # the same zygote: it never died


async def test_session_calls_run_in_order(sb):
    async with await sb.open_session() as session:
        slow, fast = await asyncio.gather(
            session.run("import time; time.sleep(0.2); x = 'first'"), session.run("print(x)")
        )
        assert (slow.status, fast.stdout) == ("ok", "first\n")  # one interpreter, calls in FIFO order


async def test_sessions_are_separate(sb):
    a, b = await sb.open_session(), await sb.open_session()
    try:
        await a.run("v = 'a'")
        await b.run("v = 'b'")
        assert ((await a.run("v")).stdout, (await b.run("v")).stdout) == ("'a'\n", "'b'\n")
    finally:
        await a.close()
        await b.close()


needs_private_tmp = pytest.mark.skipif(
    not IS_ROOT, reason="a private /tmp per run needs root (mount namespaces)"
)


@needs_private_tmp
async def test_concurrent_runs_have_their_own_tmp(sb):
    assert (await sb.start())["private_tmp"] is True
    await check_concurrent_runs_have_their_own_tmp(sb)


@needs_private_tmp
async def test_concurrent_sessions_have_their_own_tmp_gone_at_close(sb):
    await check_concurrent_sessions_have_their_own_tmp(sb)


async def test_session_tmp_survives_a_fresh_interpreter(sb):
    async with await sb.open_session() as s:
        await s.run("open('/tmp/kept.txt', 'w').write('kept')")
        assert (await s.run("while True: pass", timeout_s=0.3)).status == "timeout"
        res = await s.run("open('/tmp/kept.txt').read()")
        assert (res.stdout, res.info["fresh_interpreter"]) == ("'kept'\n", True)  # like its work dir


# ---- concurrency and hygiene --------------------------------------------------------------------


async def test_concurrency_limit_and_queue_time():
    async with LocalSandbox(max_concurrency=1) as one:
        sleep = "import time; time.sleep(0.3)"
        results = await asyncio.gather(one.run(sleep), one.run(sleep))
        waits = sorted(r.queue_s for r in results)
        assert waits[0] < 0.1 and waits[1] >= 0.25  # the second waited for the first's slot


async def test_many_parallel_runs(sb):
    results = await asyncio.gather(*(sb.run(f"print({i} * {i})") for i in range(40)))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(40)]


async def test_cancelled_run_is_killed_and_frees_its_slot():
    async with LocalSandbox(max_concurrency=1) as one:
        task = asyncio.create_task(
            one.run("import time; print('up', flush=True); time.sleep(30)", timeout_s=60)
        )
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        res = await asyncio.wait_for(one.run("print('next')"), 5)  # the slot came back
        assert res.stdout == "next\n" and res.queue_s < 2
        assert processes(lambda uid, cmd: b"time.sleep(30)" in cmd) == []


async def test_no_leaks_after_many_runs(sb):
    info = await sb.start()
    await sb.run("print(0)")
    fds = len(os.listdir("/proc/self/fd"))
    tmp = set(os.listdir(tempfile.gettempdir()))
    for _ in range(50):
        res = await sb.run(
            "import tempfile; open('f', 'w').write('x'); tempfile.mkstemp(); print(1)",
            files={"in.txt": "x"},
        )
        assert res.stdout == "1\n"
    assert len(os.listdir("/proc/self/fd")) == fds
    uids = set(info["uids"])
    new = set(os.listdir(tempfile.gettempdir())) - tmp  # others may be using /tmp meanwhile: ours only
    assert [n for n in new if n.startswith("chatgym") or owner(f"{tempfile.gettempdir()}/{n}") in uids] == []
    assert processes(lambda uid, cmd: uid in uids) == []
    if info["mount_ns"]:  # the private /tmp, seen through the zygote's root: no work dir left
        # (the zygote removes a work dir right after sending the result: allow it a moment)
        work = f"/proc/{info['pid']}/root/tmp/.chatgym-work"
        deadline = time.monotonic() + 3
        while run_dirs_left(work, info) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert run_dirs_left(work, info) == []


def run_dirs_left(work: str, info: dict) -> list[str]:
    """What runs left in the zygote's work base. With a private /tmp per run, each idle spare has
    made its (empty, root-owned) work dir ``wN`` and scratch dirs ``wN.scratch`` ahead of its run:
    those are not a run's; anything owned by another uid, holding a file or unpaired is."""
    names = set(os.listdir(work))
    if not info.get("private_tmp"):
        return sorted(names)
    left = []
    for name in names:
        try:
            if not spare_dirs(work, name, names):
                left.append(name)
        except FileNotFoundError:  # a spare being retired or made meanwhile: look again
            left.append(name)
    return sorted(left)


def spare_dirs(work: str, name: str, names: set[str]) -> bool:
    """Whether ``name`` in the work base is an idle spare's: paired, root's, holding no file."""
    base = name.removesuffix(".scratch")
    paired = {base, base + ".scratch"} <= names
    top = f"{work}/{name}"
    owners = {os.lstat(os.path.join(d, n)).st_uid for d, ds, fs in os.walk(top) for n in ds + fs}
    files = [f for _, _, fs in os.walk(top) for f in fs]
    return paired and not files and owners <= {0} and os.lstat(top).st_uid == 0


async def test_close_stops_the_zygote():
    sandbox = LocalSandbox(max_concurrency=1)
    info = await sandbox.start()
    assert alive(info["pid"])
    await sandbox.close()
    assert not alive(info["pid"])
    with pytest.raises(RuntimeError, match="closed"):
        await sandbox.run("print(1)")


async def test_dropped_sandbox_stops_its_zygote():
    import gc

    sandbox = LocalSandbox(max_concurrency=1)
    pid = (await sandbox.start())["pid"]
    del sandbox
    gc.collect()
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not alive(pid)


async def test_forked_host_gets_its_own_zygote(sb):
    # A forked copy of the host (multiprocessing's fork) must start its own zygote and leave the
    # original's alone.
    first = (await sb.start())["pid"]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            res = asyncio.run(sb.run("print(7)"))
            os.write(w, f"{res.stdout.strip()} {sb.isolation['pid']}".encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    out, child_zygote = os.read(r, 100).decode().split()
    os.close(r)
    assert out == "7" and int(child_zygote) != first
    assert (await sb.run("print(8)")).stdout == "8\n" and sb.isolation["pid"] == first


def test_zygote_dies_with_its_parent():
    script = (
        "import asyncio, os\n"
        "from chatgym.sandboxes import LocalSandbox\n"
        "info = asyncio.run(LocalSandbox(max_concurrency=1).start())\n"
        "print(info['pid'], flush=True)\n"
        "os._exit(0)\n"  # no close(): the zygote must notice on its own
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout)
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


# ---- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"language": "ruby"}, "language"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"memory_mb": 1}, "memory_mb"),
        ({"files": {"../escape.txt": "x"}}, "files"),
        ({"files": {"/etc/x": "x"}}, "files"),
        ({"files": {"a.txt": 3}}, "files"),
        ({"stdin": b"bytes"}, "stdin"),
    ],
)
async def test_bad_arguments_name_the_field(sb, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        await sb.run("print(1)", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_concurrency": 0}, "max_concurrency"), ({"max_output_bytes": -1}, "max_output_bytes"),
     ({"env": {"A=B": "x"}}, "env"), ({"uid_range": (10, 11), "max_concurrency": 4}, "uid_range")],
)  # fmt: skip
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LocalSandbox(**kwargs)


@pytest.mark.filterwarnings("ignore:LocalSandbox")  # the warning says it runs as this uid
async def test_without_privilege_drop():
    # The fallback used when not root: same uid as the host, rlimits + process group still apply.
    async with LocalSandbox(max_concurrency=1, drop_privileges=False) as sandbox:
        assert sandbox.isolation["uids"] == []
        res = await sandbox.run("import os; print(os.getuid() == os.geteuid())")
        assert res.stdout == "True\n"
        res = await sandbox.run("sleep 307 & wait", language="bash", timeout_s=0.05)
        assert res.status == "timeout"
        assert processes(lambda uid, cmd: cmd == b"sleep\x00307\x00") == []


# ---- the pieces, without processes --------------------------------------------------------------


def test_classify():
    from chatgym.sandboxes.local.outputs import classify

    assert classify(0, False) == "ok"
    assert classify(3, False) == "error"
    assert classify(-9, True) == "timeout"  # our deadline kill
    assert classify(-24, False) == "timeout"  # SIGXCPU: the CPU limit
    assert classify(-11, False) == "killed"
    # oom only from the sandbox's observation (the cgroup's OOM count), whatever the exit code
    assert [classify(c, False, oom=True) for c in (-9, 1, 0)] == ["oom", "oom", "oom"]
    assert classify(-9, True, oom=True) == "oom"  # killed for memory before the deadline


def test_output_cap():
    from chatgym.sandboxes.local.outputs import Output

    out = Output(cap=5)
    for chunk in (b"abc", b"defg", b"h"):
        out.add(chunk)
    assert (bytes(out.data), out.total, out.decode()) == (b"abcde", 8, ("abcde", True))
    exact = Output(cap=3)
    exact.add(b"abc")
    assert exact.decode() == ("abc", False)


def test_decode_capped_cuts_on_a_character_boundary():
    from chatgym.sandboxes.local.outputs import decode_capped

    euro = "€".encode()  # 3 bytes
    # 65,536 bytes kept of 90,000 written: 21,845 whole '€' (65,535 bytes), the 65,536th byte
    # starts a '€' that was cut: dropped, not replaced by a U+FFFD the program never wrote.
    assert decode_capped((euro * 30000)[:65536], 65536, cut=True) == ("€" * 21845, True)
    # A program ending mid-character: its 2 bytes are invalid, replaced; 6 + 3 bytes > 8: cut again.
    assert decode_capped(euro * 2 + euro[:2], 8, cut=False) == ("€€", True)
    assert decode_capped(euro * 2 + euro[:2], 9, cut=False) == ("€€\ufffd", False)
    assert decode_capped(b"a\xffb", 5) == ("a\ufffdb", False)  # invalid bytes written: replaced
    # Replacement grows 3 bytes to 9: the text is cut again to the cap, on a character boundary.
    assert decode_capped(b"\xff\xff\xff", 3) == ("\ufffd", True)
    assert decode_capped(b"\xffx", 4) == ("\ufffdx", False)
    assert decode_capped(b"ab\xe2\x82", 5, cut=True) == ("ab", True)  # cut by the cap: dropped
    assert decode_capped(b"", 0, cut=True) == ("", True)


def test_remove_tree_does_not_follow_symlinks(tmp_path):
    from chatgym.sandboxes.local.outputs import remove_tree

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub" / "f.txt").write_text("x")
    (work / "link_dir").symlink_to(outside)
    (work / "link_file").symlink_to(outside / "keep.txt")
    remove_tree(str(work))
    assert not work.exists()
    assert (outside / "keep.txt").read_text() == "keep"


def test_compile_cache_counts_then_caches():
    import marshal

    from chatgym.sandboxes.local.compile_cache import CompileCache

    cache = CompileCache(size=2)
    assert cache.get("x = 1") is None  # first sighting: the child compiles it
    compiled = cache.get("x = 1")  # second: compiled once, here
    ns: dict = {}
    exec(marshal.loads(compiled), ns)
    assert ns["x"] == 1 and cache.get("x = 1") is compiled
    assert cache.get("def (") is None and cache.get("def (") is None  # syntax errors are left to the child
    for src in ("a = 1", "a = 1", "b = 2", "b = 2"):  # two newer entries evict the oldest
        cache.get(src)
    assert "x = 1" not in cache.code and len(cache.code) == 2


def test_wire_frames_split_anywhere():
    from chatgym.sandboxes.local import wire

    data = wire.encode({"a": 1}) + wire.encode({"b": "é" * 3})
    dec = wire.FrameDecoder()
    got = [msg for i in range(len(data)) for msg in dec.feed(data[i : i + 1])]
    assert got == [{"a": 1}, {"b": "ééé"}]
    assert wire.unpack_file(*wire.pack_files({"f": b"\x00\x01"})[0][1:]) == b"\x00\x01"


async def test_slot_pool_fifo_and_cancellation():
    from chatgym.sandboxes.slots import SlotPool

    pool = SlotPool(1)
    slot = await pool.acquire()
    first = asyncio.create_task(pool.acquire())
    second = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0)
    first.cancel()  # a cancelled waiter must not swallow the slot
    await asyncio.sleep(0)
    pool.release(slot)
    assert await asyncio.wait_for(second, 1) == slot
    pool.release(slot)
    assert pool.free == 1


async def test_no_future_flags_leak_into_user_code(sb):
    # The sandbox's modules use `from __future__ import annotations`; user code must not inherit it.
    res = await sb.run("def f(x: int): pass\nprint(f.__annotations__)")
    assert res.stdout == "{'x': <class 'int'>}\n"
    res = await sb.run("import sys; print(sys.modules['__main__'].__name__, sys.argv)")
    assert res.stdout == "__main__ ['<solution>']\n"


# A run that forks a process which leaves its session and closes its pipes, then keeps writing into
# /tmp, /dev/shm and its work dir: the run's result comes back while it still runs.
ESCAPEE = r"""
import os, time
if os.fork() == 0:
    os.setsid()
    for fd in (0, 1, 2):
        os.close(fd)
    start, i = time.time(), 0
    while time.time() - start < 1.0:
        try:
            open(f"/tmp/leak{i}", "w").write("x" * 100000)
            os.makedirs(f"/dev/shm/d{i}", exist_ok=True)
            open(f"leakwd{i}", "w").close()
            i += 1
        except OSError:
            pass
    time.sleep(30)
    os._exit(0)
time.sleep(0.2)
print("parent done")
"""


async def test_a_finished_runs_leftover_writer_leaves_nothing():
    # Regression: the clean-up removed the run's dirs while its leftover process still wrote into
    # them, so its files stayed in the shared tmpfs (19 MB after one run) until the sandbox closed.
    sandbox = LocalSandbox(max_concurrency=1)
    try:
        info = await sandbox.start()
        if not info.get("private_tmp"):
            pytest.skip("no private /tmp per run here (not root)")
        res = await sandbox.run(ESCAPEE)
        assert (res.status, res.stdout) == ("ok", "parent done\n")
        await asyncio.sleep(1.5)  # past the leftover's 1 s of writing, had it lived
        work = f"/proc/{info['pid']}/root/tmp/.chatgym-work"
        assert run_dirs_left(work, info) == []
        assert processes(lambda uid, cmd: uid in set(info["uids"])) == []
    finally:
        await sandbox.close()
