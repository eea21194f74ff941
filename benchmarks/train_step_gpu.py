"""Seconds per policy update on the vs-TRL shape, padded vs packed (``model.pack``), on CUDA.

The batch is shaped like a Math-v0 step of ``benchmarks/vs_trl_gpu.py``: ``--prompts`` (8) real
Math-v0 train prompts through SmolLM2's chat template, ``--group-size`` (8) answers each of seeded
random lengths in ``[--min-answer, --max-answer]`` (16..128) tokens of random ids, 0/1 rewards drawn
at random and GRPO advantages, engine logprobs = the padded forward's own plus N(0, 0.05) noise (so
the truncated IS weights are ~1, as in training). ``--batches`` (3) such batches with different
seeds are cycled through the repeats, so the padded shapes change from update to update as they do
between training steps. The model and optimizer are the trainer's own pieces
(:func:`~chatgym.trainer.learner.policy.load_policy` of ``smollm2``, fp32 master weights,
``compute_dtype: auto`` = bf16 autocast on CUDA, fused AdamW lr 1e-5 via ``build_optimizer``), and
each update is :func:`chatgym.trainer.learner.update.update` (forward + backward + optimizer step)
with ``torch.cuda.synchronize()`` around it, micro-batch size 64 as in vs_trl_gpu.py.

Layouts, each with gradient checkpointing on (what vs_trl_gpu.py runs) and off, each from the same
initial weights with a fresh optimizer:

- ``padded``: length-sorted right-padded micro-batches (the CUDA default now; with checkpointing the
  shared prompt is off since it needs the KV cache);
- ``padded+shared``: a group's prompt once, its KV cache repeated (checkpointing off only);
- ``packed+shared``: one pack per group, the prompt laid down once (what ``model.pack: true`` runs);
- ``packed N``: no prompt sharing, the 64-row micro-batch packed into forwards of <= N tokens
  (``--pack-sizes``; 100000 = the whole micro-batch in one forward).

Per layout: one untimed warm-up update per batch, then ``--repeats`` timed updates; prints the
median / min / max seconds, the ratio baseline / layout (the baseline: what the trainer runs on CUDA
now with that checkpointing setting, ``padded`` or ``padded+shared``), forwards and tokens per
update, peak memory, and allocator events (``num_device_alloc``, ``num_alloc_retries`` deltas) over
the timed updates. Numerical check on the initial weights: max |logprob diff| of each layout vs the
padded forward (fp32 and bf16 autocast), and the first update's loss / grad-norm differences.

``--compile``: the learner's decoder layers compiled (``model.compile: true``, as vs_trl_gpu.py's ours_px
runs). ``--profile``: after each layout's timed updates, one more under ``torch.profiler``: its wall
seconds, the CUDA kernels' summed seconds (the rest of the wall clock the GPU waited for the host to
issue work), the kernels' count and the twelve costliest kernel names.

    # on the GPU machine (~1.5-2 min with real weights):
    python benchmarks/train_step_gpu.py --repeats 10 --json /tmp/out/train_step_gpu.json
    python benchmarks/train_step_gpu.py --only padded --checkpointing on --compile --profile
    # CPU smoke run (random 2-layer SmolLM2 shape, a small batch):
    python benchmarks/train_step_gpu.py --random-init --layers 2 --prompts 2 --group-size 4 \\
        --max-answer 32 --repeats 1 --batches 1 --pack-sizes 256
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from typing import Any

import torch

from chatgym.trainer.config.run import AlgoConfig, LoraConfig, ModelConfig, OptimConfig
from chatgym.trainer.learner.batch import TokenBatch, collate
from chatgym.trainer.learner.forward import (
    PACK_MAX_TOKENS_CUDA,
    ForwardPlan,
    batch_logprobs,
    micro_batch_plan,
)
from chatgym.trainer.learner.optim import build_optimizer
from chatgym.trainer.learner.policy import autocast_context, load_policy, resolve_compute_dtype
from chatgym.trainer.learner.prepare import compute_advantages
from chatgym.trainer.learner.update import UpdateState, update
from chatgym.trainer.rollout.types import Trajectory

# vs_trl_gpu.py's algorithm: clip-higher 0.2 / 0.28, token-mean, GRPO, TIS cap 2 (the default), no KL.
ALGO = AlgoConfig(policy_loss="clip_higher", policy_loss_kwargs={"eps_low": 0.2, "eps_high": 0.28})
OPTIM = OptimConfig(lr=1e-5)
MICRO_BATCH = 64
ALLOC_KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


def math_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """The first ``count`` Math-v0 train prompts as the chat template tokenizes them."""
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers Math-v0)

    env = gym.make("Math-v0", split="train")
    prompts = []
    for g in range(count):
        obs, _ = env.reset(options={"task_index": g})
        prompts.append(
            list(
                tokenizer.apply_chat_template(
                    obs, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
        )
    env.close()
    return prompts


def build_batch(prompts: list[list[int]], args: argparse.Namespace, vocab: int, seed: int) -> TokenBatch:
    """Groups of ``args.group_size`` random answers per prompt (seeded), with GRPO advantages."""
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for g, prompt in enumerate(prompts):
        for i in range(args.group_size):
            n = int(torch.randint(args.min_answer, args.max_answer + 1, (1,), generator=gen))
            answer = torch.randint(100, vocab, (n,), generator=gen).tolist()
            reward = float(torch.rand((), generator=gen) < 0.3)
            trajs.append(
                Trajectory(
                    env_id="Math-v0",
                    task_id=g,
                    group_id=g,
                    sample_index=i,
                    token_ids=prompt + answer,
                    loss_mask=[0] * len(prompt) + [1] * n,
                    engine_logprobs=[0.0] * (len(prompt) + n),
                    prompt_len=len(prompt),
                    rewards=[reward],
                    reward=reward,
                    finish_reasons=["length"],
                )
            )
    batch = collate(trajs, pad_id=0)
    token_rewards = torch.zeros(batch.loss_mask.shape)
    token_rewards[torch.arange(len(trajs)), batch.lengths - 1] = torch.tensor([t.reward for t in trajs])
    group_ids = torch.tensor([t.group_id for t in trajs])
    batch.advantages, batch.returns, _ = compute_advantages(batch, token_rewards, group_ids, ALGO)
    if not bool(batch.advantages.abs().sum()):  # every group uniform: give the update a signal
        signs = torch.tensor([1.0, -1.0]).repeat(len(batch))[: len(batch)]
        batch.advantages = torch.where(batch.loss_mask, signs[:, None], 0.0)
    return batch


@dataclasses.dataclass
class Layout:
    name: str
    share: bool
    pack: bool
    checkpointing: bool
    pack_max_tokens: int = PACK_MAX_TOKENS_CUDA


def baseline(checkpointing: bool) -> str:
    """What the trainer runs on CUDA today: padded; sharing the prompt needs the KV cache, which
    gradient checkpointing drops (``Learner.share_prefix``)."""
    return "padded" if checkpointing else "padded+shared"


def layouts(pack_sizes: list[int]) -> list[Layout]:
    """Every layout, the baseline of each checkpointing setting first."""
    out = []
    for ckpt in (True, False):
        if not ckpt:
            out.append(Layout("padded+shared", share=True, pack=False, checkpointing=False))
        out.append(Layout("padded", share=False, pack=False, checkpointing=ckpt))
        # model.pack: true with the CUDA default size (a group of <= ~1100 tokens is one pack).
        out.append(Layout("packed+shared", share=True, pack=True, checkpointing=ckpt))
        for size in pack_sizes:
            out.append(
                Layout(f"packed {size}", share=False, pack=True, checkpointing=ckpt, pack_max_tokens=size)
            )
    return out


def set_checkpointing(policy: Any, on: bool) -> None:
    if on:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        policy.gradient_checkpointing_disable()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def alloc_stats(device: torch.device) -> dict[str, int]:
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    return {k: int(stats.get(k, 0)) for k in ALLOC_KEYS}


def profile_update(run: Any) -> dict:
    """One ``run()`` (an update, synchronised) under ``torch.profiler``: ``wall_s``, ``kernels_s`` (CUDA
    kernels, memcpys and memsets summed), ``kernels`` (their count) and ``top`` (the twelve costliest
    names with seconds and counts)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = run()
    cuda = torch.autograd.DeviceType.CUDA
    kernels = [(e.name, e.device_time / 1e6) for e in prof.events() if e.device_type == cuda]
    by_name: dict[str, list[float]] = {}
    for name, sec in kernels:
        by_name.setdefault(name, []).append(sec)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:12]
    return {"wall_s": wall, "kernels_s": sum(sec for _, sec in kernels), "kernels": len(kernels),
            "top": [(name[:110], sum(t), len(t)) for name, t in top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10, help="timed updates per layout")
    ap.add_argument("--batches", type=int, default=3, help="distinct batches cycled through the repeats")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--min-answer", type=int, default=16)
    ap.add_argument("--max-answer", type=int, default=128)
    ap.add_argument("--pack-sizes", default="1024,2048,4096,100000", help="packed layouts without sharing")
    ap.add_argument("--only", default="", help="comma-separated layout names to run (default: all)")
    ap.add_argument("--checkpointing", choices=("both", "on", "off"), default="both")
    ap.add_argument("--random-init", action="store_true", help="random weights of SmolLM2's shape")
    ap.add_argument("--layers", type=int, default=None, help="with --random-init: num_hidden_layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--compile", action="store_true", help="the learner's decoder layers compiled (model.compile)")
    ap.add_argument("--profile", action="store_true", help="one more update per layout under torch.profiler")
    args = ap.parse_args()

    from chatgym.trainer.chat.tokenizer import get_tokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    overrides = {"num_hidden_layers": args.layers} if args.random_init and args.layers else {}
    model_cfg = ModelConfig(path="smollm2", random_init=args.random_init, config_overrides=overrides,
                            compile=args.compile)
    compute, reason = resolve_compute_dtype("auto", "float32", device)
    t0 = time.perf_counter()
    policy = load_policy(model_cfg, LoraConfig(), device)
    tokenizer = get_tokenizer("smollm2")
    prompts = math_prompts(tokenizer, args.prompts)
    vocab = policy.config.vocab_size
    batches = [build_batch(prompts, args, vocab, args.seed + k) for k in range(args.batches)]
    print(
        f"torch {torch.__version__} on {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), "
        f"compute {compute} ({reason}); weights {'random' if args.random_init else 'SmolLM2-135M'} "
        f"{sum(p.numel() for p in policy.parameters()) / 1e6:.0f}M params; set-up {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    for k, b in enumerate(batches):
        answers = b.lengths - b.prompt_lens
        print(
            f"batch {k}: {len(b)} rows, prompts {int(b.prompt_lens.min())}-{int(b.prompt_lens.max())} tokens, "
            f"answers {int(answers.min())}-{int(answers.max())} (mean {float(answers.float().mean()):.0f}), "
            f"{int(b.lengths.sum())} real tokens, padded {tuple(b.input_ids.shape)}",
            flush=True,
        )

    def autocast() -> Any:
        return autocast_context(device, compute, "float32")

    def plan_of(layout: Layout) -> ForwardPlan:
        return ForwardPlan(
            micro_batch_size=MICRO_BATCH,
            device=device,
            share_prefix=layout.share,
            pack=layout.pack,
            pack_max_tokens=layout.pack_max_tokens,
            autocast=autocast,
        )

    # Engine logprobs: the padded forward's own (fp32, initial weights) plus noise, per batch.
    noise = torch.Generator().manual_seed(args.seed)
    base_plan = dataclasses.replace(
        plan_of(Layout("padded", False, False, False)),
        autocast=lambda: autocast_context(device, "float32", "float32"),
    )
    policy.eval()
    reference = []
    for b in batches:
        own = batch_logprobs(policy, b, base_plan)
        reference.append(own)
        b.engine_logprobs = torch.where(
            b.loss_mask, own + 0.05 * torch.randn(own.shape, generator=noise), 0.0
        )
    policy.train()
    initial = {k: v.detach().clone() for k, v in policy.state_dict().items()}

    # Forwards and tokens per update, counted at the decoder (padding included in padded layouts).
    forwards: list[int] = []
    hook = policy.model.register_forward_hook(
        lambda m, a, kw, out: forwards.append(kw["input_ids"].numel()), with_kwargs=True
    )
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    wanted_ckpt = {"both": (True, False), "on": (True,), "off": (False,)}[args.checkpointing]
    sizes = [int(s) for s in args.pack_sizes.split(",") if s.strip()]
    results = []
    padded_time: dict[bool, float] = {}
    padded_first: dict[bool, dict[str, float]] = {}
    for layout in layouts(sizes):
        if layout.checkpointing not in wanted_ckpt or (only and layout.name not in only):
            continue
        policy.load_state_dict(initial)
        set_checkpointing(policy, layout.checkpointing)
        optimizer, scheduler = build_optimizer([(list(policy.parameters()), OPTIM.lr)], OPTIM, 10_000)
        state = UpdateState(policy, optimizer, scheduler)
        plan = plan_of(layout)
        # Logprobs of this layout on the initial weights vs the padded fp32 ones (trained tokens).
        policy.eval()
        fp32_plan = dataclasses.replace(plan, autocast=lambda: autocast_context(device, "float32", "float32"))
        diff32 = max(
            float((batch_logprobs(policy, b, fp32_plan) - ref)[b.loss_mask].abs().max())
            for b, ref in zip(batches, reference, strict=True)
        )
        diff16 = max(
            float((batch_logprobs(policy, b, plan) - ref)[b.loss_mask].abs().max())
            for b, ref in zip(batches, reference, strict=True)
        )
        policy.train()

        def one(
            batch: TokenBatch, state: UpdateState = state, plan: ForwardPlan = plan
        ) -> tuple[float, dict]:
            sync(device)
            t = time.perf_counter()
            metrics = update(
                state, batch, ALGO, plan, max_grad_norm=1.0, generator=torch.Generator().manual_seed(0)
            )
            sync(device)
            return time.perf_counter() - t, metrics

        first = one(batches[0])[1]  # from the initial weights: the numerical check
        for b in batches[1:]:
            one(b)  # warm-up of every batch's shapes
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        before = alloc_stats(device)
        forwards.clear()
        times = [one(batches[r % len(batches)])[0] for r in range(args.repeats)]
        after = alloc_stats(device)
        median = statistics.median(times)
        key = layout.checkpointing
        if layout.name == baseline(key):
            padded_time[key], padded_first[key] = median, first
        ref_first = padded_first.get(key, first)
        row = {
            "layout": layout.name,
            "checkpointing": layout.checkpointing,
            "median_s": median,
            "min_s": min(times),
            "max_s": max(times),
            "times": times,
            "baseline": baseline(key),
            "baseline_over_this": padded_time.get(key, float("nan")) / median,
            "forwards_per_update": len(forwards) / max(args.repeats, 1),
            "tokens_per_update": sum(forwards) / max(args.repeats, 1),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan"),
            "alloc_deltas": {k: after[k] - before[k] for k in after},
            "max_abs_logprob_diff_fp32": diff32,
            f"max_abs_logprob_diff_{compute}": diff16,
            "pg_loss": first["actor/pg_loss"],
            "pg_loss_diff": first["actor/pg_loss"] - ref_first["actor/pg_loss"],
            "grad_norm": first["actor/grad_norm"],
            "grad_norm_diff": first["actor/grad_norm"] - ref_first["actor/grad_norm"],
        }
        if args.profile:
            row["profile"] = profile_update(lambda: one(batches[0])[0])
        results.append(row)
        print(
            f"{layout.name:15s} ckpt {'on ' if layout.checkpointing else 'off'} "
            f"{median:7.4f} s (min {min(times):.4f} max {max(times):.4f})  x{row['baseline_over_this']:.2f} vs {baseline(key)}  "
            f"{row['forwards_per_update']:4.1f} fwd {row['tokens_per_update']:7.0f} tok  peak {row['peak_gib']:.2f} GiB  "
            f"alloc {row['alloc_deltas']}  |dlogp| fp32 {diff32:.1e} {compute} {diff16:.1e}  "
            f"loss diff {row['pg_loss_diff']:+.1e} grad-norm diff {row['grad_norm_diff']:+.1e}",
            flush=True,
        )
        if args.profile and device.type != "cuda":
            print("    profiled update: no CUDA, no kernels recorded", flush=True)
        elif args.profile:
            prof = row["profile"]
            print(f"    profiled update {prof['wall_s']:.4f} s: {prof['kernels']} kernels, {prof['kernels_s']:.4f} s "
                  f"summed ({prof['kernels_s'] / prof['wall_s']:.0%} of the wall clock)", flush=True)
            for name, sec, count in prof["top"]:
                print(f"      {sec * 1e3:8.3f} ms {count:5d} x  {name}", flush=True)
    hook.remove()
    plans = {
        name: [len(rows) for rows, _ in micro_batch_plan(batches[0], MICRO_BATCH, share, pack)]
        for name, share, pack in (
            ("shared", True, False),
            ("packed+shared", True, True),
            ("plain", False, False),
        )
    }
    print(
        f"micro-batch rows of batch 0: shared-prompt plan {plans['shared']}, packed+shared plan "
        f"{plans['packed+shared']}, plain plan {plans['plain']}"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": str(device), "compute": compute, "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
