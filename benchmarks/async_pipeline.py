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

``--main-job`` instead trains the README's main job (examples/configs/math_grpo.yaml: SmolLM2-135M on
Math-v0, vLLM on CPU) once per pipeline, all three runs in this process on one engine (built and
compiled once; each run starts from the same initial weights), and records held-out accuracy against
wall-clock seconds since the run started (evaluation time included: it is part of what a user waits
for). Writes ``<out>/main_job.json`` and ``<out>/accuracy_vs_wallclock.png``; the runs themselves
(checkpoints) go under ``--runs-dir``.

    .venv/bin/python benchmarks/async_pipeline.py
    .venv/bin/python benchmarks/async_pipeline.py --steps 6 --repeats 1     # quick
    .venv/bin/python benchmarks/async_pipeline.py --main-job train.max_steps=6 env.eval_tasks=32 env.eval_every=2
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
from chatgym.trainer.rollout.collector import Collector, RolloutConfig
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
    cfg = RolloutConfig(max_tokens=args.max_tokens, max_response_tokens=4096, max_model_len=8192)
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


def main_job(overrides: list[str], out: str, modes: list[str], runs_dir: str) -> None:
    """The main job once per pipeline on one shared engine (see the module docstring)."""
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.engines import build_engine
    from chatgym.trainer.models.packaged import load_model_path
    from chatgym.trainer.train import Trainer

    os.makedirs(out, exist_ok=True)
    base = load_config("examples/configs/math_grpo.yaml", ["train.progress=false", *overrides])
    path = load_model_path(base.model.path)
    tokenizer = get_tokenizer(path)
    engine = build_engine(base.engine, path, tokenizer, base.train.seed, base.rollout.max_model_len)
    results: dict[str, Any] = {"overrides": overrides, "runs": {}}
    try:
        for mode in modes:
            cfg = load_config(
                "examples/configs/math_grpo.yaml",
                [
                    "train.progress=false",
                    *overrides,
                    f"trainer.pipeline={mode}",
                    f"train.output_dir={runs_dir}/{mode}",
                ],
            )
            load0 = os.getloadavg()
            t0 = time.perf_counter()
            trainer = Trainer(cfg, engine=engine)
            points: list[dict[str, float]] = []
            log = trainer.metrics.log

            def timed(step: int, metrics: Any, log: Any = log, points: list = points, t0: float = t0) -> None:
                row = {"step": step, "wall_s": time.perf_counter() - t0}
                for key in ("eval/accuracy", "reward/mean", "timing/step_s", "staleness/mean"):
                    if key in metrics:
                        row[key] = float(metrics[key])
                points.append(row)
                log(step, metrics)

            trainer.metrics.log = timed  # type: ignore[method-assign]
            summary = trainer.train()
            trainer.rollout.close()  # not trainer.close(): the engine is shared by the next run
            trainer.metrics.close()
            trainer.loop.close()
            results["runs"][mode] = {
                "points": points,
                "wall_s": time.perf_counter() - t0,
                "train_wall_s": summary["wall_s"],
                "load_avg_before": load0,
                "load_avg_after": os.getloadavg(),
            }
            print(mode, json.dumps(results["runs"][mode]), flush=True)
            with open(os.path.join(out, "main_job.json"), "w") as f:
                json.dump(results, f, indent=2)
    finally:
        asyncio.run(engine.close())
    plot_main_job(results, os.path.join(out, "accuracy_vs_wallclock.png"))


def plot_main_job(results: dict[str, Any], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, run in results["runs"].items():
        pts = [p for p in run["points"] if "eval/accuracy" in p]
        ax.plot([p["wall_s"] / 60 for p in pts], [p["eval/accuracy"] for p in pts], "o-", label=mode)
        for p in pts:
            ax.annotate(
                str(p["step"]),
                (p["wall_s"] / 60, p["eval/accuracy"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.set_xlabel("wall-clock minutes since the run started (evaluations included; labels: step)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title("Main job (SmolLM2-135M, Math-v0): held-out accuracy vs wall clock", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    if "--main-job" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--main-job", action="store_true")
        ap.add_argument("--out", default="benchmarks/results/async_pipeline")
        ap.add_argument("--modes", default="sync,one_step_off,async")
        ap.add_argument(
            "--runs-dir", default="/tmp/chatgym_async_pipeline", help="the runs' output dirs (checkpoints)"
        )
        ap.add_argument("overrides", nargs="*", help="config overrides, key.sub=value")
        a = ap.parse_args()
        main_job(a.overrides, a.out, a.modes.split(","), a.runs_dir)
        return
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

    from chatgym.trainer.chat.tokenizer import get_tokenizer

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
