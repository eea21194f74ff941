"""The transformers engine's continuous batching under collector-like traffic.

Clients (episodes) start a few milliseconds apart and run several turns each: generate a reply, wait
for a "tool" (a seeded log-normal latency), then generate the next turn from the longer chat. A
request that arrives while rows decode joins at the next decode step. Each request's sampling seed
makes its tokens independent of its batch, so every run generates the same tokens (the script prints
a digest of them) and the wall times compare like for like.

    python benchmarks/hf_continuous.py                   # SmolLM2, fp32, CPU
    python benchmarks/hf_continuous.py --clients 32 --turns 3 --threads 2

Prints each run's wall time and tokens/s, the median, and the tokens' digest.

Static batching (a request waits until the running batch is empty) is not an engine option. To
compare with it, run this benchmark from a commit that still has it, which runs both policies
alternating in one process: ``git worktree add /tmp/old <tag>``, then
``python /tmp/old/benchmarks/hf_continuous.py`` with the same arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
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
    parser.add_argument("--repeats", type=int, default=2, help="timed runs (after one warm-up run)")
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
    engine = TransformersEngine(model, tokenizer, max_batch_size=64)
    topics = ["a lighthouse", "the moon", "a lost key", "bread", "a storm", "a robot", "tea", "a river"]

    async def episode(i: int) -> tuple[list[list[int]], int]:
        rng = random.Random(i)  # the same start, latencies and seeds in every run
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

    async def run() -> tuple[float, int, list[list[list[int]]]]:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(episode(i) for i in range(args.clients)))
        wall = time.perf_counter() - t0
        return wall, sum(n for _, n in results), [r for r, _ in results]

    async def bench() -> None:
        await run()  # warm-up (first-call costs), not counted
        walls: list[float] = []
        replies: list = []
        for rep in range(args.repeats):
            steps, prefills = engine.decode_steps, engine.batches_run
            wall, tokens, replies = await run()
            walls.append(wall)
            print(
                f"run {rep + 1}: {wall:6.2f} s, {tokens} tokens, {tokens / wall:7.1f} tok/s, "
                f"{engine.decode_steps - steps} decode steps, {engine.batches_run - prefills} prefills",
                flush=True,
            )
        print(f"median wall: {statistics.median(walls):.2f} s")
        print(
            "tokens digest (sha256 of every episode's reply ids): "
            f"{hashlib.sha256(json.dumps(replies).encode()).hexdigest()[:16]}"
        )
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
