"""Collector overhead: generated tokens/s through the collector vs raw ``engine.generate``.

Same prompts (``OneTurnEnv``: one user question per episode, rendered with the chat template), same
sampling settings (greedy, ``max_tokens``, the model's EOS ids as stop ids), same engine. The raw side
sends every prompt to ``engine.generate`` at once (``asyncio.gather``); the collector side runs the
same tasks as episodes (env creation, reset, rendering, generate, decode, step, trajectory assembly).
Runs alternate (raw, collector, raw, ...) so drift in machine load hits both; medians are compared.

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

from chatgym.trainer.chat_delta import ChatRenderer
from chatgym.trainer.engines.base import SamplingParams
from chatgym.trainer.rollout import Collector, CollectorConfig


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="hf", help="hf | hf-random | vllm | replay")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--replay-delay", type=float, default=0.0)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from chatgym.trainer.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(args.model)
    engine = make_engine(
        args.engine, args.model, tokenizer, device=args.device, dtype=args.dtype, delay_s=args.replay_delay
    )
    cfg = CollectorConfig(
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
    raw_tps, col_tps, raw_s, col_s, raw_tok, col_tok = [], [], [], [], [], []
    for _ in range(args.repeats):
        n, s = await raw()
        raw_tok.append(n)
        raw_s.append(s)
        raw_tps.append(n / s)
        n, s = await through_collector()
        col_tok.append(n)
        col_s.append(s)
        col_tps.append(n / s)
    await engine.close()
    collector.close()

    r, c = median(raw_tps), median(col_tps)
    print(
        f"collector_overhead: engine={args.engine} model={args.model} dtype={args.dtype} "
        f"episodes={args.episodes} max_tokens={args.max_tokens} repeats={args.repeats}"
    )
    print(f"raw engine.generate : tokens {raw_tok}, wall s [{fmt_runs(raw_s)}], tok/s median {r:.1f}")
    print(f"through collector   : tokens {col_tok}, wall s [{fmt_runs(col_s)}], tok/s median {c:.1f}")
    print(f"overhead: {100 * (1 - c / r):.2f}% of raw tokens/s  (target <= 5%)")
    extra_ms = 1000 * (median(col_s) - median(raw_s)) / args.episodes
    print(f"collector wall minus raw wall, per episode: {extra_ms:.3f} ms")


if __name__ == "__main__":
    asyncio.run(main())
