"""Seconds per GRPO step (generation + update + weight sync) and tokens/s of chatgym's trainer.

8 prompts x 8 samples, <= 128 new tokens each (TRL's GRPOTrainer measured 4.3 s/step on an H200 for
that shape with SmolLM2, see the peers' figures in benchmarks/RESULTS.md). The env is the tests' ``ChatgymTestLetters-v0`` (reward =
share of letters in the reply; no dataset needed) and the model is SmolLM2-135M's architecture with
random weights (``--random-init``, the default: the real weights cannot always be brought to the GPU
machine) or its real weights. On CUDA: fp32 master weights, bf16 autocast, gradient checkpointing,
the transformers engine in bf16 on the same GPU.

    python benchmarks/train_step.py --steps 6            # CUDA if available, else CPU
    python benchmarks/train_step.py --steps 3 --real-weights --engine vllm
    # the H200 check: Math-v0 (reasoning-gym basic_arithmetic), real weights, HF engine with the
    # static-slot decode (CUDA graphs), then the same with the padded dynamic-cache decode
    python benchmarks/train_step.py --real-weights --env Math-v0 --lr 1e-5 --steps 20 \
        --engine-options '{decode: static}' --then-options '{decode: dynamic}' --then-steps 6

Prints each step's split (rollout / update / sync), then medians over steps 2.. (step 1 pays warm-up).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

KEYS = (
    "reward/mean",
    "response/length_mean",
    "timing/step_s",
    "timing/rollout_s",
    "timing/update_s",
    "timing/sync_s",
    "throughput/gen_tokens_per_s",
    "throughput/train_tokens_per_s",
    "timing/generate_s_mean",
    "timing/env_s_mean",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--real-weights", action="store_true", help="SmolLM2's weights instead of random init"
    )
    parser.add_argument("--engine", default="hf", help="engine backend (hf, vllm)")
    parser.add_argument("--env", default=None, help="env id (default: the tests' letters env)")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--engine-options", default="{}", help="engine.options, YAML flow mapping")
    parser.add_argument("--then-options", default=None, help="a second run with these engine.options")
    parser.add_argument("--then-steps", type=int, default=None, help="steps of the second run")
    parser.add_argument("--save", default=None, help="copy each run's metrics.jsonl into this folder")
    args = parser.parse_args()
    runs = [(args.engine_options, args.steps)]
    if args.then_options is not None:
        runs.append((args.then_options, args.then_steps or args.steps))
    for options, steps in runs:
        run(args, options, steps)


def run(args: argparse.Namespace, options: str, steps: int) -> None:
    import torch
    import train_helpers

    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.train import Trainer

    train_helpers.register()
    env_id = args.env or train_helpers.LETTERS_ENV_ID
    cuda = torch.cuda.is_available()
    out = Path(tempfile.mkdtemp(prefix="chatgym-train-step-"))
    cfg = load_config(
        None,
        [
            "model.path=smollm2",
            f"model.random_init={str(not args.real_weights).lower()}",
            f"model.gradient_checkpointing={str(cuda).lower()}",
            f"engine.backend={args.engine}",
            f"engine.dtype={'bfloat16' if cuda else 'float32'}",
            f"engine.options={options}",
            f"env.id={env_id}",
            "env.eval_tasks=0",
            "rollout.max_tokens=128",
            "rollout.max_response_tokens=128",
            "rollout.max_model_len=512",
            f"train.max_steps={steps}",
            "train.prompts_per_step=8",
            "train.group_size=8",
            f"train.micro_batch_size={64 if cuda else 8}",
            f"train.output_dir={out}",
            "train.progress=false",
            "train.tensorboard=false",
            f"optim.lr={args.lr}",
        ],
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    print(f"== env {env_id}, engine {args.engine} options {options}, {steps} steps", flush=True)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    print(f"set-up {time.perf_counter() - t0:.1f} s on {trainer.learner.device}", flush=True)
    try:
        trainer.train()
    finally:
        trainer.close()
    text = (out / "metrics.jsonl").read_text()
    if args.save:
        Path(args.save).mkdir(parents=True, exist_ok=True)
        tag = "".join(c for c in options if c.isalnum() or c in "_-") or "default"
        (Path(args.save) / f"metrics_{tag}.jsonl").write_text(text)
    rows = [row for row in map(json.loads, text.splitlines()) if "timing/step_s" in row]
    for row in rows:
        print(row["step"], {k.split("/")[-1]: round(row[k], 3) for k in KEYS if k in row})
    later = rows[1:] or rows
    for key in KEYS:
        values = [r[key] for r in later if key in r]
        if values:
            print(f"median over steps 2..{len(rows)}: {key} = {statistics.median(values):.3f}")
    if cuda:
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
