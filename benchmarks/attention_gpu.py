"""The decode attention kernel alone (:mod:`chatgym.trainer.engines.hf_attention`), each launch choice timed.

The kernel runs a program per (row, key/value head) over the row's cache columns in blocks; how many
columns a block holds, the warps a program has and the software-pipelining stages of its loop set how
many programs fit a multiprocessor at once and how long each waits on its loads. At the Qwen2.5-7B
shape on an H100 the kernel took 22.6 us a layer at 256 rows with an e4m3 cache, 23.7 with a bf16 one
(``benchmarks/results/fp8_sampler_rope_h100_2026-12-07/step_7b.txt``, rows of 40-120 tokens: about
0.6 / 1.2 GB of cache read a step): hardly faster on the cache of half the bytes.

This times, for each cache dtype (the model's bf16, e4m3), each row count and each launch (``BLOCK,
WARPS, STAGES``), ``--layers`` distinct layers' caches one after another in one CUDA graph, each call
as the engine's step makes it (:func:`.hf_attention.decode_qkv`: the raw q/k/v product, RoPE in the
kernel), rows at positions drawn uniformly from ``--positions`` (default 145-248: the engine
benchmark's decode steps 65-128 after prompts of 40-120 tokens). It prints microseconds a layer and
the cache bytes read over that time, and the launch with the least summed time over the row counts for
each dtype, as ``CHATGYM_DECODE_ATTENTION_CONFIG`` takes it (``--write FILE`` writes it there too).

    python benchmarks/attention_gpu.py --shape qwen2.5-7b --rows 64 256 --write /tmp/attention_config
"""

from __future__ import annotations

import argparse
import itertools
import os

from fp8_gemm_gpu import time_graph

BLOCKS, WARPS, STAGES = (16, 32, 64, 128), (2, 4, 8), (1, 2, 3)
MAX_LEN = 512


def layer_calls(config, rows: int, low: int, high: int, fp8: bool, layers: int):
    """A function making ``layers`` attention calls of one step, and the cache bytes they read."""
    import torch

    from chatgym.trainer.engines import hf_attention

    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    d = config.hidden_size // heads
    g = torch.Generator(device="cuda").manual_seed(rows)
    positions = torch.randint(low, high + 1, (rows,), device="cuda", generator=g)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, device="cuda", dtype=torch.bfloat16, generator=g)
    angle = torch.rand(rows, d // 2, device="cuda", generator=g) * 6
    cos = torch.cat((angle.cos(), angle.cos()), dim=-1).to(torch.bfloat16)
    sin = torch.cat((-angle.sin(), angle.sin()), dim=-1).to(torch.bfloat16)
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    caches = [tuple(torch.randn(rows, kv_heads, MAX_LEN, d, device="cuda", generator=g).to(dtype) for _ in range(2))
              for _ in range(layers)]
    nbytes = int(positions.sum()) * kv_heads * d * 2 * caches[0][0].element_size() * layers

    def run():
        for k_cache, v_cache in caches:
            hf_attention.decode_qkv(qkv, heads, k_cache, v_cache, positions, d**-0.5, cos, sin)

    return run, nbytes


def main() -> None:
    import torch
    from hf_decode_gpu import SHAPES, shape_config

    from chatgym.trainer.engines import hf_attention

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="qwen2.5-7b")
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--positions", type=int, nargs=2, default=[145, 248], metavar=("LOW", "HIGH"))
    ap.add_argument("--layers", type=int, default=None, help="distinct caches a step (default: the shape's layers)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--write", help="write the best launches here, as CHATGYM_DECODE_ATTENTION_CONFIG takes them")
    ap.add_argument("--caches", nargs="+", choices=("model", "fp8"), default=["model", "fp8"],
                    help="the caches to time: 'model' (the model's dtype, bf16) and 'fp8' (e4m3)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_gpu.py needs CUDA")
    config = shape_config(args.shape)
    layers = args.layers or config.num_hidden_layers
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}, {args.shape}, {layers} layers, positions "
          f"{args.positions[0]}-{args.positions[1]}; us a layer (TB/s of cache read); default launch "
          f"{hf_attention.LAUNCH}", flush=True)
    best = {}
    for key in ("model", "fp8"):
        if key not in args.caches:
            continue
        totals: dict[tuple[int, int, int], float] = {}
        timed: dict[tuple[int, int, int], int] = {}  # row counts each launch ran
        for rows in args.rows:
            run, nbytes = layer_calls(config, rows, *args.positions, key == "fp8", layers)
            cells = []
            for launch in itertools.product(BLOCKS, WARPS, STAGES):
                os.environ["CHATGYM_DECODE_ATTENTION_CONFIG"] = ",".join(map(str, launch))
                hf_attention._launch_configs.cache_clear()
                try:
                    ms = time_graph(run, args.iters)
                except Exception as exc:  # a launch the card cannot take (shared memory): left out
                    print(f"{key} rows {rows} launch {launch}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                    continue
                totals[launch] = totals.get(launch, 0.0) + ms
                timed[launch] = timed.get(launch, 0) + 1
                cells.append(f"{launch}: {ms * 1e3 / layers:5.1f} ({nbytes / ms / 1e9:4.2f})")
            print(f"{key:5} rows {rows:3d}: " + " | ".join(cells), flush=True)
            torch.cuda.empty_cache()
        best[key] = min((k for k in totals if timed[k] == len(args.rows)), key=totals.get)
        default = totals.get(hf_attention.LAUNCH[key])
        print(f"{key:5} best launch {best[key]}: {totals[best[key]] * 1e3 / layers:.1f} us a layer summed over rows "
              f"{args.rows}; default {hf_attention.LAUNCH[key]}: "
              f"{'n/a' if default is None else f'{default * 1e3 / layers:.1f}'}", flush=True)
    os.environ.pop("CHATGYM_DECODE_ATTENTION_CONFIG", None)
    chosen = ";".join(f"{key}={','.join(map(str, launch))}" for key, launch in best.items())
    print(f"CHATGYM_DECODE_ATTENTION_CONFIG={chosen}")
    if args.write:
        with open(args.write, "w") as f:
            f.write(chosen + "\n")


if __name__ == "__main__":
    main()
