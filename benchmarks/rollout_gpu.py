"""A GRPO step's generation through the collector on the static-slot engine: where the time goes.

The shape of ``benchmarks/vs_trl_gpu.py``: Math-v0 train tasks, 8 prompts x 8 samples, <= 128 new
tokens, temperature 1, per-request seeds derived as the trainer derives them, ``max_model_len`` 512,
``TransformersEngine(decode="static")`` (per-slot KV cache; CUDA graphs on a GPU). Each round collects
a fresh set of 8 tasks (round ``k``: tasks ``8k .. 8k+7``); ``--warmup`` rounds (graph capture,
allocator growth) are left out of the figures. Per mode it prints, over the timed rounds:

* ``tok/s`` generated tokens / rollout wall time (medians over the timed rounds); ``steps`` engine decode steps per round and the
  mean rows per step (the tail of few rows is where a fixed per-step cost hurts);
* ``ms/step`` wall time of one engine decode step (decode + sampling + bookkeeping), measured in the
  engine's worker around each step, prefill left out; ``prefill s`` per round (the admission passes,
  synchronised before and after) and ``prefills`` (passes: requests arriving together share one);
* ``floor ms/step`` the decode step alone (the captured graph replayed at each step's own bucket,
  synchronised, after the rollout) and ``host ms/step`` = ms/step - floor: what is not the model;
* with ``--count-syncs`` (CUDA), device syncs per decode step (``torch.cuda.set_sync_debug_mode``),
  in a separate untimed round.

Modes: ``batched`` (the engine as it is), ``async`` (the same with ``async_scheduling``: step ``k + 1``
queued before step ``k``'s ids are read back), ``layers`` / ``layers_async`` (those two decoding
through the model's own layers, ``fused_step=False``, instead of :mod:`.hf_fused`). On a CPU it runs
a tiny random Llama so the host side dominates. ``--switch-interval`` sets Python's GIL switch interval (default 5 ms) for the run: the
engine's worker thread gives the GIL up at every torch call and may wait that long to get it back
while the collector's threads run Python (scoring, tokenizing).

    python benchmarks/rollout_gpu.py                      # CUDA: SmolLM2-135M real weights, bf16
    python benchmarks/rollout_gpu.py --count-syncs
    .venv/bin/python benchmarks/rollout_gpu.py --rounds 2 --warmup 1   # CPU: tiny model

To compare with an older engine (for instance one ``torch.multinomial`` per seeded row, two device
syncs each), run this script from that commit: ``git worktree add /tmp/old <tag>``, then
``python /tmp/old/benchmarks/rollout_gpu.py`` with the same arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter

import numpy as np

PROMPTS, GROUP, NEW_TOKENS, MAX_LEN = 8, 8, 128, 512
TINY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)


def make_engine(device: str, real_weights: bool, seed: int):
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines.hf import TransformersEngine
    from chatgym.trainer.models.random_init import random_model

    tokenizer = get_tokenizer("smollm2")
    if real_weights:
        return TransformersEngine("smollm2", tokenizer, dtype="bfloat16", device=device, seed=seed,
                                  max_model_len=MAX_LEN, decode="static")
    model = random_model("smollm2", seed=3, device=device, **TINY)
    model.eval()
    return TransformersEngine(model, tokenizer, seed=seed, max_model_len=MAX_LEN, decode="static")


class Probe:
    """Times the engine's steps and prefills from inside its worker thread (wraps two methods)."""

    def __init__(self, engine) -> None:
        import torch

        self.engine, self.cuda = engine, engine.device.type == "cuda"
        self.step_s = 0.0
        self.prefill_s = 0.0
        self.buckets: Counter[tuple[int, int]] = Counter()  # (row bucket, column bucket) per decode step
        self.rows = 0  # row-steps decoded
        self.profile = None  # a cProfile.Profile run around each step (in the worker thread) when set
        step = engine._step_static

        def timed_step(rows, joiners):
            t = time.perf_counter()
            if rows:
                slots = engine._slots
                self.buckets[self._bucket(slots)] += 1
                self.rows += slots.rows
            self.wrap_admit()
            if self.profile is not None:
                self.profile.enable()
            try:
                return step(rows, joiners)
            finally:
                if self.profile is not None:
                    self.profile.disable()
                self.step_s += time.perf_counter() - t

        engine._step_static = timed_step
        self._torch = torch

    def wrap_admit(self) -> None:
        slots = self.engine._slots  # made by the engine's first step
        if slots is None or getattr(slots, "_probed", False):
            return
        admit = slots.admit

        def timed_admit(prompts, pad_id):
            if self.cuda:  # the step's decode, launched just before, is not the prefill's
                self._torch.cuda.synchronize()
            t = time.perf_counter()
            out = admit(prompts, pad_id)
            if self.cuda:
                self._torch.cuda.synchronize()
            self.prefill_s += time.perf_counter() - t
            return out

        slots.admit, slots._probed = timed_admit, True

    @staticmethod
    def _bucket(slots) -> tuple[int, int]:
        from chatgym.trainer.engines.hf_static import MIN_COLUMN_BUCKET, _bucket

        top = max(slots._pos_host)
        return _bucket(slots.rows, slots.max_rows), _bucket(top + 1, slots.max_len, MIN_COLUMN_BUCKET)

    def reset(self) -> None:
        self.step_s = self.prefill_s = 0.0
        self.rows = 0
        self.buckets.clear()

    def floor_s(self, repeats: int = 10) -> float:
        """Seconds the decode steps of the last round take alone: each step's bucket replayed."""
        torch = self._torch
        slots = self.engine._slots
        total = 0.0
        for (n, width), count in self.buckets.items():

            def run(n=n, width=width):
                if slots.use_graphs:
                    slots._graph(n, width)[0].replay()
                else:
                    with torch.inference_mode():
                        slots._forward(n, width)

            run()
            if self.cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(repeats):
                run()
            if self.cuda:
                torch.cuda.synchronize()
            total += count * (time.perf_counter() - t) / repeats
        return total


async def one_round(collector, round_index: int, seed: int) -> tuple[float, int]:
    t = time.perf_counter()
    trajs = await collector.collect(
        "Math-v0",
        list(range(PROMPTS * round_index, PROMPTS * (round_index + 1))),
        GROUP,
        env_kwargs={"split": "train"},
        seed=seed + round_index,
        sampling_seed=int(np.random.SeedSequence([seed, round_index, 1]).generate_state(1)[0]),
    )
    errors = [t.error for t in trajs if t.error]
    if errors:
        raise SystemExit(f"episodes failed: {errors[:3]}")
    return time.perf_counter() - t, sum(sum(t.loss_mask) for t in trajs)


def profile_round(probe: Probe, collector, round_index: int, seed: int, top: int) -> None:
    """cProfile of one untimed round: the engine's steps (worker thread) and the collector's thread."""
    import cProfile
    import pstats

    probe.profile, main = cProfile.Profile(), cProfile.Profile()
    main.enable()
    try:
        asyncio.run(one_round(collector, round_index, seed))
    finally:
        main.disable()
        worker, probe.profile = probe.profile, None
    for name, prof in (("engine worker thread (steps)", worker), ("collector thread", main)):
        print(f"---- profile: {name}, top {top} by own time", flush=True)
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def count_syncs(engine, collector, round_index: int, seed: int) -> int:
    import warnings

    import torch

    seen = []
    show = warnings.showwarning
    warnings.showwarning = lambda message, *a, **k: seen.append(str(message))
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        asyncio.run(one_round(collector, round_index, seed))
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = show
        warnings.resetwarnings()
    return sum("synchroniz" in m for m in seen)


def run_mode(mode: str, args, device: str) -> dict:
    import torch

    from chatgym.trainer.rollout.collector import Collector, RolloutConfig

    engine = make_engine(device, args.real_weights if device == "cuda" else False, args.seed)
    engine.async_scheduling = mode.endswith("async")
    engine.fused_step = not mode.startswith("layers")
    probe = Probe(engine)
    cfg = RolloutConfig(temperature=1.0, max_tokens=NEW_TOKENS, max_response_tokens=NEW_TOKENS,
                          max_model_len=MAX_LEN, max_concurrent_episodes=PROMPTS * GROUP)
    collector = Collector(engine, engine.tokenizer, cfg)
    rounds = []
    try:
        for k in range(args.warmup + args.rounds):
            probe.reset()
            steps0, prefills0 = engine.decode_steps, engine.batches_run
            wall, tokens = asyncio.run(one_round(collector, k, args.seed))
            steps, prefills = engine.decode_steps - steps0, engine.batches_run - prefills0
            if k < args.warmup:
                continue
            floor = probe.floor_s()
            rounds.append({
                "wall_s": wall, "tokens": tokens, "steps": steps, "rows_per_step": probe.rows / max(steps, 1),
                "step_ms": 1000 * (probe.step_s - probe.prefill_s) / max(steps, 1), "floor_ms": 1000 * floor / max(steps, 1),
                "prefill_s": probe.prefill_s, "prefills": prefills,
            })
            print(mode, "round", k, json.dumps({k2: round(v, 4) for k2, v in rounds[-1].items()}), flush=True)
        if args.profile:
            profile_round(probe, collector, args.warmup + args.rounds + 1, args.seed, args.profile)
        syncs = None
        if args.count_syncs and device == "cuda":
            steps0 = engine.decode_steps
            n = count_syncs(engine, collector, args.warmup + args.rounds, args.seed)
            syncs = n / max(engine.decode_steps - steps0, 1)
    finally:
        collector.close()
        asyncio.run(engine.close())
        del engine
        if device == "cuda":
            torch.cuda.empty_cache()

    def med(key):
        return statistics.median(r[key] for r in rounds)

    return {
        "mode": mode, "tok_s": med("tokens") / med("wall_s"), "wall_s": med("wall_s"), "tokens": med("tokens"),
        "steps": med("steps"), "rows_per_step": med("rows_per_step"), "step_ms": med("step_ms"),
        "floor_ms": med("floor_ms"), "host_ms": med("step_ms") - med("floor_ms"),
        "prefill_s": med("prefill_s"), "prefills": med("prefills"), "syncs_per_step": syncs,
    }


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = ["batched", "async", "layers", "layers_async"]
    ap.add_argument("--modes", nargs="+", default=modes, choices=modes)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--random-weights", dest="real_weights", action="store_false",
                    help="on CUDA: SmolLM2's shape with random weights (CPU always runs a tiny model)")
    ap.add_argument("--count-syncs", action="store_true", help="CUDA: device syncs per decode step")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile one more round: the N functions with the most own time, per thread")
    ap.add_argument("--switch-interval", type=float, default=None, metavar="S",
                    help="sys.setswitchinterval for the run (Python's default: 0.005 s)")
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(torch.cuda.get_device_name() if device == "cuda" else "cpu (tiny random Llama)",
          "torch", torch.__version__, "switch interval", sys.getswitchinterval(), flush=True)
    results = [run_mode(mode, args, device) for mode in args.modes]
    print(f"{'mode':12s} {'tok/s':>8s} {'round s':>8s} {'tokens':>7s} {'steps':>6s} {'rows/st':>7s} "
          f"{'ms/step':>8s} {'floor':>7s} {'host':>7s} {'prefill s':>9s} {'prefills':>8s} {'syncs/st':>8s}")
    for r in results:
        syncs = "-" if r["syncs_per_step"] is None else f"{r['syncs_per_step']:.1f}"
        print(f"{r['mode']:12s} {r['tok_s']:8,.0f} {r['wall_s']:8.3f} {r['tokens']:7.0f} {r['steps']:6.0f} "
              f"{r['rows_per_step']:7.1f} {r['step_ms']:8.2f} {r['floor_ms']:7.2f} {r['host_ms']:7.2f} "
              f"{r['prefill_s']:9.3f} {r['prefills']:8.0f} {syncs:>8s}")


if __name__ == "__main__":
    main()
