"""Seconds per policy update on CPU, on the README main job's batch, for each way of running it.

The main job (``examples/configs/math_grpo.yaml``) trains SmolLM2-135M on Math-v0 with 8 prompts x 8
samples of <= 64 new tokens; on CPU its policy update was ~80% of every step. This builds that batch
for real once — the first ``--groups`` Math-v0 train prompts, ``--group-size`` samples each drawn by
transformers' ``generate`` (temperature 1, seeded) from the same weights, scored by the env, GRPO
advantages — and times :func:`chatgym.trainer.learner.update.update` (forward + backward + AdamW step) in
each layout, each on a fresh copy of the same weights:

- ``padded``: length-sorted micro-batches, right-padded (``share_prompt_prefix: false``).
- ``shared``: the group's prompt forwarded once, its KV cache repeated for the padded answers (``share_prompt_prefix: true``
  without packing).
- ``packed``: each micro-batch's rows end to end, no padding, block-diagonal mask.
- ``packed+shared``: the same with the group's prompt laid down once (the CPU default).
- ``packed+shared mb N``: other micro-batch sizes.
- ``... +old-logprob pass``: a no-grad pass computing ``old_logprobs`` first (what ``ppo_epochs`` /
  ``mini_batches`` > 1 needs; skipped when each batch is used for one step — ratio 1 by construction).

Then on a sub-batch of ``--bf16-groups`` groups: fp32 vs bf16 autocast (fp32 weights) of the default
layout — seconds and ratio, plus whether bf16 moves the weights the same way: the cosine between the
two gradients (the direction of an SGD step), between the two first AdamW steps (``g / (|g| + eps)``)
and the difference of the two losses. The machine's bf16 support (the flags ``compute_dtype: auto``
reads) is printed first: on an AVX2-only CPU bf16 is emulated and expected to be slower.

    python benchmarks/train_step_cpu.py                     # real SmolLM2 weights, 3 repeats
    python benchmarks/train_step_cpu.py --repeats 2 --threads 2
    python benchmarks/train_step_cpu.py --random-init --config-dir DIR   # no weights (a config.json)

Prints one line per layout: median seconds per update over the repeats, tokens computed, and the
ratio to ``shared`` (the old default).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import torch

from chatgym.trainer.config.run import AlgoConfig
from chatgym.trainer.learner.batch import TokenBatch, collate, prompt_groups
from chatgym.trainer.learner.forward import ForwardPlan, micro_batch_plan, per_token_pass, policy_logprobs
from chatgym.trainer.learner.policy import autocast_context, resolve_compute_dtype
from chatgym.trainer.learner.prepare import compute_advantages
from chatgym.trainer.learner.update import UpdateState, update
from chatgym.trainer.models.dtype import NATIVE_BF16_FLAGS, cpu_flags
from chatgym.trainer.rollout.types import Trajectory

# The main job's algorithm (examples/configs/math_grpo.yaml).
ALGO = AlgoConfig(
    advantage="grpo",
    policy_loss="clip_higher",
    policy_loss_kwargs={"eps_low": 0.2, "eps_high": 0.28},
    loss_agg="token-mean",
    tis_cap=2.0,
)
LR = 1.0e-5
ADAM_EPS = 1e-8


def build_batch(
    model: Any, tokenizer: Any, groups: int, group_size: int, max_new: int, seed: int
) -> TokenBatch:
    """The main job's rollout batch: real Math-v0 prompts, sampled answers, env rewards, GRPO advantages."""
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers Math-v0)

    env = gym.make("Math-v0", split="train")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    trajs: list[Trajectory] = []
    gen = torch.Generator().manual_seed(seed)
    for g in range(groups):
        obs, _ = env.reset(options={"task_index": g})
        prompt = tokenizer.apply_chat_template(
            obs, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt] * group_size),
                attention_mask=torch.ones(group_size, len(prompt), dtype=torch.long),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=max_new,
                eos_token_id=eos,
                pad_token_id=eos,
                output_scores=True,
                return_dict_in_generate=True,
            )
        scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # (G, new, V)
        for i in range(group_size):
            new = out.sequences[i, len(prompt) :].tolist()
            if eos in new:
                new = new[: new.index(eos) + 1]
            logprobs = scores[i, torch.arange(len(new)), torch.tensor(new)].tolist()
            env.reset(options={"task_index": g})
            _, reward, *_ = env.step(tokenizer.decode(new, skip_special_tokens=True))
            trajs.append(
                Trajectory(
                    env_id="Math-v0",
                    task_id=g,
                    group_id=g,
                    sample_index=i,
                    token_ids=prompt + new,
                    loss_mask=[0] * len(prompt) + [1] * len(new),
                    engine_logprobs=[0.0] * len(prompt) + logprobs,
                    prompt_len=len(prompt),
                    rewards=[float(reward)],
                    reward=float(reward),
                    finish_reasons=["stop" if new and new[-1] == eos else "length"],
                )
            )
    env.close()
    batch = collate(trajs, tokenizer.pad_token_id or 0)
    rewards = torch.tensor([t.reward for t in trajs])
    token_rewards = torch.zeros(batch.loss_mask.shape)
    last = batch.lengths - 1
    token_rewards[torch.arange(len(trajs)), last] = rewards
    group_ids = torch.tensor([t.group_id for t in trajs])
    batch.advantages, batch.returns, _ = compute_advantages(batch, token_rewards, group_ids, ALGO)
    return batch


def with_signal(batch: TokenBatch) -> TokenBatch:
    """``batch`` with alternating +1/-1 advantages when all of its groups were uniform (all advantages
    0: no gradient, nothing to compare directions by)."""
    if not bool(batch.advantages.abs().sum()):
        signs = torch.tensor([1.0, -1.0]).repeat(len(batch) // 2 + 1)[: len(batch)]
        batch.advantages = torch.where(batch.loss_mask, signs[:, None], 0.0)
    return batch


def sub_batch(batch: TokenBatch, groups: int, group_size: int) -> TokenBatch:
    sub = batch.select(list(range(groups * group_size)))
    sub.advantages = batch.advantages[: groups * group_size, : sub.input_ids.shape[1]]
    return with_signal(sub)


def tokens_computed(batch: TokenBatch, *, share: bool, pack: bool, micro: int = 16, **_: Any) -> int:
    """Token positions a layout runs through the model (padding included), from the update's own plan."""
    total = 0
    for rows, prefix in micro_batch_plan(batch, micro, share, pack):
        lengths = batch.lengths[rows]
        if pack:
            total += int(lengths.sum()) - prefix * (len(rows) - 1)
        elif prefix:  # one padded forward of the groups' prompts, one of all rows' continuations
            groups = prompt_groups(batch.select(rows))
            starts = torch.zeros(len(rows), dtype=torch.long)
            for members, p in groups:
                starts[members] = p
            total += len(groups) * max(p for _, p in groups) + len(rows) * int((lengths - starts).max())
        else:
            total += len(rows) * int(lengths.max())
    return total


def run_update(
    base: Any,
    batch: TokenBatch,
    *,
    share: bool,
    pack: bool,
    micro: int = 16,
    compute: str = "float32",
    old_pass: bool = False,
    optimizer: str = "adamw",
) -> tuple[float, Any, dict[str, float]]:
    """(seconds, updated model, metrics) of one update on a fresh copy of ``base``."""
    model = copy.deepcopy(base).train()
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=ADAM_EPS, weight_decay=0.0)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
    models = UpdateState(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0))
    device = torch.device("cpu")

    def autocast() -> Any:
        return autocast_context(device, compute, "float32")

    work = copy.copy(batch)
    t0 = time.perf_counter()
    if old_pass:

        def old(mb: TokenBatch, prefix_len: int) -> torch.Tensor:
            with autocast():
                return policy_logprobs(model, mb, prefix_len, with_entropy=False, pack=pack)[0]

        work.old_logprobs = per_token_pass(old, work, micro, device, share, pack)
    metrics = update(
        models,
        work,
        ALGO,
        ForwardPlan(micro_batch_size=micro, device=device, autocast=autocast, share_prefix=share, pack=pack),
        max_grad_norm=None if optimizer == "sgd" else 1.0,
        generator=torch.Generator().manual_seed(0),
    )
    return time.perf_counter() - t0, model, metrics


def flat(model: Any) -> torch.Tensor:
    return torch.cat([p.detach().flatten().double() for p in model.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--groups", type=int, default=8, help="prompts (main job: 8)")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (main job: 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="main job: 64")
    parser.add_argument("--bf16-groups", type=int, default=2, help="groups of the fp32-vs-bf16 part")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--random-init", action="store_true", help="random weights of SmolLM2's shape")
    parser.add_argument("--config-dir", default=None, help="model dir with config.json + tokenizer")
    parser.add_argument("--skip", default="", help="comma-separated layouts to leave out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-batch", default=None, help="write the built batch here (torch.save)")
    parser.add_argument(
        "--load-batch", default=None, help="time a batch saved by --save-batch (e.g. on another machine)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from chatgym.trainer.models.packaged import load_model_path
    from chatgym.trainer.models.random_init import random_model

    path = args.config_dir or str(load_model_path("smollm2"))
    tokenizer = None if args.load_batch else AutoTokenizer.from_pretrained(path)
    if args.random_init:
        model = random_model(path, seed=args.seed)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.use_cache = False
    model.eval()

    flags = cpu_flags()
    auto, reason = resolve_compute_dtype("auto", "float32", torch.device("cpu"))
    native = [f for f in NATIVE_BF16_FLAGS if f in flags]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, capability "
        f"{torch.backends.cpu.get_cpu_capability()}, native bf16 flags {native or 'none'}; "
        f"compute_dtype auto -> {auto} ({reason})",
        flush=True,
    )
    t0 = time.perf_counter()
    if args.load_batch:
        batch = TokenBatch(**torch.load(args.load_batch))
        if len(batch) > args.groups * args.group_size:
            batch = sub_batch(batch, args.groups, args.group_size)
    else:
        batch = with_signal(
            build_batch(model, tokenizer, args.groups, args.group_size, args.max_new_tokens, args.seed)
        )
    if args.save_batch:
        torch.save({k: v for k, v in vars(batch).items() if v is not None}, args.save_batch)
    resp = (batch.lengths - batch.prompt_lens).float()
    print(
        f"batch: {len(batch)} rows, prompts {batch.prompt_lens.min()}-{batch.prompt_lens.max()} tokens, "
        f"answers mean {resp.mean():.1f} max {int(resp.max())} tokens, {int(batch.loss_mask.sum())} trained "
        f"tokens, {float(batch.advantages.ne(0).any(1).float().mean()):.2f} of rows with a nonzero advantage "
        f"(built in {time.perf_counter() - t0:.0f} s)",
        flush=True,
    )

    layouts = [
        ("shared", {"share": True, "pack": False}),
        ("padded", {"share": False, "pack": False}),
        ("packed", {"share": False, "pack": True}),
        ("packed+shared", {"share": True, "pack": True}),
        ("packed+shared mb 4", {"share": True, "pack": True, "micro": 4}),
        ("packed+shared +old-logprob pass", {"share": True, "pack": True, "old_pass": True}),
        ("shared +old-logprob pass", {"share": True, "pack": False, "old_pass": True}),
    ]
    if native:  # emulated bf16 (AVX2) takes several times longer: only the sub-batch check below
        layouts.append(("packed+shared bf16 autocast", {"share": True, "pack": True, "compute": "bfloat16"}))
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    results: dict[str, float] = {}
    for name, kw in layouts:
        if name in skip:
            continue
        times = [run_update(model, batch, **kw)[0] for _ in range(args.repeats)]
        results[name] = statistics.median(times)
        tokens = tokens_computed(batch, **{k: v for k, v in kw.items() if k != "compute"})
        ratio = results["shared"] / results[name] if "shared" in results else float("nan")
        print(
            f"{name:34s} {results[name]:7.2f} s/update  ({', '.join(f'{t:.2f}' for t in times)})  "
            f"{tokens:6d} tokens  x{ratio:.2f} vs shared",
            flush=True,
        )

    if args.bf16_groups:
        sub = sub_batch(batch, min(args.bf16_groups, args.groups), args.group_size)
        base = flat(model)
        print(f"-- fp32 vs bf16 autocast, packed+shared, {len(sub)} rows", flush=True)
        timing: dict[str, float] = {}
        grads: dict[str, torch.Tensor] = {}
        losses: dict[str, float] = {}
        for compute in ("float32", "bfloat16"):
            times = [
                run_update(model, sub, share=True, pack=True, compute=compute)[0] for _ in range(args.repeats)
            ]
            timing[compute] = statistics.median(times)
            # SGD with lr 1 and no clipping: the weight change is minus the gradient.
            _, moved, metrics = run_update(
                model, sub, share=True, pack=True, compute=compute, optimizer="sgd"
            )
            grads[compute] = base - flat(moved)
            losses[compute] = metrics["actor/pg_loss"]
            print(f"{compute:9s} {timing[compute]:7.2f} s/update ({', '.join(f'{t:.2f}' for t in times)})")
        g32, g16 = grads["float32"], grads["bfloat16"]
        cos_grad = float(torch.nn.functional.cosine_similarity(g32, g16, dim=0))
        # AdamW's first step is lr * m_hat / (sqrt(v_hat) + eps) = lr * g / (|g| + eps).
        a32, a16 = g32 / (g32.abs() + ADAM_EPS), g16 / (g16.abs() + ADAM_EPS)
        cos_adam = float(torch.nn.functional.cosine_similarity(a32, a16, dim=0))
        print(
            f"bf16 autocast / fp32 time x{timing['bfloat16'] / timing['float32']:.2f}; cosine of the "
            f"gradients {cos_grad:.4f}, of the first AdamW steps {cos_adam:.4f}; pg loss fp32 "
            f"{losses['float32']:.6f} bf16 {losses['bfloat16']:.6f} (diff {losses['bfloat16'] - losses['float32']:+.2e})"
        )


if __name__ == "__main__":
    main()
