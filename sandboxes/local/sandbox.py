"""``LocalSandbox``: run untrusted Python or bash in local processes, forked from a warm zygote.

Every run gets a fresh process (forked from one long-lived helper interpreter, see ``zygote.py``) in a
fresh work dir, as its own session/process group, with rlimits, an allowlisted environment and,
where the OS allows, its own unprivileged uid and an empty network namespace. Forking a warm
interpreter skips the ~10-25 ms start-up of ``python3`` and the imports: a ``print(1)`` round trip
took 2.5 ms on 2 quiet cores (``benchmarks/sandbox_latency.py``). Linux only.

What is isolated:

======================================  ==========================  ===============================
                                         root (CAP_SYS_ADMIN,        not root (rlimits + process
                                         CAP_SETUID): the default    group only)
======================================  ==========================  ===============================
wall-clock limit, whole tree killed      yes: killpg, and on a       killpg only: a child that
                                         timeout every process of    setsid()s away survives
                                         the run's own uid
CPU time, file size, open files, core    yes (rlimits)               yes (rlimits)
dumps
memory (``memory_mb``), ``oom`` status   a memory cgroup per run     RLIMIT_AS: an allocation it
                                         (v1 or v2; children         refuses is NOT observable
                                         included): ``oom`` exactly  (the program decides how it
                                         when its OOM counter grew   ends: error / killed, never
                                                                     oom)
number of processes (fork bombs)         yes: RLIMIT_NPROC per       weak: RLIMIT_NPROC counts all
                                         sandbox uid                 processes of the host user
stdout/stderr size                       capped, ``truncated=True``  same
environment (API keys, tokens)           allowlist only              allowlist only
network                                  none: empty net namespace   NOT isolated
                                         (no loopback, no host
                                         127.0.0.1, no abstract
                                         unix sockets)
host files                               read: world-readable files  everything the host user can
                                         only; /root and /home       read and write
                                         hidden. write: the work dir
                                         and the run's own /tmp,
                                         /var/tmp, /dev/shm,
                                         /run/lock only
scratch dirs of concurrent runs          each run and session its    shared: the host's /tmp
                                         own (mount namespace per    (``TMPDIR`` is the run's
                                         child), removed with its    work dir)
                                         work dir
other processes                          invisible (/proc hidepid),  visible; signals/ptrace to the
                                         cannot be signalled         host user's processes possible
SysV IPC / POSIX message queues          private namespace           shared
kernel attack surface, CPU/disk          NOT isolated (no seccomp,   NOT isolated
bandwidth, time/randomness               no CPU/IO cgroups)
======================================  ==========================  ===============================

As root without CAP_SYS_ADMIN (a default Docker container) the uid rows of the first column hold
and the namespace rows (network, files, /proc, IPC) those of the second; ``isolation`` / the
warning at start say which. Each run and each session gets its own empty /tmp, /var/tmp, /dev/shm
and /run/lock (``isolation.enter_scratch``: directories of the zygote's private /tmp bound over
them in a mount namespace of the child's own; a session keeps its /tmp across fresh interpreters,
like its work dir): concurrent runs cannot see, block or talk through each other's files, and the
zygote removes them with the work dir when the run ends or the session closes, so nothing carries
over. Without a mount namespace (not root, or no CAP_SYS_ADMIN) they share the host's /tmp;
``isolation["private_tmp"]`` says which. A process that leaves the run's process
group *and* closes its stdout/stderr outlives a run that ends normally until the next run on that
uid starts (it kills every process of its uid first) or the sandbox closes. Python runs see only
the stdlib (``-I -S``) unless ``site_packages=True``. For stronger isolation (seccomp, a PID
namespace, cgroup caps) use a container backend.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence

from chatgym.sandboxes.base import LANGUAGES, ExecResult, check_memory_mb, check_run_args
from chatgym.sandboxes.limits import Limiter, global_limiter
from chatgym.sandboxes.local import wire
from chatgym.sandboxes.local.client import SANDBOX_DIR, ZygoteClient, ZygoteDied
from chatgym.sandboxes.local.session import LocalSession
from chatgym.sandboxes.slots import SlotPool

# Pure-Python or already-loaded modules that model-written code imports most. Each extension module
# (hashlib, decimal, datetime, ...) makes every fork dearer (~0.1-0.2 ms for five of them, measured),
# so those are left to the few runs that import them.
DEFAULT_PRELOAD = (
    "abc", "bisect", "collections", "copy", "dataclasses", "enum", "functools", "heapq", "io",
    "itertools", "json", "linecache", "math", "numbers", "operator", "random", "re", "string",
    "struct", "textwrap", "time", "traceback", "typing",
)  # fmt: skip
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INHERITED_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
BACKSTOP_S = 30.0  # extra seconds the parent waits beyond timeout_s before giving up on the zygote
_warned: set[str] = set()


def _warn_once(note: str) -> None:
    if note not in _warned:
        _warned.add(note)
        warnings.warn(f"LocalSandbox: {note}", RuntimeWarning, stacklevel=3)


class LocalSandbox:
    """Run code in local processes with limits (see the module docstring for what is isolated).

    Args:
        max_concurrency: runs (and session calls) executing at once; more wait, and
            ``ExecResult.queue_s`` reports the wait in seconds.
        max_output_bytes: cap per stream (stdout, stderr) in bytes; beyond it output is dropped and
            ``truncated=True``; the text is cut on a character boundary (``outputs.decode_capped``).
        max_processes: RLIMIT_NPROC per run (processes + threads of the sandbox uid).
        max_open_files: RLIMIT_NOFILE per process.
        max_file_mb: RLIMIT_FSIZE, the largest file a run may write, in MiB.
        network: False (default) cuts the network where namespaces are available.
        drop_privileges: run children as unprivileged sandbox uids; ``None`` = when running as root;
            ``True`` fails if impossible.
        memory_cgroup: put each run (and session) in a memory cgroup of ``memory_mb`` (``memcg.py``),
            which is what makes ``oom`` observable; ``None`` = where possible (root, a writable
            cgroup fs), ``True`` fails at start if impossible, ``False`` = RLIMIT_AS only.
        uid_range: ``[lo, hi)`` uids for sandboxes (default 60600-61183: unused by Debian/systemd
            allocation); one per slot and one per open session, claimed with file locks in /run.
        tmpfs_mb: size of the zygote's private /tmp, in MiB: it holds every run's and session's
            work dir and own scratch dirs (/tmp, ...), so concurrent runs share this size.
        hidden_paths: host directories replaced by an empty tmpfs for children (the interpreter's
            own prefix is bound back read-only).
        env: extra environment variables for children; ``inherit_env`` names host variables copied
            if set. Nothing else from the host environment reaches a child.
        python: interpreter for the zygote (default: this one); ``site_packages`` lets runs import
            its installed packages (default: stdlib only); ``preload``: modules imported once in the
            zygote so runs get them for free.
        limiter: the :class:`~chatgym.sandboxes.limits.Limiter` every run passes first (default:
            the process-wide ``global_limiter()``, shared by all sandboxes); its wait is part of
            ``queue_s`` and reported as ``info["limiter_wait_s"]``.

    Raises:
        ValueError / TypeError: a bad argument, naming it.
    """

    languages = LANGUAGES

    def __init__(
        self,
        max_concurrency: int = 4,
        *,
        max_output_bytes: int = 64 * 1024,
        max_processes: int = 64,
        max_open_files: int = 256,
        max_file_mb: int = 64,
        network: bool = False,
        drop_privileges: bool | None = None,
        memory_cgroup: bool | None = None,
        uid_range: tuple[int, int] = (60600, 61184),
        tmpfs_mb: int = 1024,
        hidden_paths: Sequence[str] = ("/root", "/home"),
        env: Mapping[str, str] | None = None,
        inherit_env: Sequence[str] = INHERITED_ENV,
        python: str | None = None,
        site_packages: bool = False,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        limiter: Limiter | None = None,
    ) -> None:
        for name, value, lo in (
            ("max_concurrency", max_concurrency, 1),
            ("max_output_bytes", max_output_bytes, 0),
            ("max_processes", max_processes, 1),
            ("max_open_files", max_open_files, 8),
            ("max_file_mb", max_file_mb, 1),
            ("tmpfs_mb", tmpfs_mb, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
        lo_uid, hi_uid = uid_range
        if not (0 < lo_uid < hi_uid) or hi_uid - lo_uid < max_concurrency:
            raise ValueError(f"uid_range must be [lo, hi) with 0 < lo and room for {max_concurrency} uids")
        self.max_concurrency = max_concurrency
        self.max_output_bytes = max_output_bytes
        self.limiter = limiter
        python = python or sys.executable
        child_env = {"PATH": f"{os.path.dirname(python)}:{SYSTEM_PATH}", "LANG": "C.UTF-8"}
        child_env.update({k: os.environ[k] for k in inherit_env if k in os.environ})
        for k, v in (env or {}).items():
            if not isinstance(k, str) or not isinstance(v, str) or "=" in k or not k:
                raise ValueError(f"env: entries must be str NAME -> str value, got {k!r}: {v!r}")
            child_env[k] = v
        self._config = {
            "drop_privileges": drop_privileges,
            "memory_cgroup": memory_cgroup,
            "uid_range": [lo_uid, hi_uid],
            "gid": 65534,
            "slots": max_concurrency,
            "spares": min(max_concurrency, 4),
            "network": bool(network),
            "tmpfs_mb": tmpfs_mb,
            "hidden_paths": list(hidden_paths),
            "preload": list(preload),
            "max_processes": max_processes,
            "max_open_files": max_open_files,
            "max_file_bytes": max_file_mb << 20,
            "bash": "/bin/bash" if os.path.exists("/bin/bash") else "/usr/bin/bash",
        }
        self._argv = [python, "-I"] if site_packages else [python, "-I", "-S"]
        self._zygote_env = child_env  # children inherit it; each adds only HOME, TMPDIR and PWD
        self._sandbox_dir = SANDBOX_DIR
        self._slots = SlotPool(max_concurrency)
        self._client: ZygoteClient | None = None
        self._start_lock = threading.Lock()
        self._closed = False

    # ---- life cycle ----------------------------------------------------------------------------

    async def start(self) -> dict:
        """Start the zygote now (otherwise the first run does). Returns what isolation it got:
        ``uids``, ``network_isolated``, ``mount_ns``, ``private_tmp`` (each run its own /tmp),
        ``proc_hidden``, ``memory_cgroup`` (1 or 2: the cgroup version of the per-run memory cgroups;
        0: none, RLIMIT_AS), ``notes``."""
        return (await self._ensure_client()).info

    @property
    def isolation(self) -> dict:
        """The zygote's isolation report (empty before it started)."""
        return dict(self._client.info) if self._client else {}

    async def _ensure_client(self) -> ZygoteClient:
        client = self._client
        if client is not None and not client.dead and client.owner_pid == os.getpid():
            return client
        if self._closed:
            raise RuntimeError("LocalSandbox is closed")
        return await asyncio.to_thread(self._start_blocking)

    def _start_blocking(self) -> ZygoteClient:
        with self._start_lock:
            if self._closed:
                raise RuntimeError("LocalSandbox is closed")
            if self._client is not None and not self._client.dead and self._client.owner_pid == os.getpid():
                return self._client
            if self._client is not None and self._client.owner_pid == os.getpid():
                self._client.close()
            elif self._client is not None:
                self._client.abandon()  # a forked copy of the host: the zygote is the original's
            client = ZygoteClient(self._config, self._argv, self._zygote_env, self._sandbox_dir)
            client.start()
            for note in client.info.get("notes", []):
                _warn_once(note)
            self._client = client
            # A sandbox dropped without close() still stops its zygote (without blocking the GC).
            weakref.finalize(self, client.close_nowait)
            return client

    async def close(self) -> None:
        """Stop the zygote (killing any run still going) and release its uids. Idempotent."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.close)

    async def __aenter__(self) -> LocalSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- running code --------------------------------------------------------------------------

    async def run(
        self,
        code: str,
        language: str = "python",
        stdin: str = "",
        files: dict[str, str | bytes] | None = None,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
    ) -> ExecResult:
        """Run ``code`` once in a fresh process and work dir.

        Args:
            code: Python source (run as ``__main__``, file name ``<solution>``) or a bash script.
            language: ``"python"`` or ``"bash"``.
            stdin: text fed to standard input (UTF-8).
            files: relative path -> contents, written into the work dir (the cwd) before the run;
                Python can import them (the work dir is on ``sys.path``).
            timeout_s: wall-clock limit in seconds, from the moment the process starts (queueing
                excluded); the CPU limit is ``ceil(timeout_s) + 1`` seconds.
            memory_mb: memory limit in MiB, the run's processes together: the limit of its memory
                cgroup (resident memory, page cache and tmpfs files included; pages shared with
                the zygote are not), or without cgroups (``isolation["memory_cgroup"] == 0``) the
                address-space limit (RLIMIT_AS) of each process, which for Python includes the
                forked interpreter's ~30 MiB.

        Returns:
            ExecResult. ``status``: ok / error (non-zero exit, e.g. an exception: traceback in
            stderr) / timeout / oom (the run's memory cgroup counted an OOM: a process of the run
            was killed for memory, whatever the exit code; never decided from printed text, and
            never reported without a cgroup) / killed (other signal).
            ``info``: ``cpu_s``, ``max_rss_kb``, ``stdout_bytes``/``stderr_bytes`` (sizes before the
            cap), and ``internal=True`` when the failure was the sandbox's, not the code's.

        Raises:
            TypeError / ValueError: a bad argument (naming it). Problems of the code itself never
            raise; they are reported in the result.
            RuntimeError: the sandbox was closed.
        """
        check_run_args(code, language, stdin, files, timeout_s, memory_mb)
        msg = {
            "op": "run", "code": code, "language": language, "stdin": stdin,
            "files": wire.pack_files(files), "timeout_s": float(timeout_s), "memory_mb": int(memory_mb),
            "max_output_bytes": self.max_output_bytes,
        }  # fmt: skip
        return await self._request(msg, timeout_s)

    async def _request(self, msg: dict, timeout_s: float, client: ZygoteClient | None = None) -> ExecResult:
        """Send one request under the limiter and the concurrency limit; the reply as an ExecResult."""
        limiter = self.limiter or global_limiter()
        if limiter.unlimited:
            return await self._request_slot(msg, timeout_s, client)
        async with limiter.hold() as waited:
            res = await self._request_slot(msg, timeout_s, client)
        res.queue_s += waited()
        res.info["limiter_wait_s"] = waited()
        return res

    async def _request_slot(self, msg: dict, timeout_s: float, client: ZygoteClient | None) -> ExecResult:
        client = client or await self._ensure_client()
        t0 = time.monotonic()
        slot = await self._slots.acquire()
        queue_s = time.monotonic() - t0
        msg = dict(msg, id=client.next_id(), slot=slot)

        def release(_fut: object) -> None:
            self._slots.release(slot)

        try:
            fut = client.submit(msg)
        except ZygoteDied as e:
            release(None)
            return died_result(e, queue_s)
        fut.add_done_callback(_consume)
        # The slot (= uid) is released only when the zygote reports the run over, even if we stop
        # waiting: reusing the uid earlier could let the old run's clean-up kill the new run.
        fut.add_done_callback(release)
        try:
            done, _ = await asyncio.wait({fut}, timeout=timeout_s + BACKSTOP_S)
        except asyncio.CancelledError:
            client.send({"op": "kill", "id": msg["id"]})
            raise
        if not done:
            client.send({"op": "kill", "id": msg["id"]})
            return ExecResult("timeout", stderr="chatgym sandbox: no reply from the zygote\n",
                              queue_s=queue_s, info={"internal": True})  # fmt: skip
        if fut.exception() is not None:
            return died_result(fut.exception(), queue_s)
        return to_result(fut.result(), queue_s)

    async def open_session(self, memory_mb: int = 1024) -> LocalSession:
        """A stateful Python interpreter kept across calls (see ``LocalSession``)."""
        check_memory_mb(memory_mb)
        return await LocalSession.open(self, memory_mb)


def _consume(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # mark retrieved: a zygote death while nobody waits is not an error to log


def died_result(exc: BaseException, queue_s: float) -> ExecResult:
    return ExecResult("killed", stderr=f"chatgym sandbox: {exc}\n", queue_s=queue_s, info={"internal": True})


def to_result(reply: dict, queue_s: float) -> ExecResult:
    return ExecResult(
        status=reply["status"],
        stdout=reply.get("stdout", ""),
        stderr=reply.get("stderr", ""),
        exit_code=reply.get("exit_code"),
        duration_s=reply.get("duration_s", 0.0),
        truncated=reply.get("truncated", False),
        queue_s=queue_s,
        info=reply.get("info", {}),
    )
