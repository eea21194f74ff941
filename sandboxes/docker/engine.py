"""A private Docker engine and an offline Python image for ``DockerSandbox`` (the ``docker`` extra).

Two things a machine without a registry needs before ``DockerSandbox`` can run:

* **a daemon** — :func:`start_daemon` runs ``dockerd`` (as root; Debian's ``docker.io`` package) with its
  own socket, pidfile, ``--data-root`` and ``--exec-root`` under one directory (default
  ``$CHATGYM_CACHE/docker/daemon``), storage driver ``overlay2`` (``vfs`` where overlay cannot mount)
  and **no networking of its own**: ``--iptables=false --ip-forward=false --bridge=none`` (without
  them dockerd makes a bridge and NAT rules and turns on IP forwarding on the host). Containers then
  run with ``network_mode="none"`` only. :func:`stop_daemon` stops it by its PID, then stops any of
  its containerd processes left (found by the directory in their command line) and unmounts what
  it left mounted under its directory.
* **an image** — :func:`build_image` makes a minimal root file system from the host's own Python
  interpreter (the binary, the shared libraries ``ldd`` lists for it and its ``lib-dynload``
  modules, the standard library without tests/tkinter/idle/site-packages, ``bash`` and a few
  coreutils, ``/etc/passwd`` with ``nobody``) and feeds it to the engine's image import (no pull).
  The tag is ``chatgym-python:<hash>``, the hash of the inputs (builder version, every file's path,
  size and mtime), so an unchanged host reuses the image and the tar cached under
  ``$CHATGYM_CACHE/docker/images``.

Users with an engine of their own point ``DOCKER_HOST`` at it and skip the daemon; the image can
still be built there (``image`` below). Command line::

    python -m chatgym.sandboxes.docker.engine start   # prints export DOCKER_HOST=... CHATGYM_DOCKER_IMAGE=...
    python -m chatgym.sandboxes.docker.engine status
    python -m chatgym.sandboxes.docker.engine image   # build (or find) the image on DOCKER_HOST's engine
    python -m chatgym.sandboxes.docker.engine stop

Measured here (2 cores shared with other jobs, load average ~11, cgroup v1, Docker 20.10, overlay2):
``start`` took 2.7 s to a daemon that answers, 10.9 s with the first image build (84 MB: the tar
written, then imported); later builds on a fresh daemon import the cached tar.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BUILDER_VERSION = "1"  # bump when the image layout below changes (it is part of the tag's hash)
IMAGE_REPO = "chatgym-python"
NETWORK_FLAGS = ("--iptables=false", "--ip-forward=false", "--bridge=none", "--ip-masq=false")
# Left out of the image: tests, GUI, packaging tools, installed packages, the static libpython.
STDLIB_SKIP = {"test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
               "site-packages", "dist-packages", "__phello__", "pydoc_data"}  # fmt: skip
TOOLS = ("bash", "sh", "cat", "echo", "ls", "sleep", "env", "rm", "mkdir", "true", "false", "head",
         "tail", "wc", "sort", "printf", "test", "expr", "seq")  # fmt: skip


def cache_dir() -> Path:
    """``$CHATGYM_CACHE/docker`` (default ``~/.cache/chatgym/docker``)."""
    return Path(os.environ.get("CHATGYM_CACHE") or Path.home() / ".cache" / "chatgym") / "docker"


# ---- the daemon --------------------------------------------------------------------------------


@dataclass
class Daemon:
    """A running private dockerd: its directory, PID, ``DOCKER_HOST`` URL and storage driver."""

    root: Path
    pid: int
    host: str
    storage_driver: str

    @property
    def socket_path(self) -> Path:
        return self.root / "docker.sock"


def why_no_daemon() -> str:
    """Why :func:`start_daemon` cannot run here ("" when it can)."""
    if sys.platform != "linux":
        return f"dockerd runs on Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "a private dockerd needs root (or set DOCKER_HOST to an engine of yours)"
    if not shutil.which("dockerd"):
        return "no dockerd on PATH (apt-get install docker.io, or set DOCKER_HOST)"
    return ""


def ping(host: str, timeout_s: float = 2.0) -> bool:
    """Whether the engine at ``unix://PATH`` answers ``GET /_ping`` with ``OK``."""
    if not host.startswith("unix://"):
        raise ValueError(f"ping takes a unix:// host, got {host!r}")
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout_s)
            s.connect(host[len("unix://") :])
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
        return reply.startswith(b"HTTP/1.") and reply.rstrip().endswith(b"OK")
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def running(root: Path | str | None = None) -> Daemon | None:
    """The daemon of ``root`` (default ``cache_dir()/"daemon"``) if its pidfile names a live process
    and its socket answers, else ``None``."""
    root = Path(root) if root else cache_dir() / "daemon"
    try:
        pid = int((root / "dockerd.pid").read_text().strip())
        driver = (root / "storage-driver").read_text().strip()
    except (OSError, ValueError):
        return None
    host = f"unix://{root / 'docker.sock'}"
    if _pid_alive(pid) and ping(host):
        return Daemon(root, pid, host, driver)
    return None


def _die_with_parent() -> None:  # preexec_fn: SIGTERM to dockerd when the process that started it dies
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_daemon(
    root: Path | str | None = None,
    *,
    storage_driver: str | None = None,
    die_with_parent: bool = False,
    timeout_s: float = 30.0,
) -> Daemon:
    """Start a private ``dockerd`` under ``root`` (default ``cache_dir()/"daemon"``), or return the one
    already running there.

    Args:
        root: directory for ``docker.sock``, ``dockerd.pid``, ``dockerd.log``, ``data/`` (images,
            containers) and ``exec/`` (containerd state). Created if missing.
        storage_driver: ``overlay2`` or ``vfs``; default: ``overlay2``, then ``vfs`` if it fails.
        die_with_parent: dockerd gets SIGTERM when the calling process dies (tests); otherwise it is
            started in its own session and outlives the caller (the CLI).
        timeout_s: how long to wait for the socket to answer, seconds.

    Returns:
        The :class:`Daemon` (``host`` is the value for ``DOCKER_HOST``).

    Raises:
        RuntimeError: it cannot run here (:func:`why_no_daemon`) or did not answer within
            ``timeout_s`` (the end of its log is in the message; the process is stopped).
    """
    if why := why_no_daemon():
        raise RuntimeError(why)
    root = Path(root) if root else cache_dir() / "daemon"
    if daemon := running(root):
        return daemon
    root.mkdir(parents=True, exist_ok=True)
    drivers = [storage_driver] if storage_driver else ["overlay2", "vfs"]
    errors = []
    for driver in drivers:
        try:
            return _start(root, driver, die_with_parent, timeout_s)
        except RuntimeError as e:
            errors.append(str(e))
    raise RuntimeError("dockerd did not start: " + " | ".join(errors))


def _start(root: Path, driver: str, die_with_parent: bool, timeout_s: float) -> Daemon:
    (root / "daemon.json").write_text("{}\n")  # never /etc/docker/daemon.json
    for stale in ("docker.sock", "dockerd.pid"):
        (root / stale).unlink(missing_ok=True)
    host = f"unix://{root / 'docker.sock'}"
    argv = [
        shutil.which("dockerd") or "dockerd", "--host", host, "--pidfile", str(root / "dockerd.pid"),
        "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
        "--config-file", str(root / "daemon.json"), "--storage-driver", driver,
        *NETWORK_FLAGS, "--userland-proxy=false", "--log-level", "warn",
    ]  # fmt: skip
    with open(root / "dockerd.log", "ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=root,
            preexec_fn=_die_with_parent if die_with_parent else None,
            start_new_session=not die_with_parent,
        )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if ping(host, timeout_s=1.0):
            (root / "storage-driver").write_text(driver + "\n")
            return Daemon(root, proc.pid, host, driver)
        time.sleep(0.1)
    tail = (root / "dockerd.log").read_text(errors="replace")[-1500:]
    _stop_pid(proc.pid, 10.0)
    proc.wait()
    _cleanup(root)
    raise RuntimeError(
        f"storage driver {driver}: dockerd exited or did not answer in {timeout_s:.0f} s: {tail}"
    )


def _stop_pid(pid: int, timeout_s: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.05)
    if _pid_alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:  # reap it if it is our child (the CLI's daemon is not)
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def leftovers(root: Path | str) -> dict[str, list]:
    """What a daemon of ``root`` left: ``{"processes": [pid, ...], "mounts": [path, ...]}`` — processes
    whose command line names ``root`` (dockerd, containerd, shims) and mounts under it."""
    root = str(Path(root).resolve())
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a == root or a.startswith(root + "/") or a.endswith("=" + root) or ("unix://" + root) in a
               for a in argv) and _pid_alive(int(p)):  # fmt: skip
            pids.append(int(p))
    mounts = []
    with open("/proc/self/mounts") as f:
        for line in f:
            target = line.split()[1].replace("\\040", " ")
            if target == root or target.startswith(root + "/"):
                mounts.append(target)
    return {"processes": sorted(pids), "mounts": mounts}


def container_pids(host: str | None = None, *, others: bool = False) -> set[int]:
    """PIDs (host PID namespace) of the processes in containers: the descendants of
    ``containerd-shim`` processes.

    With a private daemon at ``host`` (default ``$DOCKER_HOST``; its socket next to an ``exec/``
    dir), only the shims naming its directory count, or with ``others=True`` only the shims that do
    *not* (other engines' containers on this host: a concurrent test session's, say). With any
    other engine: every shim on the host, and ``others=True`` gives an empty set.
    """
    sock = (host or os.environ.get("DOCKER_HOST", "")).removeprefix("unix://")
    root = os.path.dirname(sock)
    mine = (root + "/").encode() if os.path.isdir(os.path.join(root, "exec")) else b""
    if others and not mine:
        return set()
    children: dict[int, list[int]] = {}
    shims = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read()
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(p))
        if b"containerd-shim" in argv.split(b"\0")[0] and (mine in argv) != others:
            shims.append(int(p))
    found, todo = set(), list(shims)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _cleanup(root: Path) -> dict[str, list]:
    """Stop the processes and unmount the mounts of :func:`leftovers` (deepest first)."""
    found = leftovers(root)
    for pid in found["processes"]:
        _stop_pid(pid, 5.0)
    libc = ctypes.CDLL(None, use_errno=True)
    for target in sorted(found["mounts"], key=len, reverse=True):
        if libc.umount2(target.encode(), 0) != 0:
            libc.umount2(target.encode(), 2)  # MNT_DETACH: busy; gone once unused
    return found


def stop_daemon(root: Path | str | None = None, *, remove: bool = False, timeout_s: float = 30.0) -> dict:
    """Stop the daemon of ``root`` (default ``cache_dir()/"daemon"``) by the PID in its pidfile.

    Its containers are stopped by dockerd itself on SIGTERM (SIGKILL after ``timeout_s``); then any
    process still naming ``root`` is stopped and any mount under ``root`` unmounted.

    Args:
        remove: also delete ``root`` (images and containers included).

    Returns:
        ``{"processes": [...], "mounts": [...]}``: what had to be cleaned after dockerd exited (empty
        lists when it shut down cleanly). Idempotent: no daemon, nothing to do.
    """
    root = Path(root) if root else cache_dir() / "daemon"
    try:
        pid = int((root / "dockerd.pid").read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if pid and _pid_alive(pid):
        _stop_pid(pid, timeout_s)
    found = _cleanup(root) if root.exists() else {"processes": [], "mounts": []}
    if remove and root.exists():
        if leftovers(root)["mounts"]:
            raise RuntimeError(f"{root} still has mounts; not removed")
        shutil.rmtree(root, ignore_errors=True)
    return found


# ---- the image ---------------------------------------------------------------------------------


def _interpreter(python: str | None) -> dict:
    """Paths of the interpreter ``python`` (default: the base interpreter running this code)."""
    exe = python or getattr(sys, "_base_executable", None) or sys.executable
    code = (
        "import json, sys, sysconfig; p = sysconfig.get_paths(); "
        "print(json.dumps({'exe': sys.executable, 'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'], "
        "'version': '%d.%d' % sys.version_info[:2]}))"
    )
    out = subprocess.run([exe, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
    info = json.loads(out)
    info["exe"] = os.path.realpath(info["exe"])
    return info


def _ldd(paths: list[str]) -> set[str]:
    """Shared libraries (absolute paths, the loader included) that ``ldd`` lists for ``paths``."""
    libs: set[str] = set()
    for i in range(0, len(paths), 64):
        out = subprocess.run(["ldd", *paths[i : i + 64]], capture_output=True, text=True).stdout
        libs.update(re.findall(r"(?:=>\s+)?(/\S+)\s+\(0x", out))
    return libs


class _RootFS:
    """Paths of the host to copy into the image, symlinks along each path kept as symlinks."""

    def __init__(self) -> None:
        self.entries: dict[
            str, tuple[str, str]
        ] = {}  # image path -> ("file"|"dir"|"link", host path or target)

    def add(self, path: str) -> None:
        parts = Path(path).parts[1:]
        cur = "/"
        for i, part in enumerate(parts):
            cur = os.path.join(cur, part)
            if os.path.islink(cur):
                target = os.readlink(cur)
                self.entries[cur] = ("link", target)
                rest = os.path.join(os.path.dirname(cur), target, *parts[i + 1 :])
                return self.add(os.path.normpath(rest))
            if i < len(parts) - 1:
                self.entries.setdefault(cur, ("dir", cur))
        if os.path.isfile(cur):
            self.entries[cur] = ("file", cur)

    def add_tree(self, top: str, skip: set[str]) -> None:
        for dirpath, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith("config-"))
            for name in sorted(files):
                if name.endswith((".opt-1.pyc", ".opt-2.pyc", ".a", ".exe")):
                    continue
                self.add(os.path.join(dirpath, name))

    def digest(self) -> str:
        h = hashlib.sha256(BUILDER_VERSION.encode())
        for path in sorted(self.entries):
            kind, src = self.entries[path]
            st = os.stat(src) if kind == "file" else None
            h.update(f"{path}\0{kind}\0{src if kind == 'link' else ''}\0{st.st_size if st else ''}\0"
                     f"{st.st_mtime_ns if st else ''}\n".encode())  # fmt: skip
        return h.hexdigest()[:16]


ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}


def _write_tar(fs: _RootFS, exe: str, out: Path) -> None:
    # A part file of this writer's own, renamed into place: two processes building the image at once
    # (two runs, two test workers) would otherwise truncate and interleave one shared part file.
    fd, part = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    os.close(fd)
    tmp = Path(part)
    try:
        _write_tar_to(fs, exe, tmp)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)


def _write_tar_to(fs: _RootFS, exe: str, tmp: Path) -> None:
    written: set[str] = set()  # the engine refuses a tar that names a path twice
    with tarfile.open(tmp, "w") as tar:

        def dir_entry(name: str, mode: int = 0o755) -> None:
            if name in written:
                return
            written.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        for name in ("etc", "tmp", "proc", "sys", "dev", "usr", "usr/local", "usr/local/bin", "root"):
            dir_entry(name, 0o1777 if name == "tmp" else 0o755)
        for name, text in ETC_FILES.items():
            info = tarfile.TarInfo(name)
            data = text.encode()
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        links = {"usr/local/bin/python3": exe}
        for path in sorted(fs.entries):
            kind, src = fs.entries[path]
            name = path.lstrip("/")
            if name in written or name == "usr/local/bin/python3":
                continue
            if kind == "link":
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, src
                tar.addfile(info)
            elif kind == "dir":
                dir_entry(name)  # world-traversable even where the host's is not (/root/.pyenv)
            else:
                st = os.stat(src)
                info = tarfile.TarInfo(name)
                info.size, info.mtime = st.st_size, st.st_mtime  # pyc files check the source mtime
                info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                with open(src, "rb") as f:
                    tar.addfile(info, f)
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)


def image_rootfs(python: str | None = None) -> tuple[_RootFS, dict]:
    """The file list of the image for ``python`` and the interpreter's paths (no file is read)."""
    info = _interpreter(python)
    fs = _RootFS()
    fs.add(info["exe"])
    for top in sorted({info["stdlib"], info["platstdlib"]}):
        fs.add_tree(top, STDLIB_SKIP)
    tools = [p for t in TOOLS if (p := shutil.which(t, path="/usr/bin:/bin"))]
    for t in tools:
        fs.add(t)
    for t in ("/bin/sh", "/bin/bash"):  # scripts name these (on merged-/usr hosts /bin is a link)
        if os.path.exists(t):
            fs.add(t)
    binaries = [info["exe"], *tools] + [
        p for p, (k, _) in fs.entries.items() if k == "file" and p.endswith(".so")
    ]
    for lib in sorted(_ldd([os.path.realpath(b) for b in binaries])):
        fs.add(lib)
    if os.path.exists("/etc/ld.so.cache"):
        fs.add("/etc/ld.so.cache")
    return fs, info


def build_image(client=None, *, python: str | None = None) -> str:
    """Build (or find) the offline Python image on ``client``'s engine; returns its tag.

    Args:
        client: a ``docker.DockerClient`` (default ``docker.from_env()``, i.e. ``DOCKER_HOST``).
        python: the interpreter to copy (default: the base interpreter running this code).

    Returns:
        ``chatgym-python:<hash of the inputs>``; the image has ``python3`` (``/usr/local/bin``), ``bash``.

    Raises:
        ImportError: no docker SDK. ``docker.errors.APIError``: the engine refused the import.
    """
    import docker

    client = client or docker.from_env()
    fs, info = image_rootfs(python)
    tag = fs.digest()
    name = f"{IMAGE_REPO}:{tag}"
    try:
        client.images.get(name)
        return name
    except docker.errors.ImageNotFound:
        pass
    tar_path = cache_dir() / "images" / f"{IMAGE_REPO}-{tag}.tar"
    if not tar_path.exists():
        tar_path.parent.mkdir(parents=True, exist_ok=True)
        _write_tar(fs, info["exe"], tar_path)
    client.api.import_image_from_file(
        str(tar_path), repository=IMAGE_REPO, tag=tag,
        changes=["ENV PATH=/usr/local/bin:/usr/bin:/bin", "ENV LANG=C.UTF-8"],
    )  # fmt: skip
    client.images.get(name)  # raises if the import did not make it
    return name


# ---- an engine for a test session or a benchmark ----------------------------------------------


@dataclass
class Engine:
    """An engine to run containers on: ``host`` (``DOCKER_HOST``), ``image`` (the offline image's tag),
    ``daemon`` (the private daemon started for it, or ``None`` for the user's own engine)."""

    host: str
    image: str
    daemon: Daemon | None


@contextlib.contextmanager
def provide(name: str = "run"):
    """An engine for the duration of the ``with`` block, with ``DOCKER_HOST`` and
    ``CHATGYM_DOCKER_IMAGE`` set in ``os.environ`` (child processes see them) and restored after.

    ``DOCKER_HOST`` already set: that engine, used as it is (never stopped here). Otherwise a private
    daemon in ``cache_dir()/f"{name}-{pid}"`` that dies with this process, stopped on leaving the
    block (whatever happened) and its directory removed; leaving raises ``RuntimeError`` if any of
    its processes or mounts is left. Directories ``name-<pid>`` of runs whose process is gone (killed
    before their clean-up) are stopped and removed first.

    Raises:
        RuntimeError: no engine can run here (the reason), or the daemon did not start.
        ImportError: no docker SDK. ``docker.errors.DockerException``: the engine failed.
    """
    import docker

    saved = {k: os.environ.get(k) for k in ("DOCKER_HOST", "CHATGYM_DOCKER_IMAGE")}
    daemon = None
    if saved["DOCKER_HOST"]:
        host = saved["DOCKER_HOST"]
    else:
        if why := why_no_daemon():
            raise RuntimeError(why)
        for stale in cache_dir().glob(f"{name}-*"):  # of a run that was killed before it could clean up
            pid = stale.name.rsplit("-", 1)[1]
            if stale.is_dir() and pid.isdigit() and not _pid_alive(int(pid)):
                stop_daemon(stale, remove=True)
        root = cache_dir() / f"{name}-{os.getpid()}"
        try:
            daemon = start_daemon(root, die_with_parent=True)
        except RuntimeError:
            stop_daemon(root, remove=True)
            raise
        host = daemon.host
    try:
        client = docker.DockerClient(base_url=host)
        try:
            client.ping()
            image = build_image(client)
        finally:
            client.close()
        os.environ["DOCKER_HOST"], os.environ["CHATGYM_DOCKER_IMAGE"] = host, image
        yield Engine(host, image, daemon)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if daemon is not None:
            found = stop_daemon(daemon.root, remove=True)
            left = leftovers(daemon.root)
            if left["processes"] or left["mounts"] or daemon.root.exists():
                raise RuntimeError(f"the private dockerd left {left} (cleaned after it exited: {found})")


# ---- command line ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m chatgym.sandboxes.docker.engine", description=__doc__.split("\n")[0]
    )
    ap.add_argument("command", choices=["start", "stop", "status", "image"])
    ap.add_argument("--root", default=None, help="daemon directory (default $CHATGYM_CACHE/docker/daemon)")
    ap.add_argument("--storage-driver", default=None, choices=["overlay2", "vfs"])
    ap.add_argument("--python", default=None, help="interpreter copied into the image")
    args = ap.parse_args(argv)
    try:
        if args.command == "start":
            d = start_daemon(args.root, storage_driver=args.storage_driver)
            import docker

            client = docker.DockerClient(base_url=d.host)
            try:
                image = build_image(client, python=args.python)
            finally:
                client.close()
            print(f"# dockerd pid {d.pid}, storage driver {d.storage_driver}, root {d.root}", file=sys.stderr)
            print(f"export DOCKER_HOST={d.host} CHATGYM_DOCKER_IMAGE={image}")
        elif args.command == "stop":
            found = stop_daemon(args.root)
            print(f"stopped; cleaned after dockerd: {found}")
        elif args.command == "status":
            d = running(args.root)
            print(
                f"running: pid {d.pid}, DOCKER_HOST={d.host}, storage driver {d.storage_driver}"
                if d
                else "not running"
            )
            return 0 if d else 1
        else:
            print(build_image(python=args.python))
    except (RuntimeError, ImportError, OSError, subprocess.CalledProcessError) as e:
        print(f"docker_engine {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
