"""Per-run memory cgroups: the kernel enforces a run's memory limit and counts when it was hit.

Stdlib only (imported by the zygote, outside the ``chatgym`` package). The zygote (root) makes one
directory ``chatgym-<pid>`` under its own memory cgroup and, per run or session, a child cgroup
with the run's limit; it moves the run's process in before the code starts, so every process the
run forks is in it too. After the run it reads the cgroup's own OOM counters: that, not anything
the program printed, decides the ``oom`` status. Both cgroup versions:

* v2 (``cgroup2``): ``memory.max`` (and ``memory.swap.max`` = 0); hit = ``oom`` or ``oom_kill`` of
  ``memory.events``. The zygote's cgroup must delegate the memory controller
  (``cgroup.subtree_control``), which a cgroup holding processes can only do at the root.
* v1 (a ``cgroup`` mount with the ``memory`` controller): ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes``, swap included); hit = ``oom_kill`` of ``memory.oom_control``
  (``failcnt`` where the kernel has no such line).

``memory.events`` ``max`` (v2) and ``failcnt`` (v1) also count limit hits that reclaiming page cache
resolved (nothing failed), so they are not used where the OOM counters exist.

Where no writable memory cgroup exists (not root, a read-only ``/sys/fs/cgroup``, no controller),
``MemCgroups.open`` says why and the zygote keeps the RLIMIT_AS fallback, under which an allocation
failure is not observable (the program sees ENOMEM and decides itself how to end).
"""

from __future__ import annotations

import errno
import os
import signal
import time


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def own_cgroup_dirs() -> list[tuple[int, str]]:
    """``(version, directory)`` of this process's memory cgroup, v2 first; those that exist and
    have the memory controller.

    From ``/proc/self/cgroup`` (path relative to the cgroup namespace root) and
    ``/proc/self/mountinfo`` (each cgroup mount's root within the hierarchy and its mount point).
    """
    v1_path = v2_path = None
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    found = []
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        root, point, fstype, opts = fields[3], fields[4], rfields[0], rfields[2].split(",")
        if fstype == "cgroup2" and v2_path is not None:
            version, path = 2, v2_path
        elif fstype == "cgroup" and "memory" in opts and v1_path is not None:
            version, path = 1, v1_path
        else:
            continue
        if path == root or path.startswith(root.rstrip("/") + "/"):
            d = point + path[len(root.rstrip("/")) :]
            if has_memory(version, d):
                found.append((version, d.rstrip("/") or "/"))
    found.sort(key=lambda vd: -vd[0])
    return found


def has_memory(version: int, directory: str) -> bool:
    """Whether the cgroup ``directory`` (of cgroup ``version``) has the memory controller."""
    try:
        if version == 2:
            return "memory" in _read(os.path.join(directory, "cgroup.controllers")).split()
        return os.path.exists(os.path.join(directory, "memory.limit_in_bytes"))
    except OSError:
        return False


def version_of(directory: str) -> int:
    """1 or 2, from the memory files in ``directory``; 0 when it has no memory controller."""
    if os.path.exists(os.path.join(directory, "memory.limit_in_bytes")):
        return 1
    if os.path.exists(os.path.join(directory, "memory.max")):
        return 2
    return 0


class MemCgroups:
    """The zygote's directory of per-run memory cgroups (see the module docstring)."""

    def __init__(self, version: int, base: str) -> None:
        self.version = version
        self.base = base
        self.n = 0
        self.leftover: list[str] = []  # run cgroups not removed yet (a process was still in them)

    @classmethod
    def open(cls, directory: str | None = None) -> tuple[MemCgroups | None, str]:
        """Make ``chatgym-<pid>`` under ``directory`` (default: our own memory cgroup).

        Returns ``(cgroups, "")``, or ``(None, why)`` when no per-run memory cgroup can be made.
        """
        if os.geteuid() != 0:
            return None, "not root"
        try:
            candidates = [(version_of(directory), directory)] if directory else own_cgroup_dirs()
        except OSError as e:
            return None, f"cannot read /proc/self/cgroup ({e})"
        why = "no memory cgroup mounted" if directory is None else f"{directory}: no memory controller"
        for version, d in candidates:
            if not has_memory(version, d):
                continue
            try:
                return cls._make(version, d), ""
            except OSError as e:
                why = f"{d}: {e}"
        return None, why

    @classmethod
    def _make(cls, version: int, parent: str) -> MemCgroups:
        if version == 2:
            ctl = os.path.join(parent, "cgroup.subtree_control")
            if "memory" not in _read(ctl).split():
                _write(ctl, "+memory")  # EBUSY when the cgroup holds processes and is not the root
        elif version != 1:
            raise OSError(errno.ENOENT, "no memory controller files")
        # pid and a random part: zygotes in their own PID namespaces (bwrap) all have the same pid
        base = os.path.join(parent, f"chatgym-{os.getpid()}-{os.urandom(4).hex()}")
        os.mkdir(base, 0o755)
        try:
            if version == 2:
                _write(os.path.join(base, "cgroup.subtree_control"), "+memory")
            cg = cls(version, base)
            probe = cg.create("probe", 64 << 20)  # fails here, not on the first run, if it cannot work
            cg.remove(probe)
        except OSError:
            os.rmdir(base)
            raise
        return cg

    def create(self, name: str, limit_bytes: int) -> str:
        """A new cgroup ``name`` (unique per zygote) limited to ``limit_bytes``, swap included."""
        path = os.path.join(self.base, name)
        os.mkdir(path, 0o755)
        try:
            if self.version == 2:
                _write(os.path.join(path, "memory.max"), str(limit_bytes))
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(os.path.join(path, "memory.swap.max"), "0")
            else:
                _write(os.path.join(path, "memory.limit_in_bytes"), str(limit_bytes))
                memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):  # only settable once limit_in_bytes is (memsw >= limit)
                    _write(memsw, str(limit_bytes))
        except OSError:
            os.rmdir(path)
            raise
        return path

    def new_run(self, limit_bytes: int) -> str:
        self.n += 1
        return self.create(f"r{self.n}", limit_bytes)

    def join(self, path: str, pid: int) -> None:
        """Move process ``pid`` (ours, not yet running user code) into ``path``."""
        _write(os.path.join(path, "cgroup.procs"), str(pid))

    def oom_count(self, path: str) -> int:
        """How many times the run in ``path`` ran out of its memory (0: never); -1 if unreadable."""
        try:
            if self.version == 2:
                events = dict(
                    line.split() for line in _read(os.path.join(path, "memory.events")).splitlines()
                )
                return int(events.get("oom", 0)) + int(events.get("oom_kill", 0))
            ctl = dict(line.split() for line in _read(os.path.join(path, "memory.oom_control")).splitlines())
            if "oom_kill" in ctl:
                return int(ctl["oom_kill"])
            return int(_read(os.path.join(path, "memory.failcnt")))
        except (OSError, ValueError):
            return -1

    def remove(self, path: str) -> None:
        """Remove the cgroup ``path``; a process still in it is killed and the removal retried
        later (at the next ``remove`` or ``close``)."""
        for p in [path, *self.leftover]:
            try:
                os.rmdir(p)
            except FileNotFoundError:
                pass
            except OSError:
                self._kill_members(p)
                if p not in self.leftover:
                    self.leftover.append(p)
                continue
            if p in self.leftover:
                self.leftover.remove(p)

    @staticmethod
    def members(path: str) -> list[int] | None:
        """The pids in the cgroup ``path`` (None when it cannot be read)."""
        try:
            return [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()]
        except (OSError, ValueError):
            return None

    @classmethod
    def _kill_members(cls, path: str) -> None:
        for pid in cls.members(path) or []:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self, wait_s: float = 2.0) -> None:
        """Remove every run cgroup left and the zygote's directory (best effort: killed members
        may take a moment to die, so removal is retried for up to ``wait_s`` seconds)."""
        deadline = time.monotonic() + wait_s
        while True:
            for p in list(self.leftover):
                self._kill_members(p)
                try:
                    os.rmdir(p)
                    self.leftover.remove(p)
                except FileNotFoundError:
                    self.leftover.remove(p)
                except OSError:
                    pass
            if not self.leftover or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        try:
            os.rmdir(self.base)
        except OSError:
            pass
