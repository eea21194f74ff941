"""What a forked child of the zygote does: drop privileges, apply limits, run the code. Never returns.

Stdlib only (imported standalone by the zygote). The order matters:

1. ``setsid()``: the child leads a new session and process group, so one ``killpg`` ends its tree.
2. switch to the sandbox uid/gid (when the zygote claimed one), then ``kill(-1, SIGKILL)`` as that uid:
   it ends any process a previous run on this uid left behind (``kill(-1)`` skips the caller).
3. ``PR_SET_PDEATHSIG`` (set after the uid switch, which clears it): the child dies with the zygote.
4. umask 077, chdir into the fresh work dir, write ``files``; stdin becomes a memfd holding ``stdin``.
5. signal dispositions reset (bash must not inherit Python's ignored SIGPIPE/SIGXFSZ); rlimits last,
   so the set-up itself is not counted against them.
6. Python: ``exec(compile(code, "<solution>", "exec"))`` in a fresh ``__main__`` module, with the exit
   code ``python3 file.py`` would give; bash: ``execve(bash, ["bash", "-c", code])``.
"""

from __future__ import annotations

import builtins
import io
import os
import resource
import signal
import sys
import traceback
import types

from . import isolation, wire

SOLUTION = "<solution>"
SETUP_FAILED = 125  # exit code when the sandbox itself could not be set up (never user code's fault)
ARG_MAX_SAFE = 100_000  # bytes; a longer bash script goes through a memfd (one execve arg <= 128 KiB)


def set_rlimits(lim: dict) -> None:
    """Apply the run's limits (``lim`` keys: cpu_s, memory_bytes, nproc, nofile, fsize_bytes)."""
    cpu = int(lim["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at soft, SIGKILL at hard
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize_bytes"], lim["fsize_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim["nofile"], lim["nofile"]))
    if lim.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))
    if lim.get("memory_bytes"):
        resource.setrlimit(resource.RLIMIT_AS, (lim["memory_bytes"], lim["memory_bytes"]))


def drop_to(uid: int, gid: int) -> None:
    """Become ``uid``/``gid`` for good (no supplementary groups), then end the uid's leftovers."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


def write_files(workdir: str, files: list) -> None:
    """Write packed ``files`` under ``workdir``; paths were validated by the parent, checked again here."""
    root = os.path.realpath(workdir)
    for path, kind, payload in files:
        dest = os.path.realpath(os.path.join(root, path))
        if not dest.startswith(root + os.sep):
            raise ValueError(f"files: path {path!r} leaves the work dir")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(wire.unpack_file(kind, payload))


def memfd_with(data: bytes, name: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data) if len(data) < 65536 else _write_all(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def reset_signals() -> None:
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def fresh_std_streams() -> None:
    """New ``sys.std*`` objects over fds 0-2 (what a new interpreter would make for pipes)."""
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), "utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), "utf-8"
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)), "utf-8", "backslashreplace", line_buffering=True
    )


def exit_code_of(exc: SystemExit) -> int:
    """The process exit code CPython gives for an uncaught ``SystemExit``."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def print_exception(exc: BaseException) -> None:
    """Print ``exc`` like the interpreter would, without the sandbox's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != SOLUTION:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)


def new_main_module(workdir: str) -> types.ModuleType:
    """A fresh ``__main__`` (so pickling user classes works) with the work dir importable."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = [SOLUTION]
    sys.path.insert(0, workdir)
    return main


def finish(code: int) -> None:
    """Interpreter shutdown in miniature: join non-daemon threads, atexit, flush; then ``_exit``."""
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except BaseException as e:
        print_exception(e)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code)


def run_python(code: str, workdir: str) -> None:
    import linecache

    main = new_main_module(workdir)
    linecache.cache[SOLUTION] = (len(code), None, code.splitlines(True), SOLUTION)
    try:
        exec(compile(code, SOLUTION, "exec"), main.__dict__)
        status = 0
    except SystemExit as e:
        status = exit_code_of(e)
    except BaseException as e:
        print_exception(e)
        status = 1
    finish(status)


def run_bash(code: str, env: dict, bash: str) -> None:
    if len(code.encode()) < ARG_MAX_SAFE:
        os.execve(bash, ["bash", "-c", code], env)
    fd = memfd_with(code.encode(), "script")
    os.set_inheritable(fd, True)
    os.execve(bash, ["bash", f"/dev/fd/{fd}"], env)


def start(req: dict, out_fd: int, err_fd: int, cfg: dict) -> None:
    """Entry point in the forked child of one ``run`` request. Never returns.

    Args:
        req: the request frame (``code``, ``language``, ``stdin``, ``files``, ``limits``, ``uid``,
            ``workdir``).
        out_fd, err_fd: write ends of the stdout/stderr pipes the zygote reads.
        cfg: the zygote's configuration (``gid``, ``env``, ``bash``).
    """
    try:
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        prepare(req, cfg)
        env = dict(cfg["env"], HOME=req["workdir"], TMPDIR=req["workdir"], PWD=req["workdir"])
        if req["language"] == "bash":
            run_bash(req["code"], env, cfg["bash"])
        os.environ.clear()
        os.environ.update(env)
        fresh_std_streams()
        run_python(req["code"], req["workdir"])
    except BaseException as e:
        try:
            os.write(2, f"chatgym sandbox: set-up failed: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(SETUP_FAILED)


def prepare(req: dict, cfg: dict) -> None:
    """Steps 1-5 of the module docstring (everything before the code runs)."""
    os.setsid()
    if req.get("uid") is not None:
        drop_to(req["uid"], cfg["gid"])
    isolation.set_pdeathsig(signal.SIGKILL)
    os.umask(0o077)
    os.chdir(req["workdir"])
    write_files(req["workdir"], req.get("files") or [])
    stdin = req.get("stdin") or ""
    fd = memfd_with(stdin.encode(), "stdin") if stdin else os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.closerange(3, 1 << 20)
    reset_signals()
    set_rlimits(req["limits"])
