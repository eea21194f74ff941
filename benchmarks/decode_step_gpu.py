"""The static engine's decode step on one GPU, captured as a CUDA graph, and where its time goes.

Modes (``--modes``): through the model's own layers (``layers``), through
:mod:`chatgym.trainer.engines.hf_fused` (``fused``, the engine's default), the fused step on FP8
weights (``fp8``: :mod:`.hf_fp8`, per-channel e4m3 weights, per-row activation scales), each of
those two with its element-wise pieces compiled (``fused_c``, ``fp8_c``: the engine's
``fused_step: compiled``, :mod:`.hf_elementwise`), ``fp8_c_rowwise`` / ``fp8_unit``: ``fp8_c`` /
``fp8`` with the other of :data:`.hf_fp8.GEMMS` than their default (``benchmarks/fp8_gemm_gpu.py``
times the GEMMs alone), ``fused_c_sdpa`` / ``fp8_c_sdpa``: ``fused_c`` / ``fp8_c`` with the cache writes
and ``scaled_dot_product_attention`` instead of their default one Triton kernel (:mod:`.hf_attention`),
``fp8_c_cutlass``: ``fp8_c`` on vLLM's CUTLASS FP8 GEMM (scales and bias in its epilogue), ``*_head``: the
LM head in FP8 too, ``*_kv8``: the KV cache in e4m3 (``kv_cache_dtype: fp8``), ``fp8_c_inductor``: ``fp8_c`` with the MLP's quantization compiled by Inductor (the step before
:mod:`.hf_silu_quant`), ``fused_c_aten``: ``fused_c`` with aten's RMSNorm kernel instead of Inductor's
(the step before :func:`.hf_elementwise.norm` was compiled),
and ``compiled`` (the layers' step compiled by ``torch.compile``, Inductor, row and column counts
dynamic, then captured; the engine itself does not compile:
``benchmarks/results/vs_trl_h200_curve_subprocess/README.md``: 140 s, and 91 s more at the
512-column bucket).

Shapes (``--shape``): ``smollm2`` (SmolLM2-135M-Instruct, real weights; ``--random`` its shape with
random weights) or the Qwen2.5 shapes of :mod:`hf_decode_gpu` (random weights). bf16, 256 slots of
``max_len`` 512, prompts of 40-120 random tokens prefilled into ``max(--rows)`` of them. For each mode
and bucket (rows, columns) it prints the first call (capture, and compilation for ``compiled``), the
replayed step (ms, CUDA events around ``--iters`` replays), the step against the card's bandwidth
floor and, besides ``layers``, the largest difference of its logits from the layers' step.

The floor: the bytes one step must read — every projection's and the LM head's weights once (FP8: one
byte an element plus the scales) and the KV cache columns attended (keys and values of every layer,
``rows x columns``) — over the bandwidth of a 1 GiB device-to-device copy measured on the card
(bytes read + written per second). ``--profile`` runs one eager step per bucket under
``torch.profiler`` (the same kernels the graph replays) and prints the kernels' summed time by kind
(GEMM, attention, norms, cache writes, FP8 activation quantization, other element-wise) with the
GEMMs' achieved bandwidth (weight bytes over GEMM time), and the ten costliest kernels; the replay's
time less the kernels' sum is what the graph spends between kernels.

Then the sampling that follows each step in the engine (``hf_sampling.sample`` at temperature 1 with a
generator per row, ``log_softmax`` + gather, one read back, at the first bucket's rows; and at each
bucket's rows ``sampler: philox``'s two kernels, :mod:`.hf_draw`, with their read back): ms per step.

    python benchmarks/decode_step_gpu.py             # layers vs fused, SmolLM2
    python benchmarks/decode_step_gpu.py --compile   # and the compiled layers (minutes of compilation)
    python benchmarks/decode_step_gpu.py --shape qwen2.5-7b --modes fused fp8 --rows 64 256 --profile
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import random
import time

BUCKETS = ((64, 256), (32, 256), (8, 256), (64, 512))
MODES = ("layers", "fused", "fused_c", "fused_c_sdpa", "fused_c_aten", "fp8", "fp8_c", "fp8_c_sdpa", "fp8_c_inductor",
         "fp8_unit", "fp8_c_rowwise", "fp8_c_cutlass", "fp8_c_head", "fp8_c_cutlass_head", "fp8_c_head_kv8",
         "fp8_c_cutlass_head_kv8", "fused_c_kv8", "compiled")
SLOTS, MAX_LEN = 256, 512
KINDS = (  # (kind, substrings of a kernel's name), first match wins (cutlass attention before GEMMs)
    ("attention", ("fmha", "flash", "attention", "attn")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitk", "scaled_mm", "sm90_", "matmul")),
    ("norm", ("rms", "norm")),
    ("fp8 quant", ("float8", "e4m3", "fp8", "amax", "abs_max", "max_all", "reduce_kernel", "quantize", "silu_mul_partial",
                   "silu_mul_row", "row_quant")),
    ("cache write", ("index_put", "indexing_backward", "scatter", "index_elementwise", "put_kernel")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other element-wise"


def make_slots(model, mode: str, prompts, pad_id: int, tokens=None):
    """The mode's slots with ``prompts`` prefilled and each row's next token set: ``tokens`` (the
    reference mode's, so every mode's step reads the same input) or its own prefill's argmax."""
    import torch

    from chatgym.trainer.engines.hf_static import StaticSlots

    # fp8_c_rowwise / fp8_unit / fp8_c_cutlass: fp8_c / fp8 with that hf_fp8 GEMM instead of their default;
    # *_head: the LM head in FP8 too; *_sdpa: the compiled step with the default attention instead of the
    # Triton kernel
    kv8 = mode.endswith("_kv8")
    head = mode.removesuffix("_kv8").endswith("_head")
    base = mode.removesuffix("_kv8").removesuffix("_head")
    kind, variant = (base.rsplit("_", 1) if base.endswith(("_rowwise", "_unit", "_cutlass", "_sdpa", "_inductor", "_aten"))
                     else (base, ""))
    fused = "compiled" if kind.endswith("_c") else kind in ("fused", "fp8")
    gemm = variant if variant in ("rowwise", "unit", "cutlass") else None
    slots = StaticSlots(model, SLOTS, MAX_LEN, fused=fused, fp8=kind.startswith("fp8"), fp8_gemm=gemm,
                        fp8_lm_head=head, kv_cache_dtype="fp8" if kv8 else "auto")
    if variant == "sdpa":  # before the first capture: the graphs take the attention the step has then
        slots.fused.attention = "sdpa"
    if variant in ("inductor", "aten"):  # the step before hf_silu_quant's kernels / Inductor's RMSNorms
        from chatgym.trainer.engines import hf_elementwise

        piece = ({"silu_mul_quant": hf_elementwise.compiled().silu_mul_quant} if variant == "inductor"
                 else {"norm": hf_elementwise.EAGER.norm})
        slots.fused.ops = dataclasses.replace(slots.fused.ops, **piece)
    if mode == "compiled":  # the whole step, as the engine's graphs would capture it
        slots._forward = torch.compile(slots._forward, dynamic=True)
    with torch.inference_mode():
        logits = slots.admit(prompts, pad_id)
    slots.set_tokens(logits.argmax(-1) if tokens is None else tokens)
    return slots, slots.tokens[: len(prompts)].clone()


def time_bucket(slots, n: int, width: int, iters: int) -> tuple[float, float, object]:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph, out = slots._graph(n, width)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    return first_s, replay_ms(graph, iters), out[:n].float().clone()


def replay_ms(graph, iters: int, warm: int = 10) -> float:
    """Milliseconds one replay of a captured ``graph`` takes: CUDA events around ``iters`` replays,
    after ``warm`` untimed ones."""
    import torch

    for _ in range(warm):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def step_kernels(slots, n: int, width: int) -> list[tuple[str, float]]:
    """(name, microseconds) of every CUDA kernel, memcpy and memset one eager step launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        slots._forward(n, width)  # warm: allocations and lazy handles outside the profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            slots._forward(n, width)
            torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return [(e.name, e.device_time) for e in prof.events() if e.device_type == cuda]


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 1 GiB device-to-device copy (median of 20)."""
    import torch

    size = 1 << 30
    src = torch.randint(0, 255, (size,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * size / sorted(times[5:])[len(times[5:]) // 2]


def step_bytes(model, mode: str, n: int, width: int) -> tuple[int, int]:
    """(weight bytes, KV-cache bytes) one decode step of ``n`` rows over ``width`` columns reads."""
    config = model.config
    fp8 = mode.startswith("fp8")
    per = 1 if fp8 else 2
    weights = 0
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            weights += lin.weight.numel() * per + (lin.weight.shape[0] * 4 if fp8 else 0)
    weights += model.lm_head.weight.numel() * (1 if mode.removesuffix("_kv8").endswith("_head") else 2)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = 2 * len(model.model.layers) * n * config.num_key_value_heads * width * head_dim * (1 if mode.endswith("_kv8") else 2)
    return weights, kv


def print_profile(kernels: list[tuple[str, float]], replay_ms: float, weight_bytes: int) -> None:
    by_kind: dict[str, list[float]] = {}
    for name, us in kernels:
        by_kind.setdefault(kind_of(name), []).append(us)
    total = sum(us for _, us in kernels) / 1e3
    print(f"    {len(kernels)} kernels, {total:.3f} ms summed; replay {replay_ms:.3f} ms: "
          f"{replay_ms - total:+.3f} ms between kernels")
    for kind, times in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        ms = sum(times) / 1e3
        extra = f", weights at {weight_bytes / (ms / 1e3) / 1e12:.2f} TB/s" if kind == "gemm" else ""
        print(f"    {kind:20} {len(times):5d} kernels {ms:8.3f} ms ({ms / total:5.1%}){extra}")
    agg: dict[str, list[float]] = {}
    for name, us in kernels:
        agg.setdefault(name, []).append(us)
    for name, times in sorted(agg.items(), key=lambda kv: -sum(kv[1]))[:10]:
        print(f"      {sum(times) / 1e3:7.3f} ms {len(times):4d} x {sum(times) / len(times):7.1f} us  {name[:110]}")


def main() -> None:
    import torch
    from hf_decode_gpu import SHAPES, build_model

    from chatgym.trainer.models.cuda import without_cudnn_attention

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="smollm2")
    ap.add_argument("--random", action="store_true", help="smollm2: random weights (no model files)")
    ap.add_argument("--modes", nargs="+", default=["layers", "fused"], choices=MODES)
    ap.add_argument("--compile", action="store_true", help="add 'compiled' to --modes (slow to compile)")
    ap.add_argument("--rows", type=int, nargs="+", default=None, help="buckets of (rows, 256 columns); "
                    "default: 64/32/8 rows x 256 and 64 x 512")
    ap.add_argument("--iters", type=int, default=300, help="replays timed per bucket")
    ap.add_argument("--profile", action="store_true", help="kernel time by kind per bucket (module doc)")
    ap.add_argument("--cudnn", action="store_true", help="SDPA's cuDNN backend allowed (the engine turns it off)")
    args = ap.parse_args()
    modes = list(dict.fromkeys([*args.modes, *(["compiled"] if args.compile else [])]))
    buckets = [(n, 256) for n in args.rows] if args.rows else list(BUCKETS)
    model = build_model(args.shape, real_weights=args.shape == "smollm2" and not args.random)
    rng = random.Random(0)
    top = min(model.config.vocab_size, 40000)
    prompts = [[rng.randrange(100, top) for _ in range(rng.randint(40, 120))] for _ in range(max(n for n, _ in buckets))]
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}, {args.shape}, "
          f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)", flush=True)
    # As the engine runs its steps: SDPA's cuDNN backend off (trainer/models/cuda.py), so the graphs
    # capture the attention kernel the engine replays (--cudnn: allowed, the A/B).
    attention = contextlib.nullcontext() if args.cudnn else without_cudnn_attention("cuda")
    with attention:
        results = time_modes(model, modes, buckets, prompts, bandwidth, args)
    sampling(results, modes, buckets, args.iters)


def time_modes(model, modes: list[str], buckets, prompts, bandwidth: float, args) -> dict:
    """Each mode's captured step per bucket, printed (module doc); the logits of each, by key."""
    import torch

    results, reference, tokens = {}, "layers" if "layers" in modes else modes[0], None
    for mode in sorted(modes, key=lambda m: m != reference):
        slots, fed = make_slots(model, mode, prompts, 0, tokens)
        tokens = fed if tokens is None else tokens  # the reference mode's next tokens, fed to every mode
        for n, width in buckets:
            first_s, ms, logits = time_bucket(slots, n, width, args.iters)
            results[(mode, n, width)] = logits
            weights, kv = step_bytes(model, mode, n, width)
            floor_ms = (weights + kv) / bandwidth * 1e3
            diff = ""
            if mode != reference:
                ref = results[(reference, n, width)]
                diff = f"; vs {reference}: max |logit diff| {(logits - ref).abs().max().item():.4f}"
                diff += f", argmax agree {(logits.argmax(-1) == ref.argmax(-1)).float().mean().item():.3f}"
            print(f"{mode:8} rows {n:3d} columns {width:3d}: first call {first_s:7.2f} s, replay {ms:.3f} ms, "
                  f"floor {floor_ms:.3f} ms ({(weights + kv) / 1e9:.2f} GB: KV {kv / 1e9:.2f}), "
                  f"{ms / floor_ms:.2f}x the floor{diff}", flush=True)
            if args.profile and mode != "compiled":
                print_profile(step_kernels(slots, n, width), ms, weights)
        del slots
        torch.cuda.empty_cache()
    return results


def sampling(results: dict, modes: list[str], buckets, iters: int) -> None:
    """The engine's sampling after a step: the default on the first bucket's logits, the philox sampler
    on each bucket's (module doc)."""
    import torch

    from chatgym.trainer.engines import hf_draw, hf_sampling
    from chatgym.trainer.engines.base import SamplingParams

    # The sampling after each step: 64 rows at temperature 1, each with its own seed (as the trainer
    # sends them), logprob of the drawn id, one read back.
    n, width = buckets[0]
    logits = results[(modes[-1] if "fused" not in modes else "fused", n, width)]
    generators = [torch.Generator(device="cuda").manual_seed(i) for i in range(n)]
    shared = torch.Generator(device="cuda").manual_seed(0)
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(n)]
    plan = hf_sampling.build_plan(params, generators, shared, logits.shape[-1], "cuda")

    def default() -> None:
        ids, invalid = hf_sampling.sample(logits, plan)
        lps = torch.log_softmax(logits, dim=-1).gather(1, ids[:, None])[:, 0]
        hf_sampling.to_host(ids, lps, invalid)

    print(f"sampling {n} rows (own generators) + logprobs + read back: {host_ms(default, iters):.3f} ms per step")
    for n, width in dict.fromkeys(buckets):  # the philox sampler at each row count timed
        bf16 = results[(modes[-1] if "fused" not in modes else "fused", n, width)].to(torch.bfloat16)  # the step's dtype
        philox = hf_draw.build_plan(range(n), [0] * n, [1.0] * n, "cuda")
        print(f"sampler philox, {n} rows (draw + logprobs + packing: {-(-bf16.shape[-1] // hf_draw.CHUNK)} chunks a row, "
              f"then the join) + read back: "
              f"{host_ms(lambda b=bf16, p=philox, k=n: hf_sampling.packed_to_host(hf_draw.draw(b, p)[1], k), iters):.3f} "
              "ms per step")


def host_ms(fn, iters: int, warm: int = 10) -> float:
    """Milliseconds of wall clock one call of ``fn`` takes (it ends in a read-back), after ``warm`` calls."""
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e3

if __name__ == "__main__":
    main()
