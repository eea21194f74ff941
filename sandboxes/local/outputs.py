"""What the zygote makes of a finished run: captured output, the status, and the work dir's removal.

Stdlib only (imported by the zygote, outside the ``chatgym`` package).
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass, field

OOM_RE = re.compile(rb"(^MemoryError\b|[Cc]annot allocate memory|std::bad_alloc|[Oo]ut of memory)", re.M)


@dataclass
class Output:
    """One captured stream: the first ``cap`` bytes, and how many bytes the program wrote in all."""

    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.total += len(chunk)

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def classify(exit_code: int | None, timed_out: bool, stderr_tail: bytes) -> str:
    """ExecResult status from how a process ended.

    ``timeout`` for the wall deadline or the CPU limit (SIGXCPU); ``oom`` when the program reported
    an allocation failure (Python's ``MemoryError`` traceback, libc's "Cannot allocate memory", C++
    ``std::bad_alloc``) — under RLIMIT_AS that is how running out of memory looks; ``killed`` for any
    other signal; ``error`` for a non-zero exit.
    """
    if timed_out or exit_code == -signal.SIGXCPU:
        return "timeout"
    if exit_code == 0:
        return "ok"
    if OOM_RE.search(stderr_tail):
        return "oom"
    return "killed" if exit_code is not None and exit_code < 0 else "error"


def remove_tree(path: str) -> None:
    """Delete ``path`` and everything under it, ignoring errors; never follows a symlink.

    What ``shutil.rmtree(path, ignore_errors=True)`` does (``os.fwalk`` works on directory fds, so
    a symlink swapped in by a leftover process cannot redirect it), without importing ``shutil``:
    that pulls zlib, bz2 and lzma into the zygote, and every fork pays for them (~0.1 ms measured).
    """
    try:
        for _, dirs, files, dir_fd in os.fwalk(path, topdown=False):
            for name in files:
                try:
                    os.unlink(name, dir_fd=dir_fd)
                except OSError:
                    pass
            for name in dirs:  # a symlink to a directory is listed here too
                try:
                    os.rmdir(name, dir_fd=dir_fd)
                except NotADirectoryError:
                    os.unlink(name, dir_fd=dir_fd)
                except OSError:
                    pass
        os.rmdir(path)
    except OSError:
        pass
