"""Load test of ``chatgym serve-sandbox``: N executions at concurrency C, leaks counted before/after.

Starts the service (a real process, ``--backend local``, ``bwrap``, ``docker`` (a fresh container
per run) or ``docker-warm`` (containers reset and reused)) on 127.0.0.1, warms it up,
takes a census, sends N ``/run_code`` requests through ``SandboxFusionSandbox`` with C in flight,
waits for the service to settle and takes the census again. The census counts

* processes in the service's tree (the zygote, its spares, bwrap's init), zombies among them, and
  processes owned by the sandbox uids (a run's leftovers);
* open file descriptors of the service process and of the zygote;
* temp dirs: host ``/tmp`` entries named ``chatgym*`` and the runs' work dirs in the zygote's private
  /tmp (read through ``/proc/<zygote>/root``; the idle spares' empty ones do not count);
* docker backends: the engine's containers labelled ``chatgym.sandbox`` (the warm pool: the same
  number before and after) and ``containerd-shim`` processes (one per container). No zygote there:
  its two rows read -1 before and after.

The docker backends use ``DOCKER_HOST`` if set; otherwise (as root, with ``dockerd`` installed) a
private daemon is started for the test and stopped after (``chatgym.sandboxes.docker.engine``).

Every request is checked (the mix: 90 % ``print(sum(range(k)))`` with a known answer, 10 % a raised
exception). Prints p50/p99 latency (ms, client side, queueing included), throughput (runs/s), the
status counts, the load average, and each census difference (all must be 0).

    python benchmarks/sandbox_load.py [--runs 1000] [--concurrency 32] [--backend local|bwrap|docker|docker-warm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request

from chatgym.sandboxes.fusion.client import SandboxFusionSandbox
from chatgym.sandboxes.fusion.service import start_service, stop_service


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(pid, state, ppid) from /proc/PID/stat, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(") ", 1)[1].split()
        return pid, rest[0], int(rest[1])
    except (OSError, IndexError):
        return None


def tree(root: int) -> dict[int, str]:
    """pid -> state of every descendant of ``root`` (not ``root`` itself)."""
    stats = [s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p)))]
    children: dict[int, list[tuple[int, str]]] = {}
    for pid, state, ppid in stats:
        children.setdefault(ppid, []).append((pid, state))
    out, todo = {}, [root]
    while todo:
        for pid, state in children.get(todo.pop(), []):
            out[pid] = state
            todo.append(pid)
    return out


def _count(path: str) -> int:
    try:
        return len(os.listdir(path))
    except OSError:
        return -1


def _run_work_dirs(work: str) -> int:
    """Work dirs in the zygote's work base other than its idle spares' (each spare makes an empty,
    root-owned ``wN`` and ``wN.scratch`` ahead of its run); -1 when the base cannot be read."""
    try:
        names = set(os.listdir(work))
    except OSError:
        return -1

    def idle_spare(name: str) -> bool:
        base = name.removesuffix(".scratch")
        top = os.path.join(work, name)
        try:
            files = [f for _, _, fs in os.walk(top) for f in fs]
            return {base, base + ".scratch"} <= names and not files and os.lstat(top).st_uid == 0
        except OSError:  # a spare being retired or made meanwhile
            return False

    return sum(not idle_spare(n) for n in names)


def docker_census() -> dict[str, int]:
    """Our containers on the engine (``DOCKER_HOST``) and containerd shim processes on this host."""
    import docker

    client = docker.from_env()
    try:
        containers = len(client.containers.list(all=True, filters={"label": "chatgym.sandbox"}, sparse=True))
    finally:
        client.close()
    # A private daemon's shims name its directory (-address DIR/exec/containerd/containerd.sock):
    # count only those; with an engine of the user's, every shim on the host.
    sock = os.environ.get("DOCKER_HOST", "").removeprefix("unix://")
    mine = (
        os.path.dirname(sock).encode() + b"/"
        if os.path.isdir(os.path.join(os.path.dirname(sock), "exec"))
        else b""
    )
    shims = 0
    for p in os.listdir("/proc"):
        try:
            if p.isdigit():
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    argv = f.read()
                shims += b"containerd-shim" in argv.split(b"\0")[0] and mine in argv
        except OSError:
            pass
    return {"containers (chatgym.sandbox)": containers, "containerd-shim processes": shims}


def census(server_pid: int, uids: list[int], docker: bool = False) -> dict[str, int]:
    procs = tree(server_pid)
    boot = set()
    for pid in procs:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"_chatgym_sandbox" in b" ".join(argv) and not argv[0].endswith(b"bwrap"):
                boot.add(pid)
        except OSError:
            pass
    # The zygote runs the bootstrap (bwrap's own processes carry it in argv too, but are not python)
    # and its parent does not (its forked spares have the zygote as parent).
    zygote = next((p for p in sorted(boot) if (s := _stat(p)) and s[2] not in boot), None)
    # Docker: processes in another engine's containers (a concurrent test session's, running the
    # same uid 65534) are left out; everything else of the sandbox uids counts, escapes included.
    skip: set[int] = set()
    if docker:
        from chatgym.sandboxes.docker.engine import container_pids

        skip = container_pids(others=True)
    uid_procs = 0
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and int(p) not in skip and os.stat(f"/proc/{p}").st_uid in uids:
                uid_procs += 1
        except OSError:
            pass
    return {
        "service tree processes": len(procs),
        "zombies in the tree": sum(s == "Z" for s in procs.values()),
        "processes of sandbox uids": uid_procs,
        "service fds": _count(f"/proc/{server_pid}/fd"),
        "zygote fds": _count(f"/proc/{zygote}/fd") if zygote else -1,
        "host /tmp chatgym* entries": sum(n.startswith("chatgym") for n in os.listdir("/tmp")),
        "zygote work dirs": _run_work_dirs(f"/proc/{zygote}/root/tmp/.chatgym-work") if zygote else -1,
    } | (docker_census() if docker else {})


def settled_census(
    server_pid: int,
    uids: list[int],
    like: dict | None = None,
    wait_s: float = 10.0,
    docker: bool = False,
    pool: int = 0,
) -> dict:
    """A census taken once two in a row agree (and agree with ``like`` if given), or after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    prev = census(server_pid, uids, docker)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        cur = census(server_pid, uids, docker)
        # Docker: settled once the pool is full again and every container's shim is gone with it.
        pool_ok = not docker or (cur["containers (chatgym.sandbox)"] == pool
                                 and cur["containerd-shim processes"] == pool)  # fmt: skip
        if cur == prev and pool_ok and (like is None or cur == like):
            return cur
        prev = cur
    return prev


def job(i: int) -> tuple[str, str, str]:
    """(code, expected status, expected stdout) of request ``i``."""
    if i % 10 == 9:
        return f"raise ValueError({i})", "error", ""
    k = 1000 + i
    return f"print(sum(range({k})))", "ok", f"{k * (k - 1) // 2}\n"


async def drive(url: str, runs: int, concurrency: int) -> dict:
    latencies, statuses, wrong = [], {}, []
    sem = asyncio.Semaphore(concurrency)
    async with SandboxFusionSandbox(url, max_concurrency=concurrency) as sb:

        async def one(i: int) -> None:
            code, want_status, want_out = job(i)
            async with sem:
                t0 = time.perf_counter()
                res = await sb.run(code, timeout_s=30)
                latencies.append(time.perf_counter() - t0)
            statuses[res.status] = statuses.get(res.status, 0) + 1
            if res.status != want_status or res.stdout != want_out:
                wrong.append((i, res.status, res.stdout[:80], res.stderr[-200:]))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(runs)))
        wall = time.perf_counter() - t0
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3  # noqa: E731
    return {"runs": runs, "concurrency": concurrency, "wall_s": wall, "throughput": runs / wall,
            "p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": latencies[-1] * 1e3,
            "statuses": statuses, "wrong": wrong}  # fmt: skip


BACKENDS = ("local", "bwrap", "docker", "docker-warm")


def load_test(backend: str = "local", runs: int = 1000, concurrency: int = 32) -> dict:
    """Run the whole load test; returns the figures, the censuses and their differences.

    The docker backends need ``DOCKER_HOST`` (and ``CHATGYM_DOCKER_IMAGE``) set: run it inside
    ``chatgym.sandboxes.docker.engine.provide()`` (the ``__main__`` below does).
    """
    docker = backend.startswith("docker")
    args = (
        ["--backend", "docker", *(["--reuse"] if backend == "docker-warm" else [])]
        if docker
        else ["--backend", backend]
    )
    # Docker: the service starts `concurrency` containers before it listens; the pool refills after.
    proc, url = start_service(*args, "--max-concurrency", str(concurrency), timeout_s=300 if docker else 60)
    settle_s = 120.0 if docker else 10.0
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            uids = json.load(r)["isolation"].get("uids", [])
        asyncio.run(drive(url, 2 * concurrency, concurrency))  # warm-up: every slot used once
        before = settled_census(proc.pid, uids, wait_s=settle_s, docker=docker, pool=concurrency)
        load_before = os.getloadavg()
        figures = asyncio.run(drive(url, runs, concurrency))
        load_after = os.getloadavg()
        after = settled_census(proc.pid, uids, like=before, wait_s=settle_s, docker=docker, pool=concurrency)
    finally:
        stop_service(proc)
    leaks = {k: after[k] - before[k] for k in before}
    return dict(figures, backend=backend, before=before, after=after, leaks=leaks,
                loadavg_before=load_before, loadavg_after=load_after)  # fmt: skip


def report(r: dict) -> None:
    print(
        f"backend={r['backend']} runs={r['runs']} concurrency={r['concurrency']} (client: SandboxFusionSandbox)"
    )
    print(f"  wall {r['wall_s']:.2f} s   throughput {r['throughput']:.1f} runs/s")
    print(f"  latency p50 {r['p50_ms']:.1f} ms   p99 {r['p99_ms']:.1f} ms   max {r['max_ms']:.1f} ms")
    print(f"  statuses {r['statuses']}   wrong results {len(r['wrong'])} {r['wrong'][:3]}")
    print(
        f"  load average before {r['loadavg_before']}  after {r['loadavg_after']}  ({os.cpu_count()} cores)"
    )
    print("  census            before  after  leak")
    for k in r["before"]:
        print(f"    {k:<28} {r['before'][k]:>5} {r['after'][k]:>6} {r['leaks'][k]:>5}")
    print("  leaks: " + ("none" if not any(r["leaks"].values()) else "FOUND"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--backend", default="local", choices=BACKENDS)
    args = ap.parse_args()
    if args.backend.startswith("docker"):
        from chatgym.sandboxes.docker.engine import provide

        with provide("bench") as engine:
            print(
                f"docker engine {engine.host} (private daemon: {engine.daemon is not None}), image {engine.image}"
            )
            result = load_test(args.backend, args.runs, args.concurrency)
    else:
        result = load_test(args.backend, args.runs, args.concurrency)
    report(result)
    sys.exit(1 if any(result["leaks"].values()) or result["wrong"] else 0)
