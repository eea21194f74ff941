"""The collector's own host time for one GRPO step of Math-v0 (8 tasks x 8 samples), no model.

A scripted engine (``ReplayEngine``: a fixed 6-token reply with an answer, no compute) answers every
request at once, so what is timed is the collector's per-episode work on the host: env creation and
reset, rendering the prompt, the request, scoring the reply, assembling the trajectory. On a GPU this
work shares one interpreter lock with the engine's worker thread (and with the learner's under
``one_step_off``): every millisecond of it is a millisecond a decode step can wait to be issued.
Prints the median wall and process CPU milliseconds per collect call over ``--repeats`` calls (after
one warm-up call), with the load average and the CPU's flags. One side only: the comparison is
between versions of the code (``benchmarks/RESULTS.md`` has the figures before and after the changes
it was written for).

    .venv/bin/python benchmarks/collector_math_cpu.py --repeats 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    for flag, value in (("--tasks", args.tasks), ("--group-size", args.group_size), ("--repeats", args.repeats)):
        if value < 1:
            ap.error(f"{flag} must be >= 1, got {value}")

    import chatgym  # noqa: F401  (registers the envs)
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines.replay import ReplayEngine
    from chatgym.trainer.rollout.collector import Collector, RolloutConfig

    tokenizer = get_tokenizer("smollm2")
    reply = tokenizer.encode(" The answer is 42.", add_special_tokens=False)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = ReplayEngine(lambda ids: [*reply, eos], tokenizer)
    config = RolloutConfig(temperature=1.0, max_tokens=128, max_response_tokens=128, max_model_len=1024,
                           episode_timeout_s=None, max_concurrent_episodes=args.tasks * args.group_size)
    collector = Collector(engine, tokenizer, config)
    tasks = list(range(args.tasks))
    walls, cpus = [], []
    try:
        for k in range(args.repeats + 1):
            c0, t0 = time.process_time(), time.perf_counter()
            trajs = await collector.collect("Math-v0", tasks, group_size=args.group_size)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if any(t.failed for t in trajs):
                raise RuntimeError([t.error for t in trajs if t.failed][:3])
            if k:  # the first call builds the task cache and the envs' imports
                walls.append(wall)
                cpus.append(cpu)
    finally:
        collector.close()
    n = args.tasks * args.group_size
    print(f"collector_math_cpu: Math-v0, {args.tasks} tasks x {args.group_size} samples, {args.repeats} calls "
          f"(load average {os.getloadavg()[0]:.2f}; CPU flags: {cpu_flags()})")
    print(f"  wall ms per call: median {1e3 * statistics.median(walls):.1f} (min {1e3 * min(walls):.1f}); "
          f"process CPU ms per call: median {1e3 * statistics.median(cpus):.1f}; "
          f"per episode {1e3 * statistics.median(cpus) / n:.3f} ms CPU")


if __name__ == "__main__":
    asyncio.run(main())
