"""What the zygote makes of a finished run: captured output, the status, and the work dir's removal.

Stdlib only (imported by the zygote, outside the ``chatgym`` package).
"""

from __future__ import annotations

import codecs
import os
import signal
from dataclasses import dataclass, field


def decode_capped(data: bytes, cap: int, cut: bool = False) -> tuple[str, bool]:
    """The text of a captured stream: UTF-8, at most ``cap`` bytes, cut on a character boundary.

    The one decoding rule of every backend (local, bwrap, sessions, Docker's runner, the service
    client), so they agree to the byte.

    Args:
        data: the bytes kept: the first ``len(data)`` bytes the program wrote.
        cap: the most bytes the returned text may take, UTF-8 encoded (int >= 0).
        cut: the program wrote more than ``data``. A character split by that cut is dropped, not
            replaced: it was never written whole into what was kept.

    Returns:
        ``(text, truncated)``. Invalid bytes the program did write become U+FFFD (3 bytes each); where
        that makes the text longer than ``cap`` bytes, it is cut again at a character boundary.
        ``truncated`` is True when anything written is missing from ``text`` (``cut`` or that re-cut).
    """
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=not cut)
    if len(data) > cap or "\ufffd" in text:  # else the text is ``data`` decoded, at most ``cap`` bytes
        encoded = text.encode("utf-8", "surrogatepass")
        if len(encoded) > cap:
            return encoded[:cap].decode("utf-8", "ignore"), True
    return text, cut


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

    def decode(self) -> tuple[str, bool]:
        """``(text, truncated)`` by :func:`decode_capped`: at most ``cap`` UTF-8 bytes."""
        return decode_capped(bytes(self.data), self.cap, self.total > len(self.data))


def classify(exit_code: int | None, timed_out: bool, oom: bool = False) -> str:
    """ExecResult status from how a process ended, as the sandbox observed it.

    ``oom`` when the run hit its memory limit (``oom``: the sandbox's own observation, e.g. the run's
    memory cgroup counted an OOM; whatever the exit code, since a process of the run was killed or
    refused memory); ``timeout`` for the wall deadline or the CPU limit (SIGXCPU); ``ok`` for exit
    code 0; ``killed`` for any other signal; ``error`` for a non-zero exit. What the program
    printed never counts: a program can print ``MemoryError`` and exit 1 without running out.
    """
    if oom:
        return "oom"
    if timed_out or exit_code == -signal.SIGXCPU:
        return "timeout"
    if exit_code == 0:
        return "ok"
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
