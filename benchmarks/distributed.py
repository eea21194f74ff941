"""Rollout on Ray: 2 rollout workers vs 1, and Ray's cost per episode vs the local collector.

CPU part (this machine; the scripted engine, no model compute):

1. *Scaling* — the same episodes on 1 and on 2 rollout workers (``RayRollout``), each worker a
   scripted engine replica (``chatgym.testing.ScriptedEngine``, ``--gen-delay`` seconds per generate call)
   that takes at most ``--capacity`` episodes at once (a replica's batch slots), and an env whose tool
   has a heavy-tailed latency (``SleepToolEnv``: log-normal, median ``--tool-median`` s, sigma
   ``--tool-sigma``, capped at ``--tool-cap`` s; fixed per (task, turn), so both sides meet the same
   latencies). Prints episodes/s of each (median of ``--repeats`` runs) and the ratio 2 / 1. A run's
   wall time is at least its slowest episode (the tail), so the default batch (128 episodes, latency
   cap 2 s) is many capacity-rounds long: throughput, not one straggler, decides the figure.
2. *Overhead* — one-turn episodes with no delays, N at once: the local collector in this process vs
   one Ray worker (``RayRollout``); prints the wall time per episode of each and the difference in ms
   (what Ray adds per episode: the call, pickling the request and the trajectory back), and the
   round trip of a single-episode request (local vs Ray) in ms.

    .venv/bin/python benchmarks/distributed.py                # CPU part
    .venv/bin/python benchmarks/distributed.py --part gpu     # GPU part (see gpu_part: not here)

The machine is shared: ratios, not absolute times; the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from chatgym.testing import ENV_ID
from chatgym.trainer.config.run import Config, EngineConfig, EnvConfig, TrainConfig
from chatgym.trainer.config.runner import RayConfig, RunnerConfig
from chatgym.trainer.rollout.config import RolloutConfig
from chatgym.trainer.rollout.source import RolloutRequest


def config(out: str, *, workers: int, capacity: int, gen_delay: float, tool_turns: int) -> Config:
    return Config(
        engine=EngineConfig(backend="hf", options={"delay_s": gen_delay, "tool_turns": tool_turns}),
        env=EnvConfig(id=ENV_ID),
        rollout=RolloutConfig(seed=1, episode_timeout_s=None, max_concurrent_episodes=4096),
        train=TrainConfig(output_dir=out, trace_fraction=0.0),
        trainer=RunnerConfig(
            backend="ray",
            ray=RayConfig(
                num_rollout_workers=workers,
                engine_factory="chatgym.testing:scripted_engine",
                worker_num_cpus=0,
                worker_capacity=capacity,
            ),
        ),
    )


def request(n: int, env_kwargs: dict[str, Any], offset: int = 0) -> RolloutRequest:
    return RolloutRequest(ENV_ID, tuple(range(offset, offset + n)), 1, env_kwargs=env_kwargs, reset_seed=0)


async def timed(source: Any, req: RolloutRequest) -> float:
    t0 = time.perf_counter()
    trajs = await source.collect(req)
    wall = time.perf_counter() - t0
    failed = [t.error for t in trajs if t.failed]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes failed: {failed[:3]}")
    return wall


def scaling(args: argparse.Namespace, model_path: str, out: str) -> None:
    from chatgym.trainer.distributed.ray_rollout import RayRollout

    env_kwargs = {
        "num_tasks": args.episodes,
        "sleep_s": args.tool_median,
        "sigma": args.tool_sigma,
        "cap_s": args.tool_cap,
    }
    req = request(args.episodes, env_kwargs)
    rates: dict[int, list[float]] = {}
    for workers in (1, 2):
        cfg = config(
            out, workers=workers, capacity=args.capacity, gen_delay=args.gen_delay, tool_turns=args.tool_turns
        )
        source = RayRollout(cfg, model_path=model_path, out_dir=out)
        try:
            asyncio.run(timed(source, request(4, env_kwargs)))  # warm-up: imports, first calls
            rates[workers] = [args.episodes / asyncio.run(timed(source, req)) for _ in range(args.repeats)]
        finally:
            source.close()
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(
        f"scaling: {args.episodes} episodes x {args.tool_turns} tool turns, gen {args.gen_delay} s/call, "
        f"tool log-normal median {args.tool_median} s sigma {args.tool_sigma} cap {args.tool_cap} s, "
        f"capacity {args.capacity} episodes/replica, {args.repeats} runs (load average {os.getloadavg()[0]:.2f})"
    )
    print(f"  1 worker : episodes/s [{', '.join(f'{r:.2f}' for r in rates[1])}] median {one:.2f}")
    print(f"  2 workers: episodes/s [{', '.join(f'{r:.2f}' for r in rates[2])}] median {two:.2f}")
    print(f"  ratio 2 / 1: {two / one:.2f}")


def overhead(args: argparse.Namespace, model_path: str, out: str) -> None:
    from chatgym.testing import ScriptedEngine
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.distributed.ray_rollout import RayRollout
    from chatgym.trainer.rollout.collector import Collector
    from chatgym.trainer.rollout.source import LocalRollout

    cfg = config(out, workers=1, capacity=4096, gen_delay=0.0, tool_turns=0)
    tok = get_tokenizer(model_path)
    engine = ScriptedEngine(tok, tool_turns=0)
    local = LocalRollout(engine, Collector(engine, tok, dataclasses.replace(cfg.rollout)))
    ray_side = RayRollout(cfg, model_path=model_path, out_dir=out)
    env_kwargs = {"num_tasks": args.overhead_episodes}
    batch, single = request(args.overhead_episodes, env_kwargs), request(1, env_kwargs)
    walls: dict[str, list[float]] = {"local": [], "ray": []}
    singles: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        for source in (local, ray_side):
            asyncio.run(timed(source, batch))  # warm-up
        for k in range(args.repeats):
            sides = [("local", local), ("ray", ray_side)]
            for name, source in sides if k % 2 == 0 else sides[::-1]:
                walls[name].append(asyncio.run(timed(source, batch)))
                singles[name] += [asyncio.run(timed(source, single)) for _ in range(10)]
    finally:
        ray_side.close()
        local.close()
    n = args.overhead_episodes
    per = {k: 1000 * statistics.median(v) / n for k, v in walls.items()}
    one = {k: 1000 * statistics.median(v) for k, v in singles.items()}
    print(
        f"overhead: {n} one-turn episodes at once, scripted engine without delay, {args.repeats} runs "
        f"(load average {os.getloadavg()[0]:.2f})"
    )
    print(f"  local collector: {per['local']:.3f} ms/episode; 1 Ray worker: {per['ray']:.3f} ms/episode")
    print(f"  Ray adds {per['ray'] - per['local']:.3f} ms per episode (batch of {n})")
    print(
        f"  one-episode request round trip: local {one['local']:.2f} ms, Ray {one['ray']:.2f} ms "
        f"(+{one['ray'] - one['local']:.2f} ms)"
    )


# ==== GPU part: for a 2 x H200 machine (not run on the CPU box) ===================================
def gpu_part(args: argparse.Namespace) -> None:
    """The main job's shape (SmolLM2 on Math-v0) on Ray with GPUs, two measurements:

    (a) placement: learner and engine colocated on one GPU vs disaggregated on two GPUs — s/step
        (median over steps after the first) of ``chatgym train`` with ``trainer.backend=ray``;
    (b) data-parallel learners: ``trainer.ray.num_learners`` 2 vs 1 — training tokens/s
        (``throughput/train_tokens_per_s``) and the ratio (target >= 1.8x).

    Needs the learner half (Ray learner actors, placement settings) and a CUDA machine; this CPU
    helper leaves it to be filled in and run there.
    """
    raise NotImplementedError(
        "GPU part: run on the 2 x H200 machine once the Ray learners land (see gpu_part's docstring)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--tool-turns", type=int, default=3)
    ap.add_argument("--gen-delay", type=float, default=0.02, help="seconds per generate call")
    ap.add_argument("--tool-median", type=float, default=0.1)
    ap.add_argument("--tool-sigma", type=float, default=1.5)
    ap.add_argument("--tool-cap", type=float, default=2.0)
    ap.add_argument("--capacity", type=int, default=8, help="episodes at once per replica")
    ap.add_argument("--overhead-episodes", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the local Ray cluster")
    args = ap.parse_args()
    if args.part == "gpu":
        gpu_part(args)
        return

    from chatgym.trainer.distributed.cluster import start_or_join
    from chatgym.trainer.models.packaged import load_model_path

    model_path = str(load_model_path("smollm2"))
    cluster = start_or_join(None, num_cpus=args.num_cpus)
    try:
        with tempfile.TemporaryDirectory() as out:
            scaling(args, model_path, out)
            overhead(args, model_path, out)
    finally:
        killed = cluster.shutdown()
        if killed:
            print(f"(SIGKILL after shutdown for {len(killed)} Ray processes)", file=sys.stderr)


if __name__ == "__main__":
    main()
