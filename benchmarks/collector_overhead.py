"""Collector overhead: generated tokens/s through the collector vs raw ``engine.generate``.

Same prompts (``OneTurnEnv``: one user question per episode, rendered with the chat template), same
sampling settings (greedy, ``max_tokens``, the model's EOS ids as stop ids), same engine. The raw side
sends every prompt to ``engine.generate`` at once (``asyncio.gather``); the collector side runs the
same tasks as episodes (env creation, reset, rendering, generate, decode, step, trajectory assembly).
Runs come in pairs in alternating order so drift in machine load hits both; the median of the
per-pair ratios is reported, with process CPU seconds beside wall time.

With ``--engine replay`` (a scripted engine with no compute) the difference is the collector's own
cost per episode, printed in milliseconds.

    .venv/bin/python benchmarks/collector_overhead.py --engine hf --episodes 32 --max-tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from collector_common import OneTurnEnv, fmt_runs, make_engine, median

from chatgym.trainer.chat.delta import ChatRenderer
from chatgym.trainer.engines.base import SamplingParams
from chatgym.trainer.rollout.collector import Collector, RolloutConfig


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="hf", help="hf | hf-random | vllm | replay")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads of the hf engine")
    ap.add_argument("--replay-delay", type=float, default=0.0)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=6, help="pairs of runs")
    args = ap.parse_args()

    from chatgym.trainer.chat.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(args.model)
    engine = make_engine(
        args.engine,
        args.model,
        tokenizer,
        device=args.device,
        dtype=args.dtype,
        delay_s=args.replay_delay,
        threads=args.threads,
    )
    cfg = RolloutConfig(
        temperature=0.0,
        max_tokens=args.max_tokens,
        max_response_tokens=args.max_tokens,
        max_model_len=4096,
        episode_timeout_s=None,
        max_concurrent_episodes=max(args.episodes, 1),
    )
    collector = Collector(engine, tokenizer, cfg)
    renderer = ChatRenderer(tokenizer)
    env = OneTurnEnv()
    prompts = [renderer.prompt_ids(env.initial_messages(env.tasks[i]), None) for i in range(args.episodes)]
    # Exactly what the collector asks for (the per-turn cap is min(max_tokens, budgets) = max_tokens).
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=0.0, stop_token_ids=collector.eos_token_ids
    )

    async def raw() -> tuple[int, float]:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(engine.generate(list(p), params) for p in prompts))
        return sum(len(o.token_ids) for o in outs), time.perf_counter() - t0

    async def through_collector() -> tuple[int, float]:
        t0 = time.perf_counter()
        trajs = await collector.collect(OneTurnEnv, list(range(args.episodes)))
        wall = time.perf_counter() - t0
        if any(t.failed for t in trajs):
            raise RuntimeError([t.error for t in trajs if t.failed][:3])
        return sum(t.response_tokens for t in trajs), wall

    await raw()  # warm-up (first batch pays allocation / compilation)
    # Pairs of runs in alternating order (raw first, then collector first, ...), so drift in a shared
    # machine's load hits both sides; each pair gives one ratio. Process CPU seconds (all threads) are
    # reported too: they move far less than wall time when other jobs compete for the cores.
    pairs = []
    for k in range(args.repeats):
        sides = [("raw", raw), ("collector", through_collector)]
        result = {}
        for name, fn in sides if k % 2 == 0 else sides[::-1]:
            c0 = time.process_time()
            n, wall = await fn()
            result[name] = (n, wall, time.process_time() - c0)
        pairs.append(result)
    await engine.close()
    collector.close()

    raw_tps = [p["raw"][0] / p["raw"][1] for p in pairs]
    col_tps = [p["collector"][0] / p["collector"][1] for p in pairs]
    ratios = [c / r for c, r in zip(col_tps, raw_tps, strict=True)]
    cpu_ratio = [p["collector"][2] / p["raw"][2] for p in pairs]
    print(
        f"collector_overhead: engine={args.engine} model={args.model} dtype={args.dtype} "
        f"episodes={args.episodes} max_tokens={args.max_tokens} pairs={args.repeats} "
        f"(load average {os.getloadavg()[0]:.2f})"
    )
    for name in ("raw", "collector"):
        toks = [p[name][0] for p in pairs]
        print(
            f"{name:>9}: tokens {toks[0] if len(set(toks)) == 1 else toks}, wall s [{fmt_runs([p[name][1] for p in pairs])}], "
            f"cpu s [{fmt_runs([p[name][2] for p in pairs])}]"
        )
    print(f"tok/s medians: raw {median(raw_tps):.1f}, collector {median(col_tps):.1f}")
    print(f"collector / raw tok/s per pair: [{fmt_runs(ratios)}]")
    print(f"overhead (1 - median pair ratio): {100 * (1 - median(ratios)):.2f}%  (target <= 5%)")
    print(
        f"collector / raw process CPU seconds per pair: [{fmt_runs(cpu_ratio)}], median {median(cpu_ratio):.3f}"
    )
    extra_ms = 1000 * median([p["collector"][1] - p["raw"][1] for p in pairs]) / args.episodes
    print(f"collector wall minus raw wall, per episode (median over pairs): {extra_ms:.3f} ms")


if __name__ == "__main__":
    asyncio.run(main())
