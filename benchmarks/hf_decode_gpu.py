"""Decode throughput of the transformers engine's two paths and of ``model.generate`` (TRL's path).

SmolLM2-135M (real weights with ``--real-weights``, else its shape with random weights), bf16,
prompts of 40-120 tokens, 128 new tokens each, sampling at temperature 1 (EOS ignored so every row
runs the full 128 tokens: the figure is decode speed, not the model's reply lengths):

* ``engine static``  — ``TransformersEngine(decode="static")``: per-slot KV cache + CUDA graphs, the
  step through :mod:`chatgym.trainer.engines.hf_fused` (the default);
* ``engine async``   — the same with ``async_scheduling`` (step ``k + 1`` queued before step ``k``'s
  ids are read back);
* ``engine layers``  — ``decode="static"`` through the model's own layers (``fused_step=False``);
* ``engine dynamic`` — ``TransformersEngine(decode="dynamic")``: padded ``DynamicCache`` batch;
* ``generate``       — ``model.generate`` with the dynamic cache (what TRL's GRPOTrainer calls).

Each path runs the same prompts ``--repeats`` times after one warm-up round (which pays graph capture
/ allocator growth; reported as ``first_s``). Prints tokens/s, ms per decode step and the ratio of each
to ``generate``. Also checks token-exactness of the static path: greedy ids of a few prompts equal the
dynamic path's, and their logprobs match a full forward pass of the same weights.

``--seeded`` gives every request its own ``seed`` (as the trainer does: one generator per row) instead
of the engine's shared generator.

    python benchmarks/hf_decode_gpu.py --real-weights --batch 64 256
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

NEW_TOKENS = 128


def make_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(rng.randint(40, 120))] for _ in range(n)]


ENGINE_MODES = {
    "static": {"decode": "static"},
    "async": {"decode": "static", "async_scheduling": True},
    "layers": {"decode": "static", "fused_step": False},
    "dynamic": {"decode": "dynamic"},
}


async def run_engine(engine, prompts, params) -> tuple[float, int]:
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)))
    return time.perf_counter() - t0, sum(len(o.token_ids) for o in outs)


def run_generate(model, prompts, pad_id) -> tuple[float, int]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad_id,
    )
    torch.cuda.synchronize()
    return time.perf_counter() - t0, int((out.shape[1] - width) * out.shape[0])


def exactness(model, tokenizer) -> dict:
    """Greedy ids of static vs dynamic, and static logprobs vs a full forward pass (bf16)."""
    import torch

    from chatgym.trainer.engines import SamplingParams
    from chatgym.trainer.engines.hf import TransformersEngine

    prompts = make_prompts(8, model.config.vocab_size, 7)
    params = SamplingParams(max_tokens=32, temperature=0)
    res = {}
    for mode in ("static", "dynamic"):
        eng = TransformersEngine(model, tokenizer, decode=mode, eos_token_ids=[], max_model_len=512)
        res[mode] = asyncio.run(_gather(eng, prompts, params))
    same = sum(a.token_ids == b.token_ids for a, b in zip(res["static"], res["dynamic"], strict=True))
    worst = 0.0
    for p, c in zip(prompts, res["static"], strict=True):
        ids = torch.tensor([p + c.token_ids], device=model.device)
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids, device=model.device)[:, None])[:, 0]
        worst = max(worst, float((ref - torch.tensor(c.logprobs, device=model.device)).abs().max()))
    return {"greedy_same_as_dynamic": f"{same}/{len(prompts)}", "max_abs_logprob_diff_vs_forward": worst}


async def _gather(engine, prompts, params):
    try:
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    finally:
        await engine.close()


def main() -> None:
    import torch

    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines import SamplingParams
    from chatgym.trainer.engines.hf import TransformersEngine
    from chatgym.trainer.models.packaged import load_model
    from chatgym.trainer.models.random_init import random_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--real-weights", action="store_true")
    ap.add_argument("--skip-generate", action="store_true")
    ap.add_argument("--seeded", action="store_true", help="a seed per request (the trainer's way)")
    ap.add_argument("--modes", nargs="+", default=list(ENGINE_MODES), choices=list(ENGINE_MODES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    tokenizer = get_tokenizer("smollm2")
    if args.real_weights:
        model = load_model("smollm2", dtype="bfloat16", device="cuda")
    else:
        model = random_model("smollm2", dtype="bfloat16", device="cuda")
    model.eval()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print("exactness:", exactness(model, tokenizer))
    rows = []
    for batch in args.batch:
        prompts = make_prompts(batch, model.config.vocab_size, batch)
        params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=i if args.seeded else None)
                  for i in range(batch)]
        results = {}
        for mode in args.modes:
            eng = TransformersEngine(
                model, tokenizer, max_batch_size=batch, eos_token_ids=[], max_model_len=512, **ENGINE_MODES[mode]
            )
            first, _ = asyncio.run(run_engine(eng, prompts, params))
            times = []
            for _ in range(args.repeats):
                dt, toks = asyncio.run(run_engine(eng, prompts, params))
                times.append(dt)
            asyncio.run(eng.close())
            results[f"engine {mode}"] = (statistics.median(times), toks, first)
        if not args.skip_generate:
            first, _ = run_generate(model, prompts, 0)
            times = [run_generate(model, prompts, 0) for _ in range(args.repeats)]
            results["generate"] = (statistics.median(t for t, _ in times), times[0][1], first)
        base = results.get("generate") or next(iter(results.values()))
        for name, (dt, toks, first) in results.items():
            rows.append(
                f"batch {batch:4d}  {name:15s} {toks / dt:10,.0f} tok/s  {1000 * dt / NEW_TOKENS:7.2f} ms/step"
                f"  first {first:6.2f} s  x{(toks / dt) / (base[1] / base[0]):.2f} vs "
                f"{'generate' if 'generate' in results else next(iter(results))}"
            )
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
