"""Async collector vs a synchronous barrier loop, same engine, same envs, same tool latencies.

The barrier loop is the classic batched rollout: every turn, generate for all live episodes as one
batch, then step all their envs and wait for the slowest tool before the next turn. The collector runs
each episode as its own task, so a slow tool holds up only its own episode.

Workload: ``LatencyEnv`` (benchmarks/collector_common.py): every assistant turn goes to a real tool
whose latency is log-normal (median 0.1 s, sigma 1.5, capped at 10 s by default) — a heavy tail like
sandboxes and web search. Latency of (task, turn) is fixed by a seed, so both loops meet the same
latencies; both build token-exact trajectories with the same chat-template deltas, and the script
checks that they produce the same token ids (greedy decoding).

    .venv/bin/python benchmarks/collector_vs_barrier.py --engine replay
    .venv/bin/python benchmarks/collector_vs_barrier.py --engine hf --episodes 32 --max-tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from collector_common import LatencyEnv, fmt_runs, make_engine, median

from chatgym.trainer.engines.base import SamplingParams
from chatgym.trainer.rollout.chat_delta import ChatRenderer, closing_ids
from chatgym.trainer.rollout.collector import Collector, CollectorConfig
from chatgym.trainer.rollout.template_probe import probe_template


async def barrier_rollout(
    engine: Any, tokenizer: Any, eos: tuple[int, ...], make_env: Any, n: int, max_tokens: int
):
    """Batched turns with a barrier; returns (token ids per episode, wall seconds)."""
    renderer = ChatRenderer(tokenizer)
    probe = probe_template(renderer, eos)
    eos_set = set(eos)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop_token_ids=eos)
    t0 = time.perf_counter()
    envs = [make_env() for _ in range(n)]
    resets = await asyncio.gather(*(e.areset(options={"task_index": i}) for i, e in enumerate(envs)))
    history = [list(obs) for obs, _ in resets]
    tools = [info.get("tools") or None for _, info in resets]
    ids = [renderer.prompt_ids(h, t) for h, t in zip(history, tools, strict=True)]
    live = list(range(n))
    while live:
        completions = await asyncio.gather(*(engine.generate(list(ids[i]), params) for i in live))
        texts = []
        for i, c in zip(live, completions, strict=True):
            new = list(c.token_ids)
            ids[i].extend(new)
            ended = bool(new) and new[-1] in eos_set
            text = tokenizer.decode(new[:-1] if ended else new, skip_special_tokens=False)
            history[i].append({"role": "assistant", "content": text})
            texts.append(text)
        steps = await asyncio.gather(*(envs[i].astep(t) for i, t in zip(live, texts, strict=True)))
        still = []
        for i, c, (obs, _r, term, trunc, _info) in zip(live, completions, steps, strict=True):
            if term or trunc:
                continue
            delta = renderer.delta_ids(history[i], obs, tools[i], probe)
            history[i].extend(obs)
            ids[i].extend(closing_ids(probe, c.token_ids) + delta)
            still.append(i)
        live = still
    wall = time.perf_counter() - t0
    for e in envs:
        await e.aclose()
    return ids, wall


async def collector_rollout(collector: Collector, make_env: Any, n: int):
    t0 = time.perf_counter()
    trajs = await collector.collect(make_env, list(range(n)))
    wall = time.perf_counter() - t0
    failed = [t.error for t in trajs if t.failed]
    if failed:
        raise RuntimeError(f"collector episodes failed: {failed[:3]}")
    return [t.token_ids for t in trajs], wall


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="replay", help="replay | hf | hf-random | vllm")
    ap.add_argument("--model", default="smollm2", help="model name or directory (hf-random: its config)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads of the hf engine")
    ap.add_argument(
        "--replay-delay", type=float, default=0.02, help="replay engine: seconds per generate call"
    )
    ap.add_argument("--episodes", type=int, default=256, help="episodes per batch (e.g. 64 tasks x G=4)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per turn")
    ap.add_argument("--median", type=float, default=0.1, help="tool latency median, seconds")
    ap.add_argument("--sigma", type=float, default=1.5, help="tool latency log-normal sigma")
    ap.add_argument("--cap", type=float, default=10.0, help="tool latency cap, seconds")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", action="store_true", help="one short untimed round first (GPU warm-up)")
    args = ap.parse_args()

    from chatgym.trainer.rollout.tokenizer import get_tokenizer

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
    n, seeds = args.episodes, list(range(args.repeats))

    def env_factory(seed: int):
        return lambda: LatencyEnv(args.turns, args.median, args.sigma, args.cap, latency_seed=seed)

    cfg = CollectorConfig(
        temperature=0.0,
        max_tokens=args.max_tokens,
        max_response_tokens=args.max_tokens * args.turns,
        max_model_len=8192,
        episode_timeout_s=None,
        max_concurrent_episodes=max(n, 1),
    )
    collector = Collector(engine, tokenizer, cfg)
    eos = collector.eos_token_ids
    if args.warmup:  # one short untimed round through both loops (CUDA context, kernels, allocator)
        warm = lambda: LatencyEnv(1, 0.001, 0.0, 0.01, latency_seed=999)  # noqa: E731
        await barrier_rollout(engine, tokenizer, eos, warm, n, args.max_tokens)
        await collector_rollout(collector, warm, n)

    barrier_s, async_s, same, lat_sum, lat_max, bound_barrier, bound_async = [], [], [], [], [], [], []
    for seed in seeds:  # each repeat draws new latencies; both loops see the same ones
        probe_env = LatencyEnv(args.turns, args.median, args.sigma, args.cap, latency_seed=seed)
        lat = [[probe_env.latency(i, t) for t in range(1, args.turns + 1)] for i in range(n)]
        lat_sum.append(sum(map(sum, lat)))
        lat_max.append(max(map(max, lat)))
        bound_barrier.append(sum(max(lat[i][t] for i in range(n)) for t in range(args.turns)))
        bound_async.append(max(sum(row) for row in lat))
        ids_b, wb = await barrier_rollout(engine, tokenizer, eos, env_factory(seed), n, args.max_tokens)
        ids_a, wa = await collector_rollout(collector, env_factory(seed), n)
        barrier_s.append(wb)
        async_s.append(wa)
        same.append(sum(a == b for a, b in zip(ids_a, ids_b, strict=True)))
    await engine.close()
    collector.close()

    engine_desc = (
        f"{args.engine} ({args.replay_delay} s per call)" if args.engine == "replay" else args.engine
    )
    print(
        f"collector_vs_barrier: engine={engine_desc} model={args.model} episodes={n} turns={args.turns} "
        f"max_tokens/turn={args.max_tokens} repeats={args.repeats}"
    )
    print(
        f"tool latency: log-normal median {args.median} s, sigma {args.sigma}, cap {args.cap} s; per repeat: "
        f"total {fmt_runs(lat_sum)} s, largest {fmt_runs(lat_max)} s"
    )
    print(
        f"latency-only bounds per repeat: barrier sum_t max_i = {fmt_runs(bound_barrier)} s; "
        f"async max_i sum_t = {fmt_runs(bound_async)} s"
    )
    print(f"barrier loop    wall s: median {median(barrier_s):.3f}  [{fmt_runs(barrier_s)}]")
    print(f"async collector wall s: median {median(async_s):.3f}  [{fmt_runs(async_s)}]")
    ratios = [b / a for b, a in zip(barrier_s, async_s, strict=True)]
    print(f"speed-up per repeat (barrier / async): {fmt_runs(ratios)}")
    print(f"speed-up (barrier / async, medians): {median(barrier_s) / median(async_s):.2f}x  (target >= 4x)")
    print(f"identical token ids (greedy) per repeat: {same} of {n}")


if __name__ == "__main__":
    asyncio.run(main())
