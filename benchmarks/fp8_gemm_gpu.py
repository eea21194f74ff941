"""The decode step's projections alone: bf16 against each FP8 GEMM of :mod:`chatgym.trainer.engines.hf_fp8`.

At the 7B shape and 64 rows the FP8 decode step's GEMMs read their weights at 1.75-1.86 TB/s against
the bf16 GEMMs' 2.48 (one H100: ``benchmarks/results/vs_trl_h100_2026-12-06``): cuBLASLt ran one
128x128 tile for every row-wise-scaled FP8 projection. This times, for each projection of a shape
(q/k/v, o, gate/up, down), ``--layers`` distinct weights one after another in one CUDA graph (so the
L2 cache holds none of them, as in a step) and prints microseconds a GEMM and the weights' bytes over
that time, for:

* ``bf16``: ``F.linear`` on bf16 weights (the fused step's);
* ``rowwise``: ``torch._scaled_mm`` with per-row activation and per-channel weight scales (the FP8
  step's default);
* ``unit``: a tensor-wise FP8 GEMM with unit scales (the scales applied after it, in the compiled
  piece that follows it in the step), and ``unit+scale`` with that scaling as a kernel of its own;
* ``cutlass``: vLLM's CUTLASS FP8 kernel with the same scales in its epilogue (where vLLM is installed);
* ``unit_t`` / ``unit_fast_t``: the unit product transposed, ``Q · X^T`` (cuBLASLt picks its kernel for
  the swapped sizes; a consumer would read the ``(N, M)`` output by its strides), exact and fast accumulation;
* ``autotune`` (``--autotune``): the unit product through ``torch.compile(mode="max-autotune-no-cudagraphs")``,
  Inductor's GEMM templates benchmarked against cuBLASLt for each size (slow to tune).

    python benchmarks/fp8_gemm_gpu.py --shape qwen2.5-7b --rows 64 256
"""

from __future__ import annotations

import argparse
import importlib.util

from decode_step_gpu import replay_ms


def projections(config) -> dict[str, tuple[int, int]]:
    """(N outputs, K inputs) of each fused projection of a transformers ``config``."""
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    h, i = config.hidden_size, config.intermediate_size
    return {"qkv": ((config.num_attention_heads + 2 * config.num_key_value_heads) * d, h), "o": (h, h),
            "gate_up": (2 * i, h), "down": (h, i)}


def time_graph(fn, iters: int) -> float:
    """Milliseconds one replay of ``fn``'s captured graph takes (CUDA events, ``iters`` replays)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return replay_ms(graph, iters, warm=3)


def variants(m: int, n: int, k: int, layers: int, autotune: bool) -> dict:
    """name -> (a function running ``layers`` GEMMs of (m, k) x (k, n), bytes of weights it reads)."""
    import torch
    import torch.nn.functional as F

    from chatgym.trainer.engines import hf_fp8

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(layers)]
    fp8 = [hf_fp8.quantize_rowwise(w) for w in w16]
    xq, a = hf_fp8.quantize_rows(x)
    out = {"bf16": (lambda: [F.linear(x, w) for w in w16], 2 * n * k * layers)}
    fp8_bytes = (n * k + 4 * n) * layers
    for gemm in hf_fp8.GEMMS:
        if gemm == "cutlass" and importlib.util.find_spec("vllm") is None:
            continue
        out[gemm] = (lambda g=gemm: [hf_fp8.scaled_mm(xq, a, q, s, torch.bfloat16, g) for q, s in fp8], fp8_bytes)
    out["unit+scale"] = (lambda: [hf_fp8.dequantize_out(hf_fp8.scaled_mm(xq, a, q, s, torch.bfloat16, "unit"), a, s)
                                  for q, s in fp8], fp8_bytes)
    one = torch.ones((), device="cuda")
    for name, fast in (("unit_t", False), ("unit_fast_t", True)):  # the product transposed: (N, M) = Q · X^T
        out[name] = (lambda f=fast: [torch._scaled_mm(q, xq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                      use_fast_accum=f) for q, _ in fp8], fp8_bytes)
    if autotune:
        mm = torch.compile(lambda xq, q: torch._scaled_mm(xq, q.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                           mode="max-autotune-no-cudagraphs", dynamic=False)
        mm(xq, fp8[0][0])  # the tuning, outside the capture
        out["autotune"] = (lambda: [mm(xq, q) for q, _ in fp8], fp8_bytes)
    return out


def main() -> None:
    import torch
    from hf_decode_gpu import SHAPES, shape_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="qwen2.5-7b")
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--layers", type=int, default=None, help="distinct weights a projection (default: the shape's layers)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--autotune", action="store_true", help="add Inductor's max-autotune unit GEMM")
    args = ap.parse_args()
    # Regression (fresh-user walk): bad sizes were found only after CUDA was asked for
    if min(args.rows) < 1 or (args.layers is not None and args.layers < 1) or args.iters < 1:
        ap.error(f"--rows, --layers and --iters must be >= 1, got {args.rows}, {args.layers} and {args.iters}")
    if not torch.cuda.is_available():
        raise SystemExit("fp8_gemm_gpu.py needs CUDA")
    config = shape_config(args.shape)
    layers = args.layers or config.num_hidden_layers
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}, {args.shape}, {layers} weights a projection; "
          "us a GEMM (TB/s of weights)", flush=True)
    for m in args.rows:
        totals: dict[str, float] = {}
        for name, (n, k) in projections(config).items():
            cells = []
            for variant, (fn, nbytes) in variants(m, n, k, layers, args.autotune).items():
                ms = time_graph(fn, args.iters)
                totals[variant] = totals.get(variant, 0.0) + ms
                cells.append(f"{variant} {ms * 1e3 / layers:7.1f} ({nbytes / ms / 1e9:4.2f})")
            print(f"rows {m:3d} {name:7} N {n:5d} K {k:5d}: " + " | ".join(cells), flush=True)
            torch.cuda.empty_cache()
        best = min((v for v in totals if v not in ("bf16", "unit+scale")), key=totals.get)
        print(f"rows {m:3d} all projections, ms a step: " + ", ".join(f"{v} {t:.3f}" for v, t in totals.items())
              + f"; fastest FP8: {best} ({totals['bf16'] / totals[best]:.2f}x bf16)", flush=True)


if __name__ == "__main__":
    main()
