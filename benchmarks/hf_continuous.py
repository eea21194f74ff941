"""Continuous vs static batching in the transformers engine, under collector-like traffic.

Clients (episodes) start a few milliseconds apart and run several turns each: generate a reply, wait
for a "tool" (a seeded log-normal latency), then generate the next turn from the longer chat. With
static batching a request that arrives while a batch decodes waits for the whole batch to end; with
continuous batching it joins at the next decode step. Both policies run in this process on the same
model, alternating (static, continuous, static, ...), with the same seeded requests: each request's
sampling seed makes its tokens independent of its batch, so both policies generate the same tokens
(the script counts the requests whose tokens agree) and the wall times compare like for like.

    python benchmarks/hf_continuous.py                   # SmolLM2, fp32, CPU
    python benchmarks/hf_continuous.py --clients 32 --turns 3 --threads 2

Prints each run's wall time and tokens/s, the medians, and the ratio continuous / static.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default=None)
    parser.add_argument("--clients", type=int, default=16, help="concurrent episodes")
    parser.add_argument("--turns", type=int, default=2, help="generate calls per episode")
    parser.add_argument("--max-tokens", type=int, default=32, help="per turn")
    parser.add_argument("--stagger-ms", type=float, default=20.0, help="gap between episode starts")
    parser.add_argument("--tool-ms", type=float, default=50.0, help="median tool latency between turns")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each policy (alternating)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()

    import torch

    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines import SamplingParams
    from chatgym.trainer.engines.hf import TransformersEngine
    from chatgym.trainer.models.packaged import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = get_tokenizer(args.model)
    model = load_model(args.model, dtype=args.dtype, device=device)
    engines = {
        policy: TransformersEngine(model, tokenizer, max_batch_size=64, continuous=policy == "continuous")
        for policy in ("static", "continuous")
    }
    topics = ["a lighthouse", "the moon", "a lost key", "bread", "a storm", "a robot", "tea", "a river"]

    async def episode(engine: TransformersEngine, i: int) -> tuple[list[list[int]], int]:
        rng = random.Random(i)  # the same start, latencies and seeds for both policies
        await asyncio.sleep(i * args.stagger_ms / 1000)
        chat = [{"role": "user", "content": f"Write a short story about {topics[i % len(topics)]}."}]
        replies, tokens = [], 0
        for turn in range(args.turns):
            ids = tokenizer.apply_chat_template(
                chat, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=1000 * i + turn)
            out = await engine.generate(ids, params)
            replies.append(out.token_ids)
            tokens += len(out.token_ids)
            chat += [{"role": "assistant", "content": out.text}, {"role": "user", "content": "Go on."}]
            await asyncio.sleep(rng.lognormvariate(0, 0.7) * args.tool_ms / 1000)
        return replies, tokens

    async def run(policy: str) -> tuple[float, int, list[list[list[int]]]]:
        engine = engines[policy]
        t0 = time.perf_counter()
        results = await asyncio.gather(*(episode(engine, i) for i in range(args.clients)))
        wall = time.perf_counter() - t0
        return wall, sum(n for _, n in results), [r for r, _ in results]

    async def bench() -> None:
        await run("continuous")  # warm-up (first-call costs), not counted
        walls: dict[str, list[float]] = {"static": [], "continuous": []}
        replies: dict[str, list] = {}
        for rep in range(args.repeats):
            for policy in ("static", "continuous"):
                engine = engines[policy]
                steps, prefills = engine.decode_steps, engine.batches_run
                wall, tokens, replies[policy] = await run(policy)
                walls[policy].append(wall)
                print(
                    f"run {rep + 1} {policy:10s}: {wall:6.2f} s, {tokens} tokens, {tokens / wall:7.1f} tok/s, "
                    f"{engine.decode_steps - steps} decode steps, {engine.batches_run - prefills} prefills",
                    flush=True,
                )
        same = sum(a == b for a, b in zip(replies["static"], replies["continuous"], strict=True))
        print(f"episodes with identical tokens under both policies: {same}/{args.clients}")
        med = {p: statistics.median(w) for p, w in walls.items()}
        print(f"median wall: static {med['static']:.2f} s, continuous {med['continuous']:.2f} s")
        print(
            f"ratio (static wall / continuous wall, = continuous speed-up): {med['static'] / med['continuous']:.2f}x"
        )
        for engine in engines.values():
            await engine.close()

    print(
        f"{args.model} {args.dtype} on {device}, torch threads {torch.get_num_threads()}; {args.clients} "
        f"episodes x {args.turns} turns x <= {args.max_tokens} tokens, starts {args.stagger_ms} ms apart, "
        f"tool latency median {args.tool_ms} ms",
        flush=True,
    )
    asyncio.run(bench())


if __name__ == "__main__":
    main()
