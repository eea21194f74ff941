"""``DockerSandbox``: each run in a fresh, pre-started Docker container (the ``docker`` extra).

A warm pool of ``pool_size`` containers (``sleep infinity``, no network, memory/CPU/pids caps, all
capabilities dropped but the four the runner needs, ``no-new-privileges``) is kept started. A run
takes one, copies the request in (``put_archive``: code, stdin, files as one JSON file), executes
:data:`RUNNER` in it, and the container is then removed while a replacement starts in the background.
So nothing of one run (processes, files) reaches the next, and the start-up cost is off the run's path.

Inside, the runner (root in the container) makes a work dir in /tmp (a ``tmpfs_mb`` tmpfs), drops the program to uid/gid 65534 in
its own session with rlimits (address space = ``memory_mb``, CPU, file size, open files, no core),
enforces the wall-clock limit with ``killpg``, caps each stream at ``max_output_bytes`` (counting
the rest) and prints one JSON result line. The status rules are ``outputs.classify``, the same as
the local backend's. A run whose runner does not answer within ``timeout_s + 30`` s is killed with
its container. Needs a Docker engine (``docker.from_env()``); the image needs ``python3`` and,
for bash runs, ``bash``.
"""

from __future__ import annotations

import asyncio
import io
import json
import posixpath
import secrets
import tarfile
import threading
import time
from pathlib import Path

from . import wire
from .base import ExecResult
from .limits import Limiter, global_limiter
from .local import check_files, check_timeout
from .slots import SlotPool

REQUEST_PATH = "/chatgym-request.json"  # on the container's own file system: `put_archive`
# cannot write into a tmpfs mount, and /tmp is one
SLACK_S = 30.0
LABEL = "chatgym.sandbox"

RUNNER = (
    Path(__file__).with_name("outputs.py").read_text(encoding="utf-8")
    + """

def _main(path):
    import base64, json, os, resource, selectors, signal, subprocess, sys, time
    with open(path) as f:
        req = json.load(f)
    os.unlink(path)
    work = req["work_dir"]
    os.makedirs(work, mode=0o700)
    for rel, b64 in req["files"].items():
        dest = os.path.join(work, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(base64.b64decode(b64))
    uid = req["uid"] if os.getuid() == 0 else None
    if uid is not None:
        for root, dirs, files in os.walk(work):
            for name in [root] + [os.path.join(root, n) for n in dirs + files]:
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
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    out, err = outs[proc.stdout], outs[proc.stderr]
    print(json.dumps({"status": classify(code, timed_out, bytes(err.data[-4096:])), "exit_code": code,
                      "stdout": out.text(), "stderr": err.text(), "truncated": out.truncated or err.truncated,
                      "duration_s": time.monotonic() - started,
                      "info": {"stdout_bytes": out.total, "stderr_bytes": err.total}}))


_main(sys.argv[1])
"""
).replace("from __future__ import annotations\n", "import sys\n", 1)


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o600
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class DockerSandbox:
    """Run code in fresh Docker containers from a warm pool (see the module docstring).

    Args:
        max_concurrency: runs at once (more wait; the wait is in ``queue_s``).
        image: container image with ``python3`` (and ``bash`` for bash runs).
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
        image: str = "python:3.11-slim",
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
                            ("pids_limit", pids_limit), ("max_file_mb", max_file_mb)):  # fmt: skip
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if client is None:
            try:
                import docker
            except ImportError as e:
                raise ImportError("DockerSandbox needs the docker SDK: pip install 'chatgym[docker]'") from e
            client = docker.from_env()
        self.client = client
        self.image = image
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
        self.isolation: dict = {}

    # ---- the pool ------------------------------------------------------------------------------

    def _new_container(self):
        return self.client.containers.run(self.image, ["sleep", "infinity"], **self.create_kwargs)

    def _take(self):
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return self._new_container()

    def _retire(self, container) -> None:
        """Remove a used container and start its replacement (in a thread, off the run's path)."""
        try:
            container.remove(force=True)
        except Exception:
            pass
        if self._closed:
            return
        try:
            fresh = self._new_container()
        except Exception:
            return
        with self._lock:
            if self._closed or len(self._pool) >= self.pool_size:
                keep = False
            else:
                self._pool.append(fresh)
                keep = True
        if not keep:
            fresh.remove(force=True)

    async def start(self) -> dict:
        """Start the warm pool. Returns the isolation report."""

        def fill() -> None:
            while True:
                with self._lock:
                    if self._closed or len(self._pool) >= self.pool_size:
                        return
                c = self._new_container()
                with self._lock:
                    self._pool.append(c)

        await asyncio.to_thread(fill)
        self.isolation = {"container": True, "network_isolated": True, "uid": self.uid, "image": self.image}
        return dict(self.isolation)

    async def close(self) -> None:
        """Remove every pooled container. Idempotent."""
        self._closed = True
        with self._lock:
            pool, self._pool = self._pool, []
        for c in pool:
            await asyncio.to_thread(c.remove, force=True)

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
        """As :meth:`LocalSandbox.run`, in a fresh container.

        Raises:
            TypeError / ValueError: a bad argument. RuntimeError: the sandbox was closed.
        """
        if not isinstance(code, str):
            raise TypeError(f"code must be str, got {type(code).__name__}")
        if language not in self.languages:
            raise ValueError(f"language must be one of {self.languages}, got {language!r}")
        if not isinstance(stdin, str):
            raise TypeError(f"stdin must be str, got {type(stdin).__name__}")
        check_files(files)
        check_timeout(timeout_s)
        if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < 16:
            raise ValueError(f"memory_mb must be an int >= 16 (MiB), got {memory_mb!r}")
        if self._closed:
            raise RuntimeError("DockerSandbox is closed")
        packed = {p: b64 for p, _, b64 in (
            (p, k, v if k == "b" else __import__("base64").b64encode(v.encode()).decode())
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
        try:
            data = _tar(posixpath.basename(REQUEST_PATH), json.dumps(req).encode())
            await asyncio.to_thread(container.put_archive, posixpath.dirname(REQUEST_PATH), data)
            cmd = ["python3", "-I", "-S", "-c", RUNNER, REQUEST_PATH]
            job = asyncio.to_thread(container.exec_run, cmd, user="0", demux=True)
            try:
                exit_code, (out, err) = await asyncio.wait_for(job, timeout_s + SLACK_S)
            except asyncio.TimeoutError:
                return ExecResult("timeout", stderr="chatgym sandbox: the container did not answer\n",
                                  queue_s=queue_s, info={"internal": True})  # fmt: skip
            lines = (out or b"").decode("utf-8", "replace").strip().splitlines()
            try:
                reply = json.loads(lines[-1])
            except (IndexError, ValueError):
                why = (err or b"").decode("utf-8", "replace")[-2000:]
                return ExecResult("killed", stderr=f"chatgym sandbox: the runner failed (exit {exit_code}): {why}\n",
                                  queue_s=queue_s, info={"internal": True})  # fmt: skip
            return ExecResult(reply["status"], reply["stdout"], reply["stderr"], reply["exit_code"],
                              reply["duration_s"], reply["truncated"], queue_s, reply["info"])  # fmt: skip
        finally:
            threading.Thread(target=self._retire, args=(container,), daemon=True).start()

    async def open_session(self, memory_mb: int = 1024):
        """Not supported: sessions need a long-lived interpreter per episode (use LocalSandbox /
        BwrapSandbox, or a SandboxFusion service's /run_jupyter)."""
        raise NotImplementedError("DockerSandbox has no sessions; use BwrapSandbox or SandboxFusionSandbox")
