"""sync vs one_step_off vs async pipelines: training steps per second on a long-tailed workload.

Same rollout source (:class:`LocalRollout`: the real Collector), same envs, same tool latencies, same
update time, one process; only ``trainer.pipeline`` changes. The parts that cannot run here at scale
are fakes, named as such:

* ``TailEngine`` (fake engine): a scripted reply whose length is drawn from a log-normal distribution
  (median ``--len-median`` tokens, sigma ``--len-sigma``, capped by ``max_tokens``) seeded by the
  request's sampling seed; it costs ``--token-ms`` per token in one of ``--slots`` decode slots (a
  server's running batch), so generation has a finite throughput and a long tail.
* ``LatencyEnv`` (benchmarks/collector_common.py): every turn calls a real tool whose latency is
  log-normal (median ``--tool-median`` s, sigma 1.5, capped at 3 s): a heavy tail like sandboxes.
* ``SleepLearner`` (fake learner): an update takes ``--update-s`` seconds in a worker thread (sleep), so
  the figure measures the overlap, not the model.

Each configuration runs ``--steps`` steps ``--repeats`` times; printed: median steps/s and the ratio to
sync, plus the async runs' staleness.

    .venv/bin/python benchmarks/async_pipeline.py
    .venv/bin/python benchmarks/async_pipeline.py --steps 6 --repeats 1     # quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from collector_common import LatencyEnv

from chatgym.trainer.engines.base import Completion
from chatgym.trainer.pipeline import Pipeline, PipelineOptions
from chatgym.trainer.rollout.collector import Collector, CollectorConfig
from chatgym.trainer.rollout.source import LocalRollout, RolloutRequest


class TailEngine:
    """Fake engine (see the module docstring)."""

    def __init__(self, tokenizer: Any, slots: int, token_s: float, len_median: float, len_sigma: float):
        self.words = tokenizer.encode(
            " Looking up the next record in the table now.", add_special_tokens=False
        )
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.slots = asyncio.Semaphore(slots)
        self.token_s, self.len_median, self.len_sigma = token_s, len_median, len_sigma
        self.weight_version = 0
        self.tokens = 0

    async def generate(self, prompt_ids: list[int], params: Any) -> Completion:
        rng = np.random.default_rng([params.seed or 0, len(prompt_ids)])
        n = int(min(params.max_tokens - 1, max(1, rng.lognormal(math.log(self.len_median), self.len_sigma))))
        ids = [*(self.words * (n // len(self.words) + 1))[:n], self.eos]
        async with self.slots:
            await asyncio.sleep(len(ids) * self.token_s)
        self.tokens += len(ids)
        return Completion(ids, [-1.0] * len(ids), "stop", "", stop_reason=self.eos)

    def update_weights(self, weights: Any) -> None:
        for _ in weights:
            pass

    async def close(self) -> None:
        return None


class SleepLearner:
    """Fake learner: each update takes ``update_s`` seconds (see the module docstring)."""

    def __init__(self, update_s: float):
        self.update_s = update_s
        self.version = 0

    def train_on(self, trajs: Any) -> dict[str, float]:
        time.sleep(self.update_s)
        self.version += 1
        return {}

    def export_weights(self, dtype: Any = None) -> Any:
        yield "w", self.version


async def run_once(args: argparse.Namespace, tokenizer: Any, mode: str, max_staleness: int) -> dict[str, Any]:
    engine = TailEngine(tokenizer, args.slots, args.token_ms / 1000, args.len_median, args.len_sigma)
    cfg = CollectorConfig(max_tokens=args.max_tokens, max_response_tokens=4096, max_model_len=8192)
    rollout = LocalRollout(engine, Collector(engine, tokenizer, cfg))
    env = functools.partial(LatencyEnv, n_turns=args.turns, median_s=args.tool_median, cap_s=3.0)
    P, G = args.groups, args.group_size

    def request_for(step: int) -> RolloutRequest:
        return RolloutRequest(
            env,  # type: ignore[arg-type]  (a factory: the collector takes env ids or callables)
            tasks=tuple(range(step * P, step * P + P)),
            group_size=G,
            reset_seed=step,
            sampling_seed=1000 + step,
            step=step,
        )

    pipe = Pipeline(rollout, SleepLearner(args.update_s), request_for, PipelineOptions(mode, max_staleness))
    ages: list[float] = []
    t0 = time.perf_counter()
    async with contextlib.aclosing(pipe.run(0, args.steps)) as steps:
        async for result in steps:
            ages.append(result.metrics.get("staleness/mean", 0.0))
    wall = time.perf_counter() - t0
    rollout.close()
    return {"steps_per_s": args.steps / wall, "wall_s": wall, "staleness_mean": statistics.mean(ages)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--groups", type=int, default=8, help="tasks per step (P)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--turns", type=int, default=2, help="tool turns per episode")
    ap.add_argument("--slots", type=int, default=32, help="decode slots of the fake engine")
    ap.add_argument("--token-ms", type=float, default=2.0)
    ap.add_argument("--len-median", type=float, default=32.0)
    ap.add_argument("--len-sigma", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--tool-median", type=float, default=0.05)
    ap.add_argument("--update-s", type=float, default=0.5)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    from chatgym.trainer.rollout.tokenizer import get_tokenizer

    tokenizer = get_tokenizer("smollm2")
    configs = [("sync", 0), ("one_step_off", 0), ("async", 1), ("async", 2)]
    results: dict[str, Any] = {"args": vars(args), "load_avg_before": os.getloadavg(), "runs": {}}
    for mode, staleness in configs:
        name = mode if mode != "async" else f"async(max_staleness={staleness})"
        runs = [asyncio.run(run_once(args, tokenizer, mode, staleness)) for _ in range(args.repeats)]
        results["runs"][name] = runs
    results["load_avg_after"] = os.getloadavg()
    base = statistics.median(r["steps_per_s"] for r in results["runs"]["sync"])
    print(f"{'pipeline':28s} {'steps/s (median)':>16s} {'x sync':>7s} {'staleness':>9s}  runs (steps/s)")
    for name, runs in results["runs"].items():
        med = statistics.median(r["steps_per_s"] for r in runs)
        age = statistics.median(r["staleness_mean"] for r in runs)
        each = ", ".join(f"{r['steps_per_s']:.3f}" for r in runs)
        print(f"{name:28s} {med:16.3f} {med / base:7.2f} {age:9.2f}  {each}")
    print(f"load average before {results['load_avg_before']}, after {results['load_avg_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
