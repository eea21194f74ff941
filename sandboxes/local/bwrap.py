"""``BwrapSandbox``: the local sandbox with its zygote inside a bubblewrap (``bwrap``) container.

The zygote and every run it forks live in a bwrap sandbox made once per ``BwrapSandbox``:

* a new root that is a read-only tmpfs holding only read-only binds of the system (``/usr``, ``/etc``
  and the ``/bin``, ``/lib*``, ``/sbin`` links), the interpreter's own prefix and this package's
  directory (bound at ``/opt/chatgym-sandbox``): the user's home, the project checkout and every other host path are simply absent;
* a private ``/tmp``, ``/var/tmp``, ``/dev/shm`` (work dirs live there) and a minimal ``/dev``; as
  root, each run and session then gets its own of these, as in ``LocalSandbox``; not root (no
  capabilities inside), the runs of one sandbox share them;
* new PID, IPC, UTS (and, where the kernel allows, cgroup) namespaces: host processes do not exist
  for the code; the zygote is not PID 1 (bwrap's init is) and reaps what runs orphan;
* a new, empty network namespace unless ``network=True``.

Inside it, everything ``LocalSandbox`` does still applies (per-slot uids, rlimits, ``hidepid``,
process-group kills, output caps, and as root a memory cgroup per run: this process's own memory
cgroup directory is bound read-write at ``MEMCG_MOUNT``, the only part of ``/sys`` there). Runs cost the same as local ones (the bwrap start is paid once).
Runs of one sandbox share its namespaces (two concurrent runs could see each other's processes if
they had the same uid; they never do).

Fallback: when ``bwrap`` is missing or cannot create namespaces here (checked once per process by
running ``bwrap ... true``), a ``RuntimeWarning`` says so and the sandbox runs the plain local
zygote, which keeps rlimits and whatever isolation it can set up itself (none of the namespaces
when the kernel refuses them: rlimits only). ``isolation["bwrap"]`` says which happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence

from chatgym.sandboxes.local.client import SANDBOX_DIR, ZygoteClient
from chatgym.sandboxes.local.isolation import LOCK_DIRS
from chatgym.sandboxes.local.memcg import own_cgroup_dirs
from chatgym.sandboxes.local.sandbox import LocalSandbox

PACKAGE_MOUNT = "/opt/chatgym-sandbox"
MEMCG_MOUNT = "/sys/fs/cgroup/chatgym"  # our memory cgroup, where the zygote makes the runs' cgroups
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_probed: dict[tuple, str] = {}  # bwrap argv -> "" (works) or why not


def bwrap_args(
    bwrap: str,
    *,
    network: bool,
    keep: Sequence[str],
    lock_dirs: Sequence[str] = (),
    caps: bool = False,
    package: str | None = None,
    memcg: str | None = None,
) -> list[str]:
    """The ``bwrap`` command line (up to and including ``--``) for the layout in the module docstring.

    Args:
        bwrap: path of the bwrap binary.
        network: keep the host network (no ``--unshare-net``).
        keep: host directories bound read-only at the same path (interpreter prefix, this package).
        lock_dirs: host directories bound read-write (the uid lock files shared with other sandboxes).
        caps: keep all capabilities (as root: the zygote needs them for uid switching and mounts).
        package: this package's directory, bound read-only at ``PACKAGE_MOUNT`` (so the checkout
            or site-packages that holds it stays invisible).
        memcg: a memory cgroup directory, bound read-write at ``MEMCG_MOUNT``.
    """
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--hostname", "sandbox"]
    if not network:
        args.append("--unshare-net")
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for d in sorted({os.path.realpath(k) for k in keep if os.path.isdir(k)}):
        if not any(d == s or d.startswith(s + "/") for s in SYSTEM_DIRS):
            args += ["--ro-bind", d, d]
    args += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp", "--tmpfs", "/run"]
    args += ["--dir", "/run/lock"]
    if package:
        args += ["--ro-bind", package, PACKAGE_MOUNT]
    for d in lock_dirs:  # /run was just replaced by a tmpfs: bind the lock dirs again on top
        args += ["--bind", d, d]
    if memcg:
        args += ["--bind", memcg, MEMCG_MOUNT]
    if caps:
        args += ["--cap-add", "ALL"]
    args += ["--remount-ro", "/", "--chdir", "/", "--"]
    return args


def probe(args: list[str]) -> str:
    """Run ``args + ["true"]`` once per process; "" when it works, else why not."""
    key = tuple(args)
    if key not in _probed:
        try:
            r = subprocess.run([*args, "/bin/true"], capture_output=True, text=True, timeout=30)
            _probed[key] = "" if r.returncode == 0 else (r.stderr.strip() or f"exit code {r.returncode}")
        except (OSError, subprocess.TimeoutExpired) as e:
            _probed[key] = str(e)
    return _probed[key]


def _memcg_dir() -> str | None:
    """Our own memory cgroup directory, when we are root and have one (for per-run cgroups inside)."""
    if os.geteuid() != 0:
        return None
    try:
        dirs = own_cgroup_dirs()
    except OSError:
        return None
    return next((d for _, d in dirs if os.access(d, os.W_OK)), None)


def _lock_dirs() -> list[str]:
    """The root-owned uid lock directory (made now), for the uid claims shared with other sandboxes."""
    if os.geteuid() != 0:
        return []
    for d in LOCK_DIRS:
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.lstat(d)
            if st.st_uid == 0 and not st.st_mode & 0o022:
                return [d]
        except OSError:
            continue
    return []


class BwrapSandbox(LocalSandbox):
    """:class:`LocalSandbox` inside bubblewrap (see the module docstring for what that adds).

    Args:
        bwrap: the bwrap binary (default: ``bwrap`` on PATH).
        **kwargs: as :class:`LocalSandbox` (``network``, ``site_packages``, limits, ...).

    Warns:
        RuntimeWarning: bwrap is unavailable; the sandbox falls back to the plain local zygote.
    """

    def __init__(self, max_concurrency: int = 4, *, bwrap: str | None = None, **kwargs) -> None:
        super().__init__(max_concurrency, **kwargs)
        python = kwargs.get("python") or sys.executable
        if not kwargs.get("site_packages"):
            # With -I -S a venv adds nothing: run the base interpreter, so the venv (and the project
            # that holds it) need not be visible.
            python = os.path.realpath(python)
        keep = [sys.base_prefix, sys.base_exec_prefix]
        if kwargs.get("site_packages"):  # the venv (site-packages) must then be visible, read-only
            keep += [sys.prefix, sys.exec_prefix]
        keep.append(os.path.dirname(os.path.dirname(os.path.realpath(python))))
        self.bwrap = bwrap or shutil.which("bwrap") or "bwrap"
        self._bwrap_args = bwrap_args(
            self.bwrap,
            network=bool(kwargs.get("network", False)),
            keep=keep,
            lock_dirs=_lock_dirs(),
            package=SANDBOX_DIR,
            caps=os.geteuid() == 0,
            memcg=(memcg := _memcg_dir() if kwargs.get("memory_cgroup") is not False else None),
        )
        self._config["memcg_dir"] = MEMCG_MOUNT if memcg else None
        self._plain_argv = list(self._argv)
        self._sandbox_dir = PACKAGE_MOUNT
        self._argv = [*self._bwrap_args, python, *self._argv[1:]]
        self._bwrap_note = ""

    def _start_blocking(self) -> ZygoteClient:
        why = probe(self._bwrap_args)
        if why:
            self._bwrap_note = f"bwrap unavailable ({why}); falling back to the plain local sandbox (rlimits, and namespaces only where it can make them)"
            if self._argv != self._plain_argv:
                warnings.warn(f"BwrapSandbox: {self._bwrap_note}", RuntimeWarning, stacklevel=4)
            self._argv, self._sandbox_dir = self._plain_argv, SANDBOX_DIR
            self._config["memcg_dir"] = None  # the plain zygote finds its own cgroup
        client = super()._start_blocking()
        client.info["bwrap"] = not why
        if why:
            client.info.setdefault("notes", []).append(self._bwrap_note)
        return client
