"""The fork server ("zygote") behind ``LocalSandbox``: one warm interpreter that forks a child per run.

Started once per sandbox as ``python -I -S -c <bootstrap> <socket fd>`` with an allowlisted
environment (see ``sandbox.py``). It sets up isolation once (``isolation.setup``: namespaces, private
/tmp, sandbox uids), pre-imports common stdlib modules, freezes the GC (so children do not dirty every
page) and then serves frames (``wire.py``) from the parent over a unix socket:

* ``run``: hand the request to a pre-forked spare child (``child.spare``: it makes the work dir,
  drops privileges, applies rlimits and runs the code) and fork a replacement when idle. The zygote
  reads the child's stdout/stderr pipes up to the output cap (draining and counting the rest, so a
  chatty program is never blocked or changed by the cap), learns of its exit from SIGCHLD,
  enforces the wall-clock deadline with ``killpg(SIGKILL)``, replies ``result`` and cleans up.
* ``kill``: end a run early (its caller was cancelled); the reply still comes.
* ``sopen`` / ``scall`` / ``sclose``: stateful Python sessions (``repl.py``).
* ``shutdown`` or EOF on the socket (the parent died): kill every child and exit.

One single-threaded ``selectors`` loop multiplexes every run, so runs overlap freely; the parent's
concurrency limit decides how many are in flight. The zygote is a child subreaper: processes that
a run orphans are re-parented to it (not to PID 1, which in a container may never reap them), and
it reaps them. Linux only (memfd, PR_SET_CHILD_SUBREAPER).
"""

from __future__ import annotations

import errno
import gc
import heapq
import itertools
import os
import selectors
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from . import child, isolation, repl, wire
from .compile_cache import CompileCache
from .memcg import MemCgroups
from .outputs import Output, classify, remove_tree

GRACE_S = 0.1  # after the child exits and its group is killed, how long its pipes may stay open
DYING_MAX_S = 5.0  # how long SIGKILLed group members may take to die before we stop waiting
LEFTOVER_WAIT_S = 0.5  # how long a finished run's killed leftovers may take to leave its cgroup
WORK_BASE_NS = "/tmp/.chatgym-work"


@dataclass
class Spare:
    """A pre-forked child blocked on ``cmd_w``'s pipe, with its stdout/stderr pipes already made."""

    pid: int
    cmd_w: int
    out_r: int
    err_r: int
    workdir: str


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@dataclass
class Job:
    """One forked run (or one session call, see ``repl.py``) the zygote is watching."""

    id: int
    pid: int
    out: Output
    err: Output
    deadline: float
    started: float
    uid: int | None = None
    workdir: str | None = None
    cgroup: str | None = None  # the run's memory cgroup (None: RLIMIT_AS only)
    pipes: dict[int, Output] = field(default_factory=dict)  # open read ends
    exit_code: int | None = None
    timed_out: bool = False
    info: dict = field(default_factory=dict)
    done: bool = False
    grace_until: float = 0.0


class Zygote:
    output = staticmethod(Output)
    classify = staticmethod(classify)

    def __init__(
        self, sock: socket.socket, cfg: dict, iso: isolation.Isolation, decoder: wire.FrameDecoder,
        memcg: MemCgroups | None = None,
    ):  # fmt: skip
        self.sock = sock
        self.memcg = memcg
        self.cfg = cfg
        self.iso = iso
        self.decoder = decoder
        self.sel = selectors.DefaultSelector()
        self.jobs: dict[int, Job] = {}
        self.timers: list = []
        self.seq = itertools.count()
        self.work_base = cfg["work_base"]
        self.sessions = repl.Sessions(self)
        self.spares: list[Spare] = []
        self.n_spares = int(cfg["spares"])
        self.children: dict[int, object] = {}  # pid -> callback(pid) that reaps it
        self.compiled = CompileCache()
        self.deferred: deque = deque()
        self.running = True
        self.sel.register(sock, selectors.EVENT_READ, (self.on_control, None))
        # SIGCHLD -> a byte on this pipe (CPython's wakeup fd) -> on_sigchld in the loop.
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.wake_r, selectors.EVENT_READ, (self.on_sigchld, None))

    # ---- plumbing ------------------------------------------------------------------------------

    def send(self, msg: dict) -> None:
        try:  # blocking: the parent's reader thread always drains the socket, so a block is short
            self.sock.sendall(wire.encode(msg))
        except OSError:
            self.running = False

    def at(self, when: float, fn, arg) -> None:
        heapq.heappush(self.timers, (when, next(self.seq), fn, arg))

    def loop(self) -> None:
        while self.running:
            if not self.step() and len(self.spares) < self.n_spares and self.running:
                # Forked here, at the top of the stack: no frame above holds another request.
                self.spares.append(self.fork_spare())
            while self.deferred and self.running:
                self.deferred.popleft()()
        self.shutdown()

    def step(self) -> bool:
        """Handle ready events and due timers; False when there was nothing to do."""
        timeout = None
        if self.timers:
            timeout = max(0.0, self.timers[0][0] - time.monotonic())
        if len(self.spares) < self.n_spares or self.deferred:
            timeout = 0.0  # events first; forks only when there is nothing to handle
        events = self.sel.select(timeout)
        registered = self.sel.get_map()
        for key, _ in events:
            # A handler earlier in this batch may have closed this fd (a session's pipes when its
            # process exits), and a fork may have reused the number: only a key still registered is live.
            if registered.get(key.fd) is not key:
                continue
            fn, arg = key.data
            fn(arg)
        now = time.monotonic()
        fired = False
        while self.timers and self.timers[0][0] <= now:
            _, _, fn, arg = heapq.heappop(self.timers)
            fn(arg)
            fired = True
        return bool(events) or fired

    def defer(self, action) -> None:
        """Run ``action()`` from the top of the loop. Whatever forks goes through here (or the
        spare refill), so no frame of the forked child's stack holds another request's data."""
        self.deferred.append(action)

    def on_control(self, _) -> None:
        try:
            data = self.sock.recv(1 << 20)  # readable, so this does not block
        except OSError:
            data = b""
        if not data:
            self.running = False
            return
        for msg in self.decoder.feed(data):
            try:
                self.dispatch(msg)
            except Exception as e:  # a bad request must not take the zygote down
                self.send(
                    {
                        "op": "result",
                        "id": msg.get("id"),
                        "status": "error",
                        "exit_code": None,
                        "stderr": f"chatgym sandbox: {type(e).__name__}: {e}\n",
                        "info": {"internal": True},
                    }
                )

    def dispatch(self, msg: dict) -> None:
        op = msg["op"]
        if op == "run":
            self.start_run(msg)
        elif op == "kill":
            job = self.jobs.get(msg["id"])
            if job is not None:
                self.kill_job(job, reason="cancelled")
        elif op == "shutdown":
            self.running = False
        else:
            self.sessions.dispatch(msg)

    # ---- runs ----------------------------------------------------------------------------------

    def limits(self, msg: dict, cgroup: str | None = None) -> dict:
        """The run's rlimits; with a memory cgroup (``cgroup``) no RLIMIT_AS: the cgroup's limit must be
        the one a run hits, so that hitting it is observed (an RLIMIT_AS refusal is not)."""
        nproc = self.cfg["max_processes"]
        if not self.iso.uids:  # RLIMIT_NPROC counts every process of the uid: leave room for the host's
            nproc += self.cfg["host_processes"]
        return {
            "cpu_s": int(msg["timeout_s"]) + 1,
            "memory_bytes": None if cgroup else int(msg["memory_mb"]) << 20,
            "nproc": nproc,
            "nofile": self.cfg["max_open_files"],
            "fsize_bytes": self.cfg["max_file_bytes"],
        }

    def make_workdir(self, name: str, uid: int | None) -> str:
        path = os.path.join(self.work_base, name)
        os.mkdir(path, 0o700)
        if uid is not None:
            os.chown(path, uid, self.iso.gid)
        return path

    def fork_spare(self) -> Spare:
        """Fork a child that waits for a request (``child.spare``); see ``Spare``."""
        cmd_r, cmd_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        workdir = os.path.join(self.work_base, f"w{next(self.seq)}")
        pid = os.fork()
        if pid == 0:  # the child never returns from here
            try:
                self.forget_state()
                child.spare(cmd_r, out_w, err_w, workdir, self.cfg)
            finally:
                os._exit(child.SETUP_FAILED)
        for fd in (cmd_r, out_w, err_w):
            os.close(fd)
        spare = Spare(pid, cmd_w, out_r, err_r, workdir)
        self.children[pid] = lambda _pid: self.discard_spare(spare)
        return spare

    def spares_wanted(self, then) -> None:
        """Fork a spare (deferred to the top of the loop), then call ``then()``."""

        def fork_then() -> None:
            self.spares.append(self.fork_spare())
            then()

        self.defer(fork_then)

    def forget_state(self) -> None:
        """In a fresh child: drop references to other runs' data (their code, stdin, output) and
        the zygote's signal plumbing."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.jobs.clear()
        self.spares.clear()
        self.children.clear()
        self.timers.clear()
        self.deferred.clear()
        self.compiled = None
        self.decoder = None
        self.sel = None
        self.sessions.forget()

    def discard_spare(self, spare: Spare) -> None:
        """Retire a spare (unused, or found dead when a request was written to it) and reap it."""
        if spare in self.spares:
            self.spares.remove(spare)
        self.children.pop(spare.pid, None)
        for fd in (spare.cmd_w, spare.out_r, spare.err_r):
            os.close(fd)
        self.killpg(spare.pid)
        os.waitpid(spare.pid, 0)
        self.cleanup(spare.workdir, None)  # a spare makes its work dir and scratch dirs ahead

    def on_sigchld(self, _) -> None:
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass
        while True:
            try:  # peek (WNOWAIT): the child stays a zombie, so its pid and group id stay reserved
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            callback = self.children.pop(info.si_pid, None)
            if callback is None:
                os.waitpid(info.si_pid, 0)  # an orphan of some run, adopted by us as subreaper
            else:
                callback(info.si_pid)  # reaps it

    def start_run(self, msg: dict) -> None:
        if not self.spares:  # fork one from the top of the loop, then come back
            self.spares_wanted(lambda: self.start_run(msg))
            return
        uid = self.iso.uids[msg["slot"]] if self.iso.uids else None
        spare = self.spares.pop()
        cgroup = self.join_cgroup(spare.pid, int(msg["memory_mb"]) << 20)
        req = dict(msg, uid=uid, limits=self.limits(msg, cgroup))
        if msg["language"] == "python":
            req["compiled"] = self.compiled.get(msg["code"])
        started = time.monotonic()
        try:
            _write_all(spare.cmd_w, wire.encode_marshal(req))
        except BrokenPipeError:  # that spare died while idle (killed from outside): use another
            self.discard_spare(spare)
            self.remove_cgroup(cgroup)
            self.start_run(msg)
            return
        os.close(spare.cmd_w)
        cap = int(msg["max_output_bytes"])
        job = Job(msg["id"], spare.pid, Output(cap), Output(cap),
                  started + float(msg["timeout_s"]), started, uid, spare.workdir, cgroup)  # fmt: skip
        self.jobs[job.id] = job
        self.children[job.pid] = lambda _pid: self.on_exit(job)
        for fd, buf in ((spare.out_r, job.out), (spare.err_r, job.err)):
            os.set_blocking(fd, False)
            job.pipes[fd] = buf
            self.sel.register(fd, selectors.EVENT_READ, (self.on_pipe, (job, fd)))
        self.at(job.deadline, self.on_deadline, job)

    def join_cgroup(self, pid: int, limit_bytes: int) -> str | None:
        """A new memory cgroup of ``limit_bytes`` holding ``pid`` (a child that has not run user code
        yet), or None without cgroups (or when making one failed: then RLIMIT_AS applies)."""
        if self.memcg is None:
            return None
        try:
            path = self.memcg.new_run(limit_bytes)
        except OSError:
            return None
        try:
            self.memcg.join(path, pid)
        except OSError:
            self.memcg.remove(path)
            return None
        return path

    def remove_cgroup(self, path: str | None) -> None:
        if path is not None and self.memcg is not None:
            self.memcg.remove(path)

    def hit_memory_limit(self, path: str | None) -> bool:
        """Whether the cgroup ``path`` counted an OOM (the sandbox's own observation of the limit)."""
        return path is not None and self.memcg is not None and self.memcg.oom_count(path) > 0

    def on_pipe(self, arg) -> None:
        job, fd = arg
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if chunk:
            job.pipes[fd].add(chunk)
            return
        self.close_pipe(job, fd)
        self.maybe_finish(job)

    def close_pipe(self, job: Job, fd: int) -> None:
        self.sel.unregister(fd)
        os.close(fd)
        del job.pipes[fd]

    def on_exit(self, job: Job) -> None:
        # The child is a zombie until wait4: its pid (= its process group id) cannot be reused yet,
        # so this killpg cannot hit a stranger. It ends background jobs left in the group.
        self.killpg(job.pid)
        _, status, ru = os.wait4(job.pid, 0)
        job.exit_code = os.waitstatus_to_exitcode(status)
        job.info.update(cpu_s=round(ru.ru_utime + ru.ru_stime, 6), max_rss_kb=ru.ru_maxrss)
        job.info["duration_s"] = time.monotonic() - job.started
        if job.pipes:  # a killed group member is still dying, or a descendant left the group
            job.grace_until = time.monotonic() + DYING_MAX_S
            self.at(time.monotonic() + GRACE_S, self.on_grace, job)
        self.maybe_finish(job)

    def on_grace(self, job: Job) -> None:
        if job.done or not job.pipes:
            return
        if self.group_exists(job.pid) and time.monotonic() < job.grace_until:
            # Members of the killed group hold the pipes; they die (and close them) when they next
            # run, which on a busy machine can take a while. Waiting means no process of this run is
            # left when its result is sent.
            self.at(time.monotonic() + GRACE_S, self.on_grace, job)
            return
        job.info["escaped_processes"] = True
        if job.uid is not None:
            self.reap_uid(job.uid)
        for fd in list(job.pipes):
            self.drain(job, fd)
            self.close_pipe(job, fd)
        self.maybe_finish(job)

    def drain(self, job: Job, fd: int) -> None:
        try:
            while chunk := os.read(fd, 1 << 16):
                job.pipes[fd].add(chunk)
        except BlockingIOError:
            pass

    def on_deadline(self, job: Job) -> None:
        if job.exit_code is None and not job.done:
            self.kill_job(job, reason="timeout")

    def kill_job(self, job: Job, reason: str) -> None:
        if job.exit_code is not None:
            return
        job.timed_out = job.timed_out or reason == "timeout"
        job.info.setdefault("killed_by", reason)
        self.kill_tree(job.pid)
        if job.uid is not None:
            self.reap_uid(job.uid)

    @staticmethod
    def group_exists(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def kill_tree(self, pid: int) -> None:
        """SIGKILL our (unreaped) child ``pid`` and its process group. The direct kill matters
        when the child has not yet run ``setsid()`` (a spare forked a moment ago on a busy
        machine): then no group ``pid`` exists yet, and the child must not get to run the code."""
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.killpg(pid)

    def killpg(self, pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def reap_uid(self, uid: int) -> None:
        """SIGKILL every process of ``uid`` (escapees of setsid/double-fork): a throwaway child
        becomes ``uid`` and calls ``kill(-1)``, which reaches exactly that uid's processes."""
        pid = os.fork()
        if pid == 0:
            try:
                child.drop_to(uid, self.iso.gid)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

    def maybe_finish(self, job: Job) -> None:
        if job.done or job.exit_code is None or job.pipes:
            return
        job.done = True
        del self.jobs[job.id]
        # Reply first, clean up second: the parent reuses this uid only after reading the reply and
        # sending a new request, which this single-threaded loop reads after the clean-up.
        self.send(self.result(job))
        self.end_leftovers(job)
        self.cleanup(job.workdir, job.uid)
        self.remove_cgroup(job.cgroup)

    def end_leftovers(self, job: Job) -> None:
        """Kill what a finished run left running (a setsid'd process that closed its pipes) before its
        dirs are removed: one still writing after the clean-up would leave files in the shared tmpfs
        until the sandbox closes. With a cgroup, only when it still has members, waiting (up to
        ``LEFTOVER_WAIT_S``) until they are gone; without one, the run's uid is reaped every time."""
        if job.uid is None:
            return
        cgroup = job.cgroup if self.memcg is not None else None
        if cgroup is not None and not self.memcg.members(cgroup):
            return
        self.reap_uid(job.uid)
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        while cgroup is not None and self.memcg.members(cgroup) and time.monotonic() < deadline:
            time.sleep(0.005)

    def result(self, job: Job) -> dict:
        status = classify(job.exit_code, job.timed_out, self.hit_memory_limit(job.cgroup))
        info = dict(job.info, stdout_bytes=job.out.total, stderr_bytes=job.err.total)
        if job.exit_code == child.SETUP_FAILED and job.err.data.startswith(b"chatgym sandbox: set-up failed"):
            info["internal"] = True
        (stdout, cut_out), (stderr, cut_err) = job.out.decode(), job.err.decode()
        return {
            "op": "result", "id": job.id, "status": status, "exit_code": job.exit_code,
            "stdout": stdout, "stderr": stderr, "duration_s": info.pop("duration_s"),
            "truncated": cut_out or cut_err, "info": info,
        }  # fmt: skip

    def cleanup(self, workdir: str | None, uid: int | None) -> None:
        """Remove the work dir and the run's own scratch dirs; without those (no mount namespace
        per child), the scratch files the run's uid left in the zygote's private /tmp."""
        if workdir:
            remove_tree(workdir)
            if self.cfg["scratch"]:
                self.remove_scratch(workdir)
        if uid is None or not self.iso.mount_ns or self.cfg["scratch"]:
            return
        for d in isolation.SCRATCH_DIRS:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                try:
                    if e.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if e.is_dir(follow_symlinks=False):
                        remove_tree(e.path)
                    else:
                        os.unlink(e.path)
                except OSError:
                    pass

    def remove_scratch(self, workdir: str) -> None:
        """Remove the run's scratch dirs: one ``rmdir`` each when empty (the common case, ~5x
        quicker than walking them), the whole tree of one that is not."""
        for path in isolation.scratch_dirs_bottom_up(workdir, self.cfg["scratch"]):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                remove_tree(path)

    def shutdown(self) -> None:
        for spare in list(self.spares):
            self.discard_spare(spare)
        for pid in list(self.children):
            self.killpg(pid)
        self.sessions.close_all()
        for uid in self.iso.uids:
            self.reap_uid(uid)
        for pid in list(self.children):
            os.waitpid(pid, 0)
        remove_tree(self.work_base)
        if self.memcg is not None:
            # In-flight runs' and open sessions' cgroups too: close() removes what leftover names.
            live = [job.cgroup for job in self.jobs.values()] + [s.cgroup for s in self.sessions.table.values()]
            self.memcg.leftover.extend(p for p in live if p is not None and p not in self.memcg.leftover)
            self.memcg.close()


def count_processes(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                n += 1
        except OSError:
            pass
    return n


def stdlib_readable(uid: int, gid: int) -> bool:
    """Whether a sandbox uid can read the stdlib (else only pre-imported modules would import)."""
    pid = os.fork()
    if pid == 0:
        try:
            child.drop_to(uid, gid)
            with open(os.__file__, "rb"):
                os._exit(0)
        finally:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def open_memcg(cfg: dict) -> tuple[MemCgroups | None, str]:
    """The per-run memory cgroups ``cfg["memory_cgroup"]`` asks for (None = where possible), and a
    note when there are none. Raises OSError when they are required (True) but impossible."""
    want = cfg.get("memory_cgroup")
    if want is False:
        return None, ""
    memcg, why = MemCgroups.open(cfg.get("memcg_dir"))
    if memcg is None and want:
        raise OSError(errno.EPERM, f"memory_cgroup=True but no memory cgroup can be made: {why}")
    note = "" if memcg else (f"no per-run memory cgroup ({why}): memory_mb is an RLIMIT_AS, and running "
                             "out of it is not observable (status error or killed, never oom)")  # fmt: skip
    return memcg, note


def scratch_fails(work_base: str, scratch: list[str]) -> str:
    """Whether a child can get its own scratch dirs here (``isolation.enter_scratch``): "" if so, else why not."""
    workdir = os.path.join(work_base, "probe")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.mkdir(workdir, 0o700)
            isolation.make_scratch(workdir, scratch)
            isolation.enter_scratch(workdir, scratch)
            os._exit(0)
        except BaseException as e:
            os.write(w, str(e).encode()[:2000])
        finally:
            os._exit(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        why = f.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    remove_tree(workdir)
    remove_tree(isolation.scratch_root(workdir))
    return "" if code == 0 else why or f"exit code {code}"


def main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    decoder = wire.FrameDecoder()
    msgs: list[dict] = []
    while not msgs:
        data = sock.recv(1 << 20)
        if not data:
            return
        msgs = decoder.feed(data)
    cfg = msgs[0]
    if cfg.get("pdeathsig"):
        isolation.set_pdeathsig(signal.SIGKILL)
    isolation.set_child_subreaper()
    memcg, memcg_note = open_memcg(cfg)
    iso = isolation.setup(
        drop_privileges=cfg["drop_privileges"], uid_range=tuple(cfg["uid_range"]), gid=cfg["gid"],
        n_uids=cfg["slots"], network=cfg["network"], tmpfs_mb=cfg["tmpfs_mb"],
        hidden_paths=cfg["hidden_paths"], keep_paths=[sys.prefix, sys.base_prefix, sys.exec_prefix],
    )  # fmt: skip
    if iso.uids and not stdlib_readable(iso.uids[0], iso.gid):
        iso.notes.append(f"the stdlib ({os.path.dirname(os.__file__)}) is not readable by sandbox uids: "
                         "only pre-imported modules can be imported")  # fmt: skip
    if iso.mount_ns:  # inside the private /tmp: gone with the namespace even if we are SIGKILLed
        cfg["work_base"] = WORK_BASE_NS
        os.makedirs(WORK_BASE_NS, mode=0o711, exist_ok=True)
    else:
        import tempfile  # only here: the zygote keeps few modules, each one costs every fork

        cfg["work_base"] = tempfile.mkdtemp(prefix="chatgym-sandbox-")
    os.chmod(cfg["work_base"], 0o711)  # sandbox uids may enter their own dir, not list the others
    cfg["scratch"] = []
    if iso.scratch:
        why = scratch_fails(cfg["work_base"], iso.scratch)
        if why:
            iso.notes.append(f"no private /tmp per run ({why}): concurrent runs of this sandbox share "
                             "its /tmp, /var/tmp, /dev/shm")  # fmt: skip
        else:
            cfg["scratch"] = iso.scratch
    cfg["gid"] = iso.gid
    cfg["host_processes"] = 0 if iso.uids else count_processes(os.getuid())
    for name in cfg["preload"]:
        try:
            __import__(name)
        except ImportError:
            pass
    gc.collect()
    gc.freeze()  # children share these pages instead of copying them at their first GC pass
    del msgs
    child.own_std_streams()  # made once here, inherited by every child, never written by the zygote
    if memcg_note:
        iso.notes.append(memcg_note)
    zygote = Zygote(sock, cfg, iso, decoder, memcg)
    zygote.spares = [zygote.fork_spare() for _ in range(zygote.n_spares)]
    zygote.send({"op": "ready", "pid": os.getpid(), "work_base": cfg["work_base"], "uids": iso.uids, "network_isolated": iso.network_isolated,
                 "mount_ns": iso.mount_ns, "private_tmp": bool(cfg["scratch"]), "proc_hidden": iso.proc_hidden,
                 "notes": iso.notes, "memory_cgroup": memcg.version if memcg else 0})  # fmt: skip
    zygote.loop()
