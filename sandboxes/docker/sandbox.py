"""``DockerSandbox``: each run in a pre-started Docker container (the ``docker`` extra).

A warm pool of ``pool_size`` containers (PID 1 is :data:`INIT`, a reaper; no network, memory/CPU/pids
caps, all capabilities dropped but the four the runner needs, ``no-new-privileges``) is kept started.
A run takes one and executes :data:`RUNNER` in it (``exec``), the request (code, stdin, files as one
JSON document) in the exec's arguments, or, over :data:`INLINE_MAX` bytes, copied in first as a file
(``put_archive``). Then, by ``reuse``:

* ``reuse=False`` (default, **fresh per run**): the container is removed while a replacement starts
  in the background. Nothing of one run (processes, files, kernel objects) reaches the next, and
  the start-up cost is off the run's path as long as runs come no faster than containers start.
* ``reuse=True`` (**warm**): runs go to the container's runner agent (:data:`RUNNER` started once per
  container; no ``exec`` per run), and the container goes back to the pool once the runner has reset it and
  verified the reset: no process of the run's uid left (``kill(-1)`` as that uid, repeated), /tmp,
  /dev/shm and /dev/mqueue emptied, no SysV IPC object of that uid. A run whose reset cannot be
  verified (or whose runner failed) gets its container removed instead. What a reused container
  *shares* between its runs: the image's file system (read-only to the run's uid; its only
  writable places are the three emptied above), the container's hostname, its empty network
  namespace (loopback only), its cgroups (memory/pids counters, page cache charged to it) and PID
  namespace (PIDs keep counting up), the init process, the runner agent (root, see :class:`_Agent`)
  and the uid (65534) — not processes, files, environment or IPC objects of the program.

Inside, the runner (root in the container) makes a work dir in /tmp (a ``tmpfs_mb`` tmpfs), drops
the program to uid/gid ``uid`` in its own session with rlimits (address space = ``memory_mb``, CPU,
file size, open files, no core), enforces the wall-clock limit with ``killpg``, caps each stream at
``max_output_bytes`` (counting the rest), resets the container (above) and prints one JSON result
line. The status rules are ``outputs.classify``, the same as the local backend's; ``oom`` when the
container's memory cgroup counted an OOM kill during the run (read by the runner before and after:
``memory.events`` / ``memory.oom_control``), i.e. when the run hit ``memory_limit_mb``. A run's own
``memory_mb`` is an RLIMIT_AS per process here: an allocation it refuses is NOT observable (the
program sees ENOMEM and ends as it likes: ``error`` / ``killed``, never ``oom``). A run whose runner
does not answer within ``timeout_s + 30`` s is killed with its container.

Needs a Docker engine (``docker.from_env()``: ``DOCKER_HOST``) and an image with ``python3`` (and
``bash`` for bash runs). No image is pulled on these machines: ``engine.py`` starts a private
engine and builds one from the host's interpreter (its tag goes in ``$CHATGYM_DOCKER_IMAGE``, the
default ``image``). Timings: ``benchmarks/sandbox_vs_human_eval.py --backend docker`` / ``docker-warm``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import posixpath
import secrets
import tarfile
import threading
import time
from pathlib import Path

from chatgym.sandboxes.base import ExecResult, check_run_args
from chatgym.sandboxes.limits import Limiter, global_limiter
from chatgym.sandboxes.local import wire
from chatgym.sandboxes.slots import SlotPool

REQUEST_PATH = "/chatgym-request.json"  # on the container's own file system: `put_archive`
# cannot write into a tmpfs mount, and /tmp is one
SLACK_S = 30.0
INLINE_MAX = 96 * 1024  # requests up to this many bytes go in the exec's argv (Linux: 128 KiB per argument)
LABEL = "chatgym.sandbox"
DEFAULT_IMAGE = "python:3.11-slim"  # used when $CHATGYM_DOCKER_IMAGE is unset (needs a registry)

# PID 1 of every container: reaps orphans (a run's zombies would otherwise count against the pids
# cap of a reused container) and exits on SIGTERM (a plain PID 1 ignores it: `docker stop` waited 10 s).
INIT = """import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT})
while True:
    if signal.sigwait({signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}) != signal.SIGCHLD:
        os._exit(0)
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
"""

RUNNER = (
    (Path(__file__).parent.parent / "local" / "outputs.py").read_text(encoding="utf-8")
    + """

def _main(arg):
    import base64, json, os, resource, selectors, signal, subprocess, sys, time
    if arg.startswith("{"):  # the request itself (small ones travel in the exec's argv)
        req = json.loads(arg)
    else:  # a file put_archive wrote
        with open(arg) as f:
            req = json.load(f)
        os.unlink(arg)
    work = req["work_dir"]
    os.makedirs(work, mode=0o700)
    for rel, b64 in req["files"].items():
        dest = os.path.join(work, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(base64.b64decode(b64))
    uid = req["uid"] if os.getuid() == 0 else None
    if uid is not None:  # root here has no CAP_DAC_OVERRIDE/CAP_FOWNER: it cannot enter or chmod
        os.chmod(work, 0o711)  # uid's dirs once they are uid's, yet must chdir to work before setuid
        for root, dirs, files in os.walk(work, topdown=False):
            for name in [os.path.join(root, n) for n in dirs + files] + [root]:
                os.chown(name, uid, uid)
    lim = req["limits"]

    def limits():
        resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
        resource.setrlimit(resource.RLIMIT_AS, (lim["memory_bytes"], lim["memory_bytes"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize_bytes"], lim["fsize_bytes"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    argv = [sys.executable, "-I", "-c", req["code"]] if req["language"] == "python" else ["bash", "-c", req["code"]]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work, "PWD": work}
    oom_before = _oom_count()
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=limits,
                            user=uid, group=uid, extra_groups=[] if uid is not None else None)
    try:
        proc.stdin.write(req["stdin"].encode())
        proc.stdin.close()
    except OSError:
        pass
    cap = req["max_output_bytes"]
    outs = {proc.stdout: Output(cap), proc.stderr: Output(cap)}
    sel = selectors.DefaultSelector()
    for pipe in outs:
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe, selectors.EVENT_READ)
    deadline, timed_out = started + req["timeout_s"], False
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(min(left, 0.5)):
            chunk = os.read(key.fileobj.fileno(), 1 << 16)
            if chunk:
                outs[key.fileobj].add(chunk)
            else:
                sel.unregister(key.fileobj)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    code = proc.wait()
    oom_after = _oom_count()
    oom = oom_before >= 0 and oom_after > oom_before
    duration = time.monotonic() - started
    if uid is None:  # not root in the container: no uid to clean after, the work dir at least
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    left = reset(uid) if uid is not None else ["runner not root: no reset"]
    out, err = outs[proc.stdout], outs[proc.stderr]
    (stdout, cut_out), (stderr, cut_err) = out.decode(), err.decode()
    print(json.dumps({"status": classify(code, timed_out, oom), "exit_code": code,
                      "stdout": stdout, "stderr": stderr, "truncated": cut_out or cut_err,
                      "duration_s": duration, "reset_left": left,
                      "info": {"stdout_bytes": out.total, "stderr_bytes": err.total}}))


def _oom_count():
    # OOM kills the container's memory cgroup counted (its cap is the container's memory limit;
    # one run per container at a time, so a change during a run is that run's); -1 if unreadable
    for path, key in (("/sys/fs/cgroup/memory.events", ("oom", "oom_kill")),
                      ("/sys/fs/cgroup/memory/memory.oom_control", ("oom_kill",))):
        try:
            with open(path) as f:
                fields = dict(line.split() for line in f.read().splitlines())
            return sum(int(fields.get(k, 0)) for k in key)
        except (OSError, ValueError):
            continue
    return -1


def _sysv_ids(uid):
    # (kind, id) of the SysV IPC objects uid owns; /proc/sysvipc columns: id 2nd, uid 8th (sem: 5th)
    found = []
    for kind in ("shm", "msg", "sem"):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            owner = {"shm": 7, "msg": 7, "sem": 4}[kind]
            if int(cols[owner]) == uid:
                found.append((kind, int(cols[1])))
    return found


SCRATCH = ("/tmp", "/dev/shm", "/dev/mqueue")


def _others():
    # processes in the container but init (PID 1) and this runner (zombies too, until init reaps them)
    import os
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]


def reset(uid):
    # Leave the container as the next run must find it: no process but init and this runner
    # (kill(-1) as root with CAP_KILL, repeated while a fork races it; this also frees the pids cap
    # a fork bomb filled), nothing in /tmp, /dev/shm and /dev/mqueue (removed by a child running as
    # uid: root here lacks CAP_DAC_OVERRIDE to enter uid's dirs), no SysV IPC object of uid.
    # Returns what is left of those ([] when the reset was verified).
    import os, signal, time
    deadline = time.monotonic() + 5
    while _others() and time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)  # every process in the container but init and us
        except OSError:
            pass
        time.sleep(0.005)
    if _others():
        return [f"pid {p} survived kill(-1)" for p in _others()]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

            def remove(path, depth=0):  # owner's files: a dir made unreadable is chmod-ed back first
                if os.path.isdir(path) and not os.path.islink(path):
                    try:
                        os.chmod(path, 0o700)
                    except OSError:
                        pass
                    for name in os.listdir(path):
                        remove(os.path.join(path, name), depth + 1)
                    os.rmdir(path)
                else:
                    os.unlink(path)

            for top in SCRATCH:
                for name in os.listdir(top) if os.path.isdir(top) else []:
                    try:
                        remove(os.path.join(top, name))
                    except (OSError, RecursionError):
                        pass
            ids = _sysv_ids(uid)
            if ids:
                import ctypes
                libc = ctypes.CDLL(None)
                for kind, ident in ids:  # IPC_RMID = 0
                    if kind == "sem":
                        libc.semctl(ident, 0, 0)
                    else:
                        getattr(libc, kind + "ctl")(ident, 0, None)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    left = [os.path.join(t, n) for t in SCRATCH if os.path.isdir(t) for n in os.listdir(t)]
    left += [f"pid {p}" for p in _others()] + [f"{k} {i}" for k, i in _sysv_ids(uid)]
    return left + ([f"reset child exit status {status}"] if status else [])


if sys.argv[1] == "--serve":  # a warm container's agent: one request per stdin line, a reply line each
    for line in sys.stdin:
        _main(line)
        sys.stdout.flush()
else:
    _main(sys.argv[1])
"""
).replace("from __future__ import annotations\n", "import sys\n", 1)


class _AgentGone(Exception):
    """The agent's stream ended (or failed) before a reply; the message is its stderr."""


class _Agent:
    """The runner serving one warm container (``RUNNER --serve``, started once with ``exec``): a
    request is a JSON line on its stdin, the reply a JSON line on its stdout. This skips the engine's
    ``exec`` (runc) and the runner's start-up on every run. The stream is Docker's multiplexed
    attach protocol: 8-byte frame headers (stream id, 3 zero bytes, big-endian size)."""

    def __init__(self, client, container) -> None:
        api = client.api
        cmd = ["python3", "-I", "-S", "-c", RUNNER, "--serve"]
        exec_id = api.exec_create(container.id, cmd, stdin=True, stdout=True, stderr=True, user="0")["Id"]
        self._io = api.exec_start(exec_id, socket=True)
        self._sock = getattr(self._io, "_sock", self._io)

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self._sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def call(self, body: str, timeout_s: float) -> tuple[bytes, bytes]:
        """Send one request; ``(reply line, stderr)``. Raises ``TimeoutError`` / ``_AgentGone``."""
        self._sock.settimeout(timeout_s)
        out, err = b"", b""
        try:
            self._sock.sendall(body.encode() + b"\n")
            while b"\n" not in out:
                header = self._read(8)
                data = self._read(int.from_bytes(header[4:], "big"))
                if header[0] == 2:
                    err += data
                else:
                    out += data
        except (EOFError, ConnectionError) as e:
            raise _AgentGone((err or repr(e).encode()).decode("utf-8", "replace")[-2000:]) from None
        return out.split(b"\n", 1)[0], err

    def close(self) -> None:
        for obj in (self._sock, self._io):
            try:
                obj.close()
            except Exception:
                pass


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o600
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class DockerSandbox:
    """Run code in Docker containers from a warm pool (see the module docstring).

    Args:
        max_concurrency: runs at once (more wait; the wait is in ``queue_s``).
        image: container image with ``python3`` (and ``bash`` for bash runs); default
            ``$CHATGYM_DOCKER_IMAGE``, else ``python:3.11-slim``.
        reuse: ``False``: a fresh container per run; ``True``: a container is reset and reused
            (module docstring: what it then shares between runs).
        pool_size: started containers kept ready (default ``max_concurrency``).
        max_output_bytes: cap per stream (bytes); beyond it ``truncated=True``.
        memory_limit_mb: the container's memory cap (cgroup, swap included), MiB; a run's
            ``memory_mb`` (RLIMIT_AS) should stay below it.
        cpus: CPU share per container; pids_limit: processes + threads per container.
        max_file_mb: RLIMIT_FSIZE (MiB). uid: the uid/gid programs run as.
        tmpfs_mb: size of the container's /tmp (a tmpfs holding the work dir), MiB.
        client: a ``docker.DockerClient`` (default ``docker.from_env()``).
        limiter: process-wide limiter (default ``global_limiter()``).

    Raises:
        ImportError: the docker SDK is missing (``pip install chatgym[docker]``).
        ValueError: a bad argument, naming it.
    """

    languages = ("python", "bash")

    def __init__(
        self,
        max_concurrency: int = 4,
        *,
        image: str | None = None,
        reuse: bool = False,
        pool_size: int | None = None,
        max_output_bytes: int = 64 * 1024,
        memory_limit_mb: int = 2048,
        cpus: float = 1.0,
        pids_limit: int = 64,
        max_file_mb: int = 64,
        uid: int = 65534,
        client=None,
        limiter: Limiter | None = None,
        tmpfs_mb: int = 256,
    ) -> None:
        for name, value in (("max_concurrency", max_concurrency), ("memory_limit_mb", memory_limit_mb),
                            ("pids_limit", pids_limit), ("max_file_mb", max_file_mb), ("uid", uid),
                            ("tmpfs_mb", tmpfs_mb)):  # fmt: skip
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if pool_size is not None and (not isinstance(pool_size, int) or pool_size < 0):
            raise ValueError(f"pool_size must be an int >= 0, got {pool_size!r}")
        if client is None:
            try:
                import docker
            except ImportError as e:
                raise ImportError("DockerSandbox needs the docker SDK: pip install 'chatgym[docker]'") from e
            client = docker.from_env()
        self.client = client
        self.image = image or os.environ.get("CHATGYM_DOCKER_IMAGE") or DEFAULT_IMAGE
        self.reuse = bool(reuse)
        self.max_concurrency = max_concurrency
        self.pool_size = max_concurrency if pool_size is None else pool_size
        self.max_output_bytes = max_output_bytes
        self.uid = uid
        self.max_file_mb = max_file_mb
        self.limiter = limiter
        self.create_kwargs = {
            "network_mode": "none",
            "mem_limit": f"{memory_limit_mb}m",
            "memswap_limit": f"{memory_limit_mb}m",
            "nano_cpus": int(cpus * 1e9),
            "pids_limit": pids_limit,
            "cap_drop": ["ALL"],
            "cap_add": ["SETUID", "SETGID", "CHOWN", "KILL"],
            "security_opt": ["no-new-privileges"],
            "tmpfs": {"/tmp": f"size={tmpfs_mb}m,mode=1777"},
            "labels": {LABEL: "1"},
            "detach": True,
            "auto_remove": False,
        }
        self._slots = SlotPool(max_concurrency)
        self._pool: list = []
        self._lock = threading.Lock()
        self._closed = False
        self._threads: set[threading.Thread] = set()
        self.isolation: dict = {}

    # ---- the pool ------------------------------------------------------------------------------

    def _new_container(self):
        c = self.client.containers.run(self.image, ["python3", "-I", "-S", "-c", INIT], **self.create_kwargs)
        if self.reuse:  # its agent, started now: off the run's path
            try:
                c._chatgym_agent = _Agent(self.client, c)
            except Exception:
                c.remove(force=True)
                raise
        return c

    @staticmethod
    def _remove(container) -> None:
        agent = getattr(container, "_chatgym_agent", None)
        if agent is not None:
            agent.close()
        container.remove(force=True)

    def _take(self):
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return self._new_container()

    def _give_back(self, container) -> bool:
        """Put a reset container back in the pool; False (caller removes it) if closed or full."""
        with self._lock:
            if self._closed or len(self._pool) >= self.pool_size:
                return False
            self._pool.append(container)
            return True

    def _retire(self, container) -> None:
        """Remove a used container and start its replacement (in a thread, off the run's path)."""
        try:
            self._remove(container)
        except Exception:
            pass
        if self._closed:
            return
        with self._lock:
            if len(self._pool) >= self.pool_size:
                return
        try:
            fresh = self._new_container()
        except Exception:
            return
        if not self._give_back(fresh):
            self._remove(fresh)

    def _in_background(self, fn, *args) -> None:
        t = threading.Thread(target=self._background, args=(fn, *args), daemon=True)
        with self._lock:
            self._threads.add(t)
        t.start()

    def _background(self, fn, *args) -> None:
        try:
            fn(*args)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    async def start(self) -> dict:
        """Start the warm pool. Returns the isolation report (``container``, ``network_isolated``,
        ``uid``/``uids``, ``image``, ``reuse``).

        Raises:
            docker.errors.APIError / ImageNotFound: the engine refused (no such image, engine gone).
        """

        def fill() -> None:
            while True:
                with self._lock:
                    if self._closed or len(self._pool) >= self.pool_size:
                        return
                c = self._new_container()
                if not self._give_back(c):
                    self._remove(c)
                    return

        await asyncio.to_thread(fill)
        self.isolation = {"container": True, "network_isolated": True, "uid": self.uid, "uids": [self.uid],
                          "image": self.image, "reuse": self.reuse}  # fmt: skip
        return dict(self.isolation)

    async def close(self) -> None:
        """Remove every pooled container, after waiting for the background removals/refills. Idempotent."""
        self._closed = True
        while True:
            with self._lock:
                threads = list(self._threads)
            if not threads:
                break
            for t in threads:
                await asyncio.to_thread(t.join)
        with self._lock:
            pool, self._pool = self._pool, []
        for c in pool:
            try:
                await asyncio.to_thread(self._remove, c)
            except Exception:  # already gone (the engine removed it)
                pass

    async def __aenter__(self) -> DockerSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- runs ----------------------------------------------------------------------------------

    async def run(
        self,
        code: str,
        language: str = "python",
        stdin: str = "",
        files: dict[str, str | bytes] | None = None,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
    ) -> ExecResult:
        """As :meth:`LocalSandbox.run`, in a container of the pool.

        Raises:
            TypeError / ValueError: a bad argument. RuntimeError: the sandbox was closed.
        """
        check_run_args(code, language, stdin, files, timeout_s, memory_mb, self.languages)
        if self._closed:
            raise RuntimeError("DockerSandbox is closed")
        packed = {p: b64 for p, _, b64 in (
            (p, k, v if k == "b" else base64.b64encode(v.encode()).decode())
            for p, k, v in wire.pack_files(files))}  # fmt: skip
        req = {
            "code": code, "language": language, "stdin": stdin, "files": packed, "timeout_s": float(timeout_s),
            "uid": self.uid, "max_output_bytes": self.max_output_bytes,
            "work_dir": f"/tmp/chatgym-work-{secrets.token_hex(8)}",
            "limits": {"cpu_s": int(timeout_s) + 1, "memory_bytes": memory_mb << 20,
                       "fsize_bytes": self.max_file_mb << 20},
        }  # fmt: skip
        limiter = self.limiter or global_limiter()
        t0 = time.monotonic()
        async with limiter.hold():
            slot = await self._slots.acquire()
            queue_s = time.monotonic() - t0
            try:
                return await self._run_in_container(req, timeout_s, queue_s)
            finally:
                self._slots.release(slot)

    async def _run_in_container(self, req: dict, timeout_s: float, queue_s: float) -> ExecResult:
        try:
            container = await asyncio.to_thread(self._take)
        except Exception as e:  # the engine refused (no image, engine gone): the sandbox's failure
            return ExecResult("killed", stderr=f"chatgym sandbox: no container: {type(e).__name__}: {e}\n",
                              queue_s=queue_s, info={"internal": True})  # fmt: skip
        reusable = False
        try:
            body = json.dumps(req)
            agent = getattr(container, "_chatgym_agent", None)
            try:
                if agent is not None:  # warm: the container's agent (no exec per run)
                    exit_code = "agent"
                    try:
                        out, err = await asyncio.to_thread(agent.call, body, timeout_s + SLACK_S)
                    except _AgentGone as gone:
                        out, err = b"", str(gone).encode()
                else:
                    if len(body.encode()) <= INLINE_MAX:
                        arg = body  # one engine round trip fewer than put_archive (~0.1-0.2 s here)
                    else:
                        data = _tar(posixpath.basename(REQUEST_PATH), body.encode())
                        await asyncio.to_thread(container.put_archive, posixpath.dirname(REQUEST_PATH), data)
                        arg = REQUEST_PATH
                    cmd = ["python3", "-I", "-S", "-c", RUNNER, arg]
                    job = asyncio.to_thread(container.exec_run, cmd, user="0", demux=True)
                    exit_code, (out, err) = await asyncio.wait_for(job, timeout_s + SLACK_S)
            except (asyncio.TimeoutError, TimeoutError):
                return ExecResult("timeout", stderr="chatgym sandbox: the container did not answer\n",
                                  queue_s=queue_s, info={"internal": True})  # fmt: skip
            lines = (out or b"").decode("utf-8", "replace").strip().splitlines()
            try:
                reply = json.loads(lines[-1])
            except (IndexError, ValueError):
                why = (err or b"").decode("utf-8", "replace")[-2000:]
                return ExecResult("killed", stderr=f"chatgym sandbox: the runner failed (exit {exit_code}): {why}\n",
                                  queue_s=queue_s, info={"internal": True})  # fmt: skip
            reusable = self.reuse and reply.get("reset_left") == []
            info = (
                reply["info"]
                if reply.get("reset_left") == []
                else dict(reply["info"], reset_left=reply["reset_left"])
            )
            return ExecResult(reply["status"], reply["stdout"], reply["stderr"], reply["exit_code"],
                              reply["duration_s"], reply["truncated"], queue_s, info)  # fmt: skip
        except Exception as e:  # the engine failed mid-run (container gone, engine stopped)
            return ExecResult("killed", stderr=f"chatgym sandbox: the engine failed: {type(e).__name__}: {e}\n",
                              queue_s=queue_s, info={"internal": True})  # fmt: skip
        finally:
            if not (reusable and self._give_back(container)):
                self._in_background(self._retire, container)

    async def open_session(self, memory_mb: int = 1024):
        """Not supported: sessions need a long-lived interpreter per episode (use LocalSandbox /
        BwrapSandbox, or a SandboxFusion service's /run_jupyter)."""
        raise NotImplementedError("DockerSandbox has no sessions; use BwrapSandbox or SandboxFusionSandbox")
