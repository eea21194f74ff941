"""The sandbox contract: run untrusted code with limits and report what happened.

Every backend (local processes, bubblewrap, Docker, a SandboxFusion service) implements
:class:`Sandbox`; envs depend only on this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

Status = Literal["ok", "error", "timeout", "oom", "killed"]


@dataclass
class ExecResult:
    """Outcome of one execution.

    Attributes:
        status: ``ok`` (exit code 0), ``error`` (non-zero exit), ``timeout`` (wall or CPU limit hit),
            ``oom`` (memory limit hit), ``killed`` (ended by a signal for another reason).
        stdout, stderr: decoded text (UTF-8, invalid bytes replaced), each cut to the output limit.
        exit_code: the process's exit code, or ``-signal`` when killed by a signal; None if it never ran.
        duration_s: wall-clock seconds of the execution (not counting queueing).
        truncated: True when stdout or stderr was cut at the output limit.
        queue_s: seconds spent waiting before the execution started: the process-wide limiter
            (``limits.py``; its part is also in ``info["limiter_wait_s"]``) and the backend's own slots.
    """

    status: Status
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration_s: float = 0.0
    truncated: bool = False
    queue_s: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@runtime_checkable
class Session(Protocol):
    """A stateful interpreter kept across calls within one episode (REPL-style)."""

    async def run(self, code: str, timeout_s: float = 10.0) -> ExecResult: ...

    async def close(self) -> None: ...


@runtime_checkable
class Sandbox(Protocol):
    """Runs code in isolation. ``language`` is ``"python"`` or ``"bash"``.

    ``files`` maps relative paths to contents written into the fresh working directory before the
    run. ``timeout_s`` is wall-clock seconds; ``memory_mb`` is the address-space/memory cap in MiB.
    """

    async def run(
        self,
        code: str,
        language: str = "python",
        stdin: str = "",
        files: dict[str, str | bytes] | None = None,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
    ) -> ExecResult: ...

    async def open_session(self, memory_mb: int = 1024) -> Session: ...

    async def close(self) -> None: ...
