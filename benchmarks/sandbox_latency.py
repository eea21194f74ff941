"""Per-run latency of ``LocalSandbox`` vs a fresh ``python3`` process per run, same code.

Runs ``print(1)`` N times one after another and N times with 4 in flight, through

* ours — ``LocalSandbox.run`` (a fork of a warm zygote per run: fresh process, own uid, rlimits,
  empty network namespace where available);
* theirs — ``asyncio.create_subprocess_exec(python3, "-I", "-S", "-c", code)`` per run (what
  ``python -c`` based tools do; no limits, no isolation), capped at 4 in flight with a semaphore;

and prints the median milliseconds per run of several repeats, and the ratios.

    python benchmarks/sandbox_latency.py [--runs 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from chatgym.sandboxes.local.sandbox import LocalSandbox

CODE = "print(1)"


async def ours(sandbox: LocalSandbox, n: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            res = await sandbox.run(CODE)
            assert res.stdout == "1\n", res

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return (time.perf_counter() - t0) / n * 1e3


async def theirs(n: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", "-c", CODE, stdout=asyncio.subprocess.PIPE
            )
            out, _ = await proc.communicate()
            assert out == b"1\n"

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return (time.perf_counter() - t0) / n * 1e3


async def main(runs: int, repeats: int) -> None:
    async with LocalSandbox(max_concurrency=4) as sandbox:
        info = sandbox.isolation
        await ours(sandbox, 20, 1)  # warm-up
        table: dict[str, list[float]] = {}
        for rep in range(repeats):
            for conc in (1, 4):
                table.setdefault(f"ours c={conc}", []).append(await ours(sandbox, runs, conc))
                table.setdefault(f"python -c c={conc}", []).append(await theirs(runs // 4, conc))
            print(f"  repeat {rep + 1}/{repeats} done", flush=True)
    med = {k: statistics.median(v) for k, v in table.items()}
    print(f"\nprint(1), {runs} runs per case (python -c: {runs // 4}), {repeats} repeats, median ms/run")
    for k, v in med.items():
        print(f"  {k:16s} {v:7.2f} ms/run   {1e3 / v:7.1f} runs/s   {[round(x, 2) for x in table[k]]}")
    for conc in (1, 4):
        print(f"  ratio c={conc}: {med[f'python -c c={conc}'] / med[f'ours c={conc}']:.2f}x faster")
    print(f"  isolation: uids={bool(info.get('uids'))} netns={info.get('network_isolated')} "
          f"mountns={info.get('mount_ns')} notes={info.get('notes')}")  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200, help="runs per case")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per case")
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.repeats))
