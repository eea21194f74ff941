"""What a forked child of the zygote does: drop privileges, apply limits, run the code. Never returns.

Stdlib only (imported standalone by the zygote). The order matters:

1. ``setsid()``: the child leads a new session and process group, so one ``killpg`` ends its tree.
   A pre-forked "spare" does this, then blocks until the zygote writes it a request.
2. create the work dir (as root) and, where the zygote has a mount namespace, the run's own empty
   /tmp, /var/tmp, /dev/shm, /run/lock in a mount namespace of the child's own
   (``isolation.enter_scratch``; a spare does both before its request arrives); switch to the
   sandbox uid/gid (when the zygote claimed one), then ``kill(-1, SIGKILL)`` as that uid:
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
import marshal
import os
import resource
import signal
import sys
import traceback
import types

from . import isolation, wire

SOLUTION = "<solution>"
_OWN_PREFIX = __name__.rpartition(".")[0] + "."  # frames of our own modules are hidden in tracebacks
SETUP_FAILED = 125  # exit code when the sandbox itself could not be set up (never user code's fault)
MAX_FD = 1 << 20  # closerange bound (close_range(2) makes the size free)
ARG_MAX_SAFE = 100_000  # bytes; a longer bash script goes through a memfd (one execve arg <= 128 KiB)


def set_rlimits(lim: dict) -> None:
    """Apply the run's limits (``lim`` keys: cpu_s, memory_bytes, nproc, nofile, fsize_bytes; a
    missing/None cpu_s, memory_bytes or nproc leaves that limit as it is)."""
    if lim.get("cpu_s"):
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
    """The dispositions a new Python interpreter starts with (SIGPIPE and SIGXFSZ ignored, so a
    closed pipe or RLIMIT_FSIZE raise OSError; SIGINT raises KeyboardInterrupt)."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def own_std_streams() -> None:
    """New ``sys.std*`` objects over fds 0-2 (what a new interpreter makes for pipes: UTF-8,
    block-buffered stdout, line-buffered stderr). Made once in the zygote, which never writes to
    them, so each child inherits them with empty buffers and points fds 0-2 at its own pipes."""
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
    while tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith(_OWN_PREFIX):
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


def compile_solution(code: str):
    """``code`` compiled as the file ``<solution>``, with no ``__future__`` flags of ours leaking in."""
    return compile(code, SOLUTION, "exec", dont_inherit=True)


def run_python(code: str, workdir: str, compiled: bytes | None = None) -> None:
    """Run ``code`` as ``__main__`` and exit like ``python3 file.py`` would. ``compiled``: the
    zygote's cached ``marshal`` of ``compile_solution(code)``, when it has one."""
    import linecache

    main = new_main_module(workdir)
    linecache.cache[SOLUTION] = (len(code), None, code.splitlines(True), SOLUTION)
    try:
        exec(marshal.loads(compiled) if compiled else compile_solution(code), main.__dict__)
        status = 0
    except SystemExit as e:
        status = exit_code_of(e)
    except BaseException as e:
        print_exception(e)
        status = 1
    finish(status)


def run_bash(code: str, env: dict, bash: str) -> None:
    # What subprocess's restore_signals does: ignored dispositions survive execve, and a shell
    # pipeline (`yes | head`) needs the default SIGPIPE.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    if len(code.encode()) < ARG_MAX_SAFE:
        os.execve(bash, ["bash", "-c", code], env)
    fd = memfd_with(code.encode(), "script")
    os.set_inheritable(fd, True)
    os.execve(bash, ["bash", f"/dev/fd/{fd}"], env)


def spare(cmd_fd: int, out_fd: int, err_fd: int, workdir: str, cfg: dict) -> None:
    """Entry point of a pre-forked child: do what needs no request, wait for one, run it. Never returns.

    The zygote forks spares ahead of time, so a request costs a pipe write rather than a fork, and
    the set-up done here (fds, environment, ``sys.std*``) is off the request's critical path.

    Args:
        cmd_fd: read end of the pipe the request arrives on (EOF = retire quietly).
        out_fd, err_fd: write ends of the stdout/stderr pipes the zygote reads.
        workdir: the work dir this child will create and run in.
        cfg: the zygote's configuration (``gid``, ``bash``).
    """
    try:
        os.setsid()
        os.dup2(cmd_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.closerange(3, MAX_FD)
        # The zygote's own environment is the allowlist (see client.py); add the per-run entries.
        # (Item by item: MutableMapping.update's ABC checks cost ~0.2 ms of page faults in a fork.)
        env = os.environ
        env["HOME"] = env["TMPDIR"] = env["PWD"] = workdir
        scratch_error = own_scratch(workdir, cfg["scratch"])
        req = wire.read_marshal_fd(0)
        if req is None:
            os._exit(0)
        if scratch_error is not None:  # reported with the request: a spare that died idle is re-forked
            raise scratch_error
        prepare(req, workdir, cfg)
        code, compiled = req["code"], req.get("compiled")
        if req["language"] == "bash":
            run_bash(code, dict(os.environ), cfg["bash"])
        req = None  # the request (stdin, files) must not stay reachable from the code's frames
    except BaseException as e:
        setup_failed(e)
    run_python(code, workdir, compiled)


def own_scratch(workdir: str, scratch: list[str]) -> OSError | None:
    """Make the work dir and enter the run's private scratch dirs (``scratch``: the zygote's
    scratch dirs, empty when it has no mount namespace: then the work dir is made in ``prepare``).
    Returns the error instead of raising it, so the run that takes this spare reports it."""
    if not scratch:
        return None
    try:
        os.mkdir(workdir, 0o700)
        isolation.make_scratch(workdir, scratch)
        isolation.enter_scratch(workdir, scratch)
    except OSError as e:
        return e
    return None


def setup_failed(exc: BaseException) -> None:
    try:
        os.write(2, f"chatgym sandbox: set-up failed: {type(exc).__name__}: {exc}\n".encode())
    finally:
        os._exit(SETUP_FAILED)


def prepare(req: dict, workdir: str, cfg: dict, stdin_fd: int | None = None) -> None:
    """Steps 2-5 of the module docstring (everything before the code runs); fds 1 and 2 are set.

    ``req`` fields used: ``uid`` (None = keep ours), ``files``, ``stdin``, ``limits``."""
    uid = req.get("uid")
    if not cfg["scratch"]:  # else ``own_scratch`` made it
        os.mkdir(workdir, 0o700)
    if uid is not None:
        os.chown(workdir, uid, cfg["gid"])
        drop_to(uid, cfg["gid"])
    isolation.set_pdeathsig(signal.SIGKILL)
    os.umask(0o077)
    os.chdir(workdir)
    write_files(workdir, req.get("files") or [])
    if stdin_fd is None:
        stdin = req.get("stdin") or ""
        stdin_fd = memfd_with(stdin.encode(), "stdin") if stdin else os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin_fd, 0)
    os.closerange(3, MAX_FD)
    reset_signals()
    set_rlimits(req["limits"])
