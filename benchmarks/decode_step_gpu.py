"""The static engine's decode step on one GPU, captured as a CUDA graph, three ways: through the
model's own layers (``layers``), through :mod:`chatgym.trainer.engines.hf_fused` (``fused``, the
engine's default), and (``--compile``) the layers' step compiled by ``torch.compile`` (Inductor, the
whole step, row and column counts dynamic) then captured; and the host-side sampling per step. The
engine itself does not compile (``benchmarks/results/vs_trl_h200_curve_subprocess/README.md``: 140 s, and 91 s
more at the 512-column bucket). Per mode it also counts the CUDA kernels one step launches (profiler,
one eager step at 64 rows x 256 columns).

SmolLM2-135M-Instruct (real weights; ``--random`` uses its shape with random weights), bf16, 64 slots of
``max_len`` 512, 64 prompts of 40-120 random tokens prefilled. For each mode and bucket (rows,
columns) it prints the first call (compilation + capture, seconds), the replayed step (ms, CUDA events
around ``--iters`` replays) and the largest difference of the compiled step's logits from the eager
step's (same state). Then the sampling that follows each step in the engine (``hf_sampling.sample`` at
temperature 1 with a generator per row, ``log_softmax`` + gather, one read back): ms per step.

    python benchmarks/decode_step_gpu.py             # layers vs fused
    python benchmarks/decode_step_gpu.py --compile   # and the compiled layers (minutes of compilation)
"""

from __future__ import annotations

import argparse
import random
import time

BUCKETS = ((64, 256), (32, 256), (8, 256), (64, 512))


def make_slots(model, mode: str, prompts, pad_id: int):
    import torch

    from chatgym.trainer.engines.hf_static import StaticSlots

    slots = StaticSlots(model, 64, 512, fused=mode == "fused")
    if mode == "compiled":  # the whole step, as the engine's graphs would capture it
        slots._forward = torch.compile(slots._forward, dynamic=True)
    with torch.inference_mode():
        logits = slots.admit(prompts, pad_id)
    slots.set_tokens(logits.argmax(-1))
    return slots


def time_bucket(slots, n: int, width: int, iters: int) -> tuple[float, float, object]:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph, out = slots._graph(n, width)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return first_s, start.elapsed_time(end) / iters, out[:n].float().clone()


def count_kernels(slots, n: int, width: int) -> int:
    """CUDA kernels (and memcpy/memset) one eager step launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        slots._forward(n, width)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def main() -> None:
    import torch

    from chatgym.trainer.engines import hf_sampling
    from chatgym.trainer.engines.base import SamplingParams
    from chatgym.trainer.models.packaged import load_model
    from chatgym.trainer.models.random_init import random_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--random", action="store_true", help="random weights of SmolLM2's shape (no model files)")
    ap.add_argument("--iters", type=int, default=300, help="replays timed per bucket")
    ap.add_argument("--compile", action="store_true", help="also the torch.compile'd layers (slow to compile)")
    args = ap.parse_args()
    if args.random:
        from transformers import LlamaConfig

        shape = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                            rope_theta=100000.0, tie_word_embeddings=True)  # SmolLM2-135M's config.json
        model = random_model(shape, seed=0, device="cuda").to(torch.bfloat16).eval()
    else:
        model = load_model("smollm2", dtype="bfloat16", device="cuda")
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randint(40, 120))] for _ in range(64)]
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    results = {}
    for mode in ("layers", "fused", "compiled")[: 3 if args.compile else 2]:
        slots = make_slots(model, mode, prompts, 0)
        if mode != "compiled":
            print(f"{mode:8} kernels per step (64 rows, 256 columns): {count_kernels(slots, 64, 256)}", flush=True)
        for n, width in BUCKETS:
            first_s, ms, logits = time_bucket(slots, n, width, args.iters)
            results[(mode, n, width)] = logits
            diff = ""
            if mode != "layers":
                ref = results[("layers", n, width)]
                diff = f" max |logit diff| vs layers {(logits - ref).abs().max().item():.4f}"
                diff += f" argmax agree {(logits.argmax(-1) == ref.argmax(-1)).float().mean().item():.3f}"
            print(f"{mode:8} rows {n:3d} columns {width:3d}: first call {first_s:7.2f} s, "
                  f"replay {ms:.3f} ms{diff}", flush=True)
        del slots
        torch.cuda.empty_cache()

    # The sampling after each step: 64 rows at temperature 1, each with its own seed (as the trainer
    # sends them), logprob of the drawn id, one read back.
    logits = results[("fused", 64, 256)]
    generators = [torch.Generator(device="cuda").manual_seed(i) for i in range(64)]
    shared = torch.Generator(device="cuda").manual_seed(0)
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(64)]
    plan = hf_sampling.build_plan(params, generators, shared, logits.shape[-1], "cuda")
    for _ in range(10):
        hf_sampling.sample(logits, plan)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        ids, invalid = hf_sampling.sample(logits, plan)
        lps = torch.log_softmax(logits, dim=-1).gather(1, ids[:, None])[:, 0]
        hf_sampling.to_host(ids, lps, invalid)
    print(f"sampling 64 rows (own generators) + logprobs + read back: "
          f"{(time.perf_counter() - t0) / args.iters * 1e3:.3f} ms per step")


if __name__ == "__main__":
    main()
