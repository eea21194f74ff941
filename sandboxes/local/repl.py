"""Stateful Python sessions: one interpreter per session, kept across calls (REPL-style).

Zygote side (``Sessions``): a session is a uid of its own (claimed like the run slots), a work dir
and private scratch dirs (/tmp, ...: ``isolation.make_scratch``) that live as long as the session,
and a child process forked from the zygote on the first call.
Each call writes ``{"code", "timeout_s"}`` to the child's command pipe and collects stdout/stderr
until the child writes the call's exit code (4 bytes) on its result pipe. A timeout kills the
child's whole process group (and every process of the session uid); so does the child dying any
other way. The next call then forks a fresh interpreter and says so (a note at the top of stderr
and ``info["fresh_interpreter"] = True``); files in the work dir are kept.

Child side (``session_main``): like a REPL, a call's last expression statement is echoed
(``sys.displayhook``: its repr, when not None). An exception prints a traceback and gives exit code
1; ``SystemExit(n)`` gives exit code ``n``; the interpreter survives both. With a memory cgroup
(``memcg.py``, one per session) a call is ``oom`` when the cgroup's OOM count grew during it (the
interpreter, OOM-killed, is then replaced at the next call); without one, memory_mb is RLIMIT_AS.
Each call gets its own file name (``<cell N>``), so tracebacks quote the right source lines.
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import struct
import sys
import time
from dataclasses import dataclass, field

from . import child, isolation, wire

EXIT = struct.Struct(">i")
CMD_FD, RES_FD = 3, 4  # in the session child


@dataclass
class Call:
    id: int
    out: object  # zygote.Output
    err: object
    started: float
    deadline: float
    fresh_note: str = ""
    timed_out: bool = False
    oom_before: int = 0  # the session cgroup's OOM count when the call started


@dataclass
class Session:
    sid: int
    uid: int | None
    workdir: str
    memory_mb: int
    cgroup: str | None = None  # the session's memory cgroup (None: RLIMIT_AS only)
    pid: int | None = None
    cmd_w: int = -1
    fds: dict = field(default_factory=dict)  # read fd -> "out" | "err" | "res"
    res_buf: bytearray = field(default_factory=bytearray)
    call: Call | None = None
    queue: list = field(default_factory=list)
    started_once: bool = False
    spawn_pending: bool = False
    fresh_note: str = ""
    end_reason: str = ""


class Sessions:
    """The zygote's table of open sessions and the handlers of their events."""

    def __init__(self, zygote) -> None:
        self.z = zygote
        self.table: dict[int, Session] = {}

    def forget(self) -> None:
        self.table.clear()

    # ---- requests ------------------------------------------------------------------------------

    def dispatch(self, msg: dict) -> None:
        op = msg["op"]
        if op == "sopen":
            self.open(msg)
        elif op == "scall":
            s = self.table.get(msg["sid"])
            if s is None:
                raise ValueError(f"no open session {msg['sid']}")
            s.queue.append(msg)
            if s.call is None:
                self.next_call(s)
        elif op == "sclose":
            s = self.table.pop(msg["sid"], None)
            if s is not None:
                self.close(s)
            self.z.send({"op": "ack", "id": msg["id"]})
        else:
            raise ValueError(f"unknown op {op!r}")

    def open(self, msg: dict) -> None:
        iso = self.z.iso
        try:
            uid = isolation.claim_uid(iso, *self.z.cfg["uid_range"]) if iso.uids else None
        except OSError as e:
            self.z.send({"op": "ack", "id": msg["id"], "error": str(e)})
            return
        workdir = os.path.join(self.z.work_base, f"s{msg['sid']}")
        try:
            os.mkdir(workdir, 0o700)
            if uid is not None:
                os.chown(workdir, uid, iso.gid)
            if self.z.cfg["scratch"]:
                isolation.make_scratch(workdir, self.z.cfg["scratch"])
        except OSError as e:  # e.g. the private /tmp is full: refuse the session, keep nothing of it
            self.z.cleanup(workdir, uid)
            if uid is not None:
                isolation.release_uid(iso, uid)
            self.z.send({"op": "ack", "id": msg["id"], "error": f"the session's work dir: {e}"})
            return
        cgroup = None
        if self.z.memcg is not None:
            try:
                cgroup = self.z.memcg.create(f"s{msg['sid']}", int(msg["memory_mb"]) << 20)
            except OSError:
                pass  # RLIMIT_AS then
        self.table[msg["sid"]] = Session(msg["sid"], uid, workdir, int(msg["memory_mb"]), cgroup)
        self.z.send({"op": "ack", "id": msg["id"]})

    def next_call(self, s: Session) -> None:
        while s.queue and s.call is None:
            if s.pid is None:  # fork from the top of the zygote's loop, then come back
                if not s.spawn_pending:
                    s.spawn_pending = True
                    self.z.defer(lambda: self.spawn_then_call(s))
                return
            msg = s.queue.pop(0)
            note, s.fresh_note = s.fresh_note, ""
            now = time.monotonic()
            cap = int(msg["max_output_bytes"])
            s.call = Call(
                msg["id"],
                self.z.output(cap),
                self.z.output(cap),
                now,
                now + float(msg["timeout_s"]),
                note,
                oom_before=self.oom_count(s),
            )
            try:
                os.write(s.cmd_w, wire.encode_marshal({"code": msg["code"], "timeout_s": msg["timeout_s"]}))
            except OSError:  # the interpreter closed its command pipe: it is as good as dead
                self.kill(s, "its command pipe was closed")
            self.z.at(s.call.deadline, self.on_deadline, (s, s.call))

    def oom_count(self, s: Session) -> int:
        return self.z.memcg.oom_count(s.cgroup) if s.cgroup else 0

    # ---- the session process -------------------------------------------------------------------

    def spawn_then_call(self, s: Session) -> None:
        s.spawn_pending = False
        if s.sid not in self.table or s.pid is not None:
            return
        if s.started_once:
            s.fresh_note = (f"[chatgym sandbox: this is a fresh interpreter; the previous one ended "
                            f"({s.end_reason}): earlier variables, imports and definitions are gone; "
                            f"files in the work dir are kept]\n")  # fmt: skip
        self.spawn(s)
        self.next_call(s)

    def spawn(self, s: Session) -> None:
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                self.z.forget_state()
                session_main(cmd_r, res_w, out_w, err_w, s, self.z.cfg)
            finally:
                os._exit(child.SETUP_FAILED)
        for fd in (cmd_r, res_w, out_w, err_w):
            os.close(fd)
        s.pid, s.cmd_w, s.started_once = pid, cmd_w, True
        self.z.children[pid] = lambda _pid: self.on_exit(s)
        s.fds = {out_r: "out", err_r: "err", res_r: "res"}
        s.res_buf.clear()
        for fd in s.fds:
            os.set_blocking(fd, False)
            self.z.sel.register(fd, selectors.EVENT_READ, (self.on_pipe, (s, fd)))
        if s.cgroup:  # before any call's code reaches it; what its children fork stays in there too
            try:
                self.z.memcg.join(s.cgroup, pid)
            except OSError:  # it set no RLIMIT_AS, counting on the cgroup: it must not run code
                self.kill(s, "its memory cgroup could not be joined")

    def on_pipe(self, arg) -> None:
        s, fd = arg
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.z.sel.unregister(fd)
            os.close(fd)
            del s.fds[fd]
            return
        kind = s.fds[fd]
        if kind == "res":
            s.res_buf += chunk
            while len(s.res_buf) >= EXIT.size and s.call is not None:
                (code,) = EXIT.unpack_from(s.res_buf)
                del s.res_buf[: EXIT.size]
                self.drain(s)
                self.finish_call(s, code)
        elif s.call is not None:
            (s.call.out if kind == "out" else s.call.err).add(chunk)

    def drain(self, s: Session) -> None:
        """Read what the interpreter flushed before it reported the call done."""
        for fd, kind in list(s.fds.items()):
            if kind == "res" or s.call is None:
                continue
            try:
                while chunk := os.read(fd, 1 << 16):
                    (s.call.out if kind == "out" else s.call.err).add(chunk)
            except BlockingIOError:
                pass

    def on_exit(self, s: Session) -> None:
        self.z.killpg(s.pid)  # still a zombie: the group id cannot have been reused
        _, status, _ = os.wait4(s.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if s.uid is not None:
            self.z.reap_uid(s.uid)
        self.drain(s)
        for fd in list(s.fds):
            self.z.sel.unregister(fd)
            os.close(fd)
        os.close(s.cmd_w)
        s.fds, s.pid, s.cmd_w = {}, None, -1
        call = s.call
        if call is not None:
            s.end_reason = "timeout" if call.timed_out else f"exit code {code}"
            call.err.add(f"\n[chatgym sandbox: the interpreter ended ({s.end_reason}); the next call "
                         f"starts a fresh one]\n".encode())  # fmt: skip
            self.finish_call(s, code)
        else:
            s.end_reason = s.end_reason or f"exit code {code} between calls"

    def on_deadline(self, arg) -> None:
        s, call = arg
        if s.call is call and s.pid is not None:
            call.timed_out = True
            self.kill(s, "timeout")

    def kill(self, s: Session, reason: str) -> None:
        s.end_reason = reason
        self.z.kill_tree(s.pid)
        if s.uid is not None:
            self.z.reap_uid(s.uid)

    def finish_call(self, s: Session, code: int) -> None:
        call, s.call = s.call, None
        status = self.z.classify(code, call.timed_out, self.oom_count(s) > call.oom_before)
        (stdout, cut_out), (stderr, cut_err) = call.out.decode(), call.err.decode()
        self.z.send({
            "op": "result", "id": call.id, "status": status, "exit_code": code, "stdout": stdout,
            "stderr": call.fresh_note + stderr, "duration_s": time.monotonic() - call.started,
            "truncated": cut_out or cut_err,
            "info": {"fresh_interpreter": bool(call.fresh_note), "stdout_bytes": call.out.total,
                     "stderr_bytes": call.err.total},
        })  # fmt: skip
        self.next_call(s)

    def close(self, s: Session) -> None:
        pending, s.queue = s.queue, []
        if s.pid is not None:
            self.kill(s, "closed")
            self.on_exit_quiet(s)
        for msg in pending:
            self.z.send({"op": "result", "id": msg["id"], "status": "killed", "exit_code": None,
                         "stderr": "chatgym sandbox: the session was closed\n", "info": {}})  # fmt: skip
        self.z.cleanup(s.workdir, s.uid)
        self.z.remove_cgroup(s.cgroup)
        if s.uid is not None:
            isolation.release_uid(self.z.iso, s.uid)

    def on_exit_quiet(self, s: Session) -> None:
        """Reap a session process we killed, answering its pending call (if any) as killed."""
        if s.call is not None:
            s.call.err.add(b"\n[chatgym sandbox: the session was closed]\n")
        self.z.children.pop(s.pid, None)
        self.on_exit(s)

    def close_all(self) -> None:
        """At shutdown: kill every session process (the zygote reaps them with its other children)."""
        for s in list(self.table.values()):
            if s.pid is not None:
                self.z.kill_tree(s.pid)
                if s.uid is not None:
                    self.z.reap_uid(s.uid)
            if s.cgroup:  # removed by the zygote's memcg.close(), once the processes are gone
                self.z.memcg.leftover.append(s.cgroup)
        self.table.clear()


def session_main(cmd_fd: int, res_fd: int, out_fd: int, err_fd: int, s: Session, cfg: dict) -> None:
    """Entry point of a session's child process. Never returns."""
    try:
        os.setsid()
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.dup2(cmd_fd, CMD_FD)
        os.dup2(res_fd, RES_FD)
        env = os.environ
        env["HOME"] = env["TMPDIR"] = env["PWD"] = s.workdir
        limits = {"memory_bytes": None if s.cgroup else s.memory_mb << 20, "nproc": cfg["max_processes"] + cfg["host_processes"],
                  "nofile": cfg["max_open_files"], "fsize_bytes": cfg["max_file_bytes"]}  # fmt: skip
        if cfg["scratch"]:  # the session's own /tmp etc. (made at open, kept across interpreters)
            isolation.enter_scratch(s.workdir, cfg["scratch"])
        if s.uid is not None:
            child.drop_to(s.uid, cfg["gid"])
        isolation.set_pdeathsig(signal.SIGKILL)
        os.umask(0o077)
        os.chdir(s.workdir)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.closerange(RES_FD + 1, child.MAX_FD)
        child.reset_signals()
        child.set_rlimits(limits)
        main = child.new_main_module(s.workdir)
        import ast  # noqa: F401  (before the memory limit bites)
    except BaseException as e:
        child.setup_failed(e)
    n = 0
    while (req := wire.read_marshal_fd(CMD_FD)) is not None:
        n += 1
        limit_cpu(float(req["timeout_s"]))
        code = run_cell(req["code"], f"<cell {n}>", main.__dict__)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os.write(RES_FD, EXIT.pack(code))
    os._exit(0)


def limit_cpu(timeout_s: float) -> None:
    """RLIMIT_CPU is cumulative: allow this call ``ceil(timeout_s) + 1`` more CPU seconds."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(ru.ru_utime + ru.ru_stime + timeout_s) + 2
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(
        resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard)
    )


def run_cell(code: str, name: str, ns: dict) -> int:
    """Run one call's code in ``ns``; echo the last expression's value. Returns the exit code."""
    import ast
    import linecache

    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = compile(ast.Expression(tree.body.pop().value), name, "eval", dont_inherit=True)
        body = compile(tree, name, "exec", dont_inherit=True)
    except SyntaxError as e:
        # As the interpreter reports a script that does not parse: the cell's line and caret, no
        # frames (they were the host's ast.py: its path, and 300 of a tool result's characters).
        if e.text is None and e.lineno:  # compile() of the parsed tree has no source to quote
            e.text = linecache.getline(name, e.lineno)
        child.print_exception(e.with_traceback(None))
        return 1
    except BaseException as e:  # e.g. RecursionError / MemoryError while parsing deeply nested code
        child.print_exception(e)
        return 1
    try:
        exec(body, ns)
        if last is not None:
            value = eval(last, ns)
            if value is not None:
                sys.displayhook(value)
        return 0
    except SystemExit as e:
        return child.exit_code_of(e)
    except BaseException as e:
        child.print_exception(e)
        return 1
