"""The sandbox contract: run untrusted code with limits and report what happened.

Every backend (local processes, bubblewrap, Docker, a SandboxFusion service) implements
:class:`Sandbox`; envs depend only on this module.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Status = Literal["ok", "error", "timeout", "oom", "killed"]
LANGUAGES = ("python", "bash")


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


# ---- argument checks of ``Sandbox.run`` / ``Session.run``: one copy, used by every backend ----


def check_files(files: Mapping[str, str | bytes] | None) -> None:
    """Validate ``files``: relative paths inside the work dir, str/bytes contents.

    Raises:
        TypeError, ValueError: naming ``files`` and the offending path.
    """
    if files is None:
        return
    if not isinstance(files, Mapping):
        raise TypeError(
            f"files must be a mapping of relative path -> str | bytes, got {type(files).__name__}"
        )
    for path, content in files.items():
        if not isinstance(path, str) or not path:
            raise ValueError(f"files: path must be a non-empty str, got {path!r}")
        norm = posixpath.normpath(path)
        if path.startswith("/") or norm == ".." or norm.startswith("../") or "\0" in path:
            raise ValueError(f"files: path {path!r} must be relative and stay inside the work dir")
        if not isinstance(content, (str, bytes)):
            raise TypeError(f"files[{path!r}] must be str or bytes, got {type(content).__name__}")


def check_timeout(timeout_s: Any) -> None:
    """Raises ValueError unless ``timeout_s`` is a finite number of seconds > 0 (not a bool)."""
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, (int, float))
        or not (timeout_s > 0 and math.isfinite(timeout_s))
    ):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")


def check_memory_mb(memory_mb: Any) -> None:
    """Raises ValueError unless ``memory_mb`` is an int >= 16 (MiB)."""
    if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < 16:
        raise ValueError(f"memory_mb must be an int >= 16 (MiB), got {memory_mb!r}")


def check_code(code: Any) -> None:
    """Raises TypeError unless ``code`` is a str."""
    if not isinstance(code, str):
        raise TypeError(f"code must be str, got {type(code).__name__}")


def check_run_args(
    code: Any,
    language: Any,
    stdin: Any,
    files: Any,
    timeout_s: Any,
    memory_mb: Any,
    languages: Sequence[str] = LANGUAGES,
) -> None:
    """The arguments of :meth:`Sandbox.run`, checked the same way by every backend.

    Raises:
        TypeError / ValueError: the first bad argument, named (``code must be str``, ``language must
            be one of ...``, ``stdin``, ``files``, ``timeout_s``, ``memory_mb``).
    """
    check_code(code)
    if language not in languages:
        raise ValueError(f"language must be one of {tuple(languages)}, got {language!r}")
    if not isinstance(stdin, str):
        raise TypeError(f"stdin must be str, got {type(stdin).__name__}")
    check_files(files)
    check_timeout(timeout_s)
    check_memory_mb(memory_mb)
