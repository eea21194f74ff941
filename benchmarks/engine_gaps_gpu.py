"""Where an `hf` engine's decode time goes on the GPU: kernels, and the device idle between them.

``hf_decode_gpu.py --decode-only`` at the Qwen2.5-7B shape, 256 rows, gives FP8 + e4m3 cache 5.99 ms a
decode step against a captured step of 5.31 ms (``decode_step_gpu.py``), bf16 8.92 against 8.22: about
0.7 ms a step outside the step's graph on either side, which holds the FP8/bf16 ratio under the
step's. This runs one mode's engine as that benchmark does (random weights, prompts of 40-120 tokens,
128 new tokens a row, no EOS; the mode's options from its ``ENGINE_MODES``), a warm-up run, then one run
under ``torch.profiler`` (the device's activity; ``--host``: the host's ops too), and over the window
from the 65th decode step's start to the 128th's (steps 65-127; each step found by its first
``decode_attention`` kernel: modes with the compiled step's Triton attention, ``... all``) it prints: the window's wall time a step, the time
some kernel ran (the union of kernel intervals) and the device idle (the rest), the kernels by name
(summed; graph replays' kernels included), and the idle gaps of more than 20 us, largest first (with
``--host``, the host calls running at each gap's start). Needs CUDA.

    python benchmarks/engine_gaps_gpu.py --shape qwen2.5-7b --rows 256 --modes "static all" "static fp8+head all kv8"
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections import defaultdict
from unittest import mock

from hf_decode_gpu import (
    ENGINE_MODES,
    NEW_TOKENS,
    SHAPES,
    build_model,
    make_engine,
    make_prompts,
    mode_env,
    run_engine,
)


def kernel_intervals(prof) -> list[tuple[float, float, str]]:
    """``(start us, end us, name)`` of every kernel and memcpy/memset the profiler saw, by start."""
    out = []
    for e in prof.events():
        kind = str(getattr(e, "device_type", ""))
        if "CUDA" in kind and e.time_range.end > e.time_range.start:
            out.append((e.time_range.start, e.time_range.end, e.name))
    return sorted(out)


def host_ranges(prof, names: tuple[str, ...]) -> list[tuple[float, float, str]]:
    """Host-side ranges whose names contain any of ``names`` (graph launches, the engine's functions)."""
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                  if "CUDA" not in str(getattr(e, "device_type", "")) and any(n in e.name for n in names))


def step_starts(intervals, layers: int) -> list[float]:
    """Each decode step's start on the device: its first ``decode_attention`` kernel (``layers`` a step;
    the prefill attends otherwise)."""
    attention = sorted(s for s, _, name in intervals if "decode_attention" in name)
    return attention[::layers]


def summarize(intervals, starts, host, first: int, last: int) -> list[str]:
    """The window from decode step ``first``'s start to step ``last``'s (0-based; steps ``first .. last -
    1`` measured): busy, idle, kernels by name, gaps. ``intervals`` in any order."""
    if last <= first or len(starts) <= last:
        return [f"no window: {len(starts)} decode steps seen, and one from step {first + 1}'s start to a later "
                f"step's needs at least {first + 2}"]
    if starts[last] <= starts[first]:
        return [f"no window: decode steps {first + 1} and {last + 1} start at the same time"]
    t0, t1 = starts[first], starts[last]
    steps = last - first
    busy, by_name, gaps = 0.0, defaultdict(float), []
    end = t0
    for s, e, name in sorted(intervals):
        if e <= t0 or s >= t1:
            continue
        s, e = max(s, t0), min(e, t1)
        by_name[name] += e - s
        if s > end:
            if s - end > 20:
                gaps.append((s - end, end))
            busy += e - s
        elif e > end:
            busy += e - end
        end = max(end, e)
    if t1 - end > 20:  # idle up to the window's last step
        gaps.append((t1 - end, end))
    wall = t1 - t0
    lines = [f"window: decode steps {first + 1}-{last}, {steps} steps: {wall / steps / 1e3:.3f} ms a step, "
             f"some kernel running {busy / steps / 1e3:.3f} ms, device idle {(wall - busy) / steps / 1e3:.3f} ms "
             f"({100 * (wall - busy) / wall:.1f}%)"]
    for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:14]:
        lines.append(f"    {us / steps:8.1f} us a step  {name[:110]}")
    for length, at in sorted(gaps, reverse=True)[:10]:
        during = [n for s, e, n in host if s <= at <= e]
        lines.append(f"    gap {length:7.1f} us at +{(at - t0) / 1e3:8.3f} ms; host in: {', '.join(during[-3:])[:150]}")
    return lines


def profile_mode(model, tokenizer, mode: str, rows: int, with_host: bool) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from chatgym.trainer.engines import SamplingParams
    prompts = make_prompts(rows, model.config.vocab_size, rows)
    params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0) for _ in range(rows)]
    eng = make_engine(model, tokenizer, mode, rows)
    try:
        with mock.patch.dict(os.environ, mode_env(mode)):
            asyncio.run(run_engine(eng, prompts, params))  # warm-up: captures, compiles
            activities = [ProfilerActivity.CUDA] + [ProfilerActivity.CPU] * with_host  # the host's ops cost time
            with profile(activities=activities) as prof:
                seconds, tokens = asyncio.run(run_engine(eng, prompts, params))
    finally:
        asyncio.run(eng.close())
    del eng
    torch.cuda.empty_cache()
    intervals = kernel_intervals(prof)
    starts = step_starts(intervals, model.config.num_hidden_layers)
    host = host_ranges(prof, ("cudaGraphLaunch", "cudaEventSynchronize", "cudaStreamSynchronize", "aten::"))
    lines = [f"{mode} rows {rows}: run {seconds:.3f} s under the profiler, {tokens} tokens, {len(starts)} decode steps"]
    return lines + summarize(intervals, starts, host, 64, min(len(starts) - 1, 127))  # 65-127, or fewer


def main() -> None:
    import torch

    from chatgym.trainer.chat.tokenizer import get_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="qwen2.5-7b")
    ap.add_argument("--rows", type=int, nargs="+", default=[256])
    ap.add_argument("--modes", nargs="+", choices=list(ENGINE_MODES), metavar="MODE",
                    default=["static all", "static fp8+head all kv8"],
                    help="hf_decode_gpu.py's ENGINE_MODES with the compiled step (names ending in 'all', "
                         "'all kv8', ...)")
    ap.add_argument("--host", action="store_true", help="profile the host's ops too (names what ran at each gap; "
                                                         "slows the host)")
    args = ap.parse_args()
    if min(args.rows) < 1:
        ap.error(f"--rows must be >= 1, got {args.rows}")
    if len(set(args.modes)) < len(args.modes):  # regression (fresh-user walk): hf_decode_gpu refuses it too
        ap.error(f"--modes: a mode given twice in {args.modes}")
    # Regression (noticed in stop 65): a mode without the compiled step ran the whole GPU run to say "no window"
    uncompiled = [m for m in args.modes if ENGINE_MODES[m].get("fused_step") != "compiled"]
    if uncompiled:
        ap.error(f"--modes: {uncompiled} run no compiled step, whose kernels mark the decode steps here")
    if not torch.cuda.is_available():
        raise SystemExit("engine_gaps_gpu.py needs CUDA")
    model = build_model(args.shape, False)
    tokenizer = get_tokenizer("smollm2")
    print(f"{args.shape}: {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    for rows in args.rows:
        for mode in args.modes:
            for line in profile_mode(model, tokenizer, mode, rows, args.host):
                print(line, flush=True)


if __name__ == "__main__":
    main()
