"""The parent's end of the zygote: start it, send requests, route replies to awaiting coroutines.

A reader thread owns the socket's read side (so replies flow no matter which event loop, or none,
is running) and resolves each request's future on the loop that created it. The zygote is spawned
from that thread, so its ``PR_SET_PDEATHSIG`` fires exactly when the reader, i.e. this connection,
goes away.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import socket
import subprocess
import threading

from chatgym.sandboxes.local import wire

SANDBOX_DIR = os.path.dirname(os.path.abspath(__file__))
# Import the zygote's modules as a private package so they never shadow a user's ``wire.py``/``child.py``.
BOOTSTRAP = (
    "import sys, types; p = types.ModuleType('_chatgym_sandbox'); p.__path__ = [sys.argv[1]]; "
    "sys.modules['_chatgym_sandbox'] = p; from _chatgym_sandbox import zygote; zygote.main(int(sys.argv[2]))"
)
START_TIMEOUT_S = 60.0


class ZygoteDied(RuntimeError):
    """The zygote exited (or could not start); pending runs cannot complete."""


class ZygoteClient:
    """One zygote process and the socket to it. Thread-safe; usable from any event loop.

    Args:
        config: the ``config`` frame (see ``LocalSandbox._config``).
        argv_prefix: interpreter command, e.g. ``[python, "-I", "-S"]``.
        env: the zygote's whole environment (an allowlist; nothing else reaches it or its children).
        sandbox_dir: where the zygote finds this package's modules (its own view of the file system).
    """

    def __init__(
        self, config: dict, argv_prefix: list[str], env: dict[str, str], sandbox_dir: str = SANDBOX_DIR
    ) -> None:
        self._config = config
        self._argv = [*argv_prefix, "-c", BOOTSTRAP, sandbox_dir]
        self._env = env
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ready = threading.Event()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.dead = False
        self.info: dict = {}
        self.owner_pid = os.getpid()  # after a fork of the host process, the copy starts its own zygote

    # ---- life cycle ----------------------------------------------------------------------------

    def start(self) -> dict:
        """Start the zygote and wait for its ``ready`` frame (blocking). Returns that frame.

        Raises:
            ZygoteDied: it exited or did not answer within ``START_TIMEOUT_S`` seconds.
        """
        self._thread = threading.Thread(target=self._run, name="chatgym-sandbox-reader", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._error is not None or self.dead:
            self.close()
            raise ZygoteDied(f"sandbox zygote failed to start: {self._error or 'no ready frame'}")
        return self.info

    def _run(self) -> None:
        try:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            with child:
                self._proc = subprocess.Popen(
                    [*self._argv, str(child.fileno())],
                    pass_fds=(child.fileno(),),
                    env=self._env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,  # terminal signals (Ctrl-C) go to us, not to the zygote
                )
            self._sock = parent
            self._send(dict(self._config, op="config", pdeathsig=True))
            reader = parent.makefile("rb")
            first = wire.read_frame(reader)
            if not first or first.get("op") != "ready":
                raise ZygoteDied(f"unexpected first frame {first!r}")
            self.info = first
            self._ready.set()
            while (msg := wire.read_frame(reader)) is not None:
                self._deliver(msg)
        except (OSError, ValueError) as e:
            self._error = e
        finally:
            self.dead = True
            self._ready.set()
            self._fail_pending()
            self._reap()

    def _reap(self) -> None:
        """The stream ended: the zygote is exiting (or broken). Collect it so no zombie stays."""
        if self._proc is None:
            return
        try:
            self._proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _deliver(self, msg: dict) -> None:
        with self._lock:
            entry = self._pending.pop(msg.get("id"), None)
        if entry is None:
            return  # its caller gave up (cancelled); nothing waits for it
        loop, fut = entry
        try:
            loop.call_soon_threadsafe(_resolve, fut, msg, None)
        except RuntimeError:
            pass  # that loop is closed

    def _fail_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for loop, fut in pending.values():
            try:
                loop.call_soon_threadsafe(_resolve, fut, None, ZygoteDied("the sandbox zygote exited"))
            except RuntimeError:
                pass

    def close(self, timeout_s: float = 5.0) -> None:
        """Ask the zygote to stop, wait up to ``timeout_s`` seconds, then kill it (blocking)."""
        proc = self._proc
        try:
            if self._sock is not None and not self.dead:
                self._send({"op": "shutdown"})
        except OSError:
            pass
        if proc is not None:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._sock is not None:
            self._sock.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        base = self.info.get("work_base")
        if base and not self.info.get("mount_ns"):  # backstop if the zygote was killed mid-run
            shutil.rmtree(base, ignore_errors=True)
        self.dead = True

    def abandon(self) -> None:
        """In a forked copy of the host process: drop our copy of the socket, leave the zygote be."""
        if self._sock is not None:
            self._sock.close()  # closes only this process's fd; the original keeps its connection
        self.dead = True

    def close_nowait(self) -> None:
        """Ask the zygote to stop without waiting (for finalizers); the reader thread reaps it."""
        if self._sock is not None and not self.dead:
            self.send({"op": "shutdown"})

    # ---- requests ------------------------------------------------------------------------------

    def next_id(self) -> int:
        return next(self._ids)

    def submit(self, msg: dict) -> asyncio.Future:
        """Send ``msg`` (which has an ``id``) and return a future for its reply on the running loop.

        Raises:
            ZygoteDied: the zygote is gone.
        """
        fut = asyncio.get_running_loop().create_future()
        with self._lock:
            if self.dead:
                raise ZygoteDied("the sandbox zygote exited")
            self._pending[msg["id"]] = (asyncio.get_running_loop(), fut)
        try:
            self._send(msg)
        except OSError as e:
            with self._lock:
                self._pending.pop(msg["id"], None)
            raise ZygoteDied(f"the sandbox zygote is unreachable: {e}") from e
        return fut

    def forget(self, req_id: int) -> None:
        with self._lock:
            self._pending.pop(req_id, None)

    def send(self, msg: dict) -> None:
        """Fire-and-forget; errors are ignored (a dead zygote has nothing left to stop)."""
        try:
            self._send(msg)
        except OSError:
            pass

    def _send(self, msg: dict) -> None:
        assert self._sock is not None
        data = wire.encode(msg)
        with self._send_lock:
            self._sock.sendall(data)


def _resolve(fut: asyncio.Future, msg: dict | None, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(msg)
