"""Seconds per GRPO step (generation + update + weight sync) and tokens/s of chatgym's trainer.

8 prompts x 8 samples, <= 128 new tokens each (TRL's GRPOTrainer measured 4.3 s/step on an H200 for
that shape with SmolLM2, see ANCHORS.md). The env is the tests' ``ChatgymTestLetters-v0`` (reward =
share of letters in the reply; no dataset needed) and the model is SmolLM2-135M's architecture with
random weights (``--random-init``, the default: the real weights cannot always be brought to the GPU
machine) or its real weights. On CUDA: fp32 master weights, bf16 autocast, gradient checkpointing,
the transformers engine in bf16 on the same GPU.

    python benchmarks/train_step.py --steps 6            # CUDA if available, else CPU
    python benchmarks/train_step.py --steps 3 --real-weights --engine vllm

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
    "timing/step_s",
    "timing/rollout_s",
    "timing/update_s",
    "timing/sync_s",
    "throughput/gen_tokens_per_s",
    "throughput/train_tokens_per_s",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--real-weights", action="store_true", help="SmolLM2's weights instead of random init"
    )
    parser.add_argument("--engine", default="hf", help="engine backend (hf, vllm)")
    args = parser.parse_args()

    import torch
    import train_helpers

    from chatgym.trainer.config import load_config
    from chatgym.trainer.train import Trainer

    train_helpers.register()
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
            f"env.id={train_helpers.LETTERS_ENV_ID}",
            "env.eval_tasks=0",
            "rollout.max_tokens=128",
            "rollout.max_response_tokens=128",
            "rollout.max_model_len=512",
            f"train.max_steps={args.steps}",
            "train.prompts_per_step=8",
            "train.group_size=8",
            f"train.micro_batch_size={64 if cuda else 8}",
            f"train.output_dir={out}",
            "train.progress=false",
            "train.tensorboard=false",
            "optim.lr=1e-6",
        ],
    )
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    print(f"set-up {time.perf_counter() - t0:.1f} s on {trainer.device}", flush=True)
    try:
        trainer.train()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        print(row["step"], {k.split("/")[-1]: round(row[k], 3) for k in KEYS if k in row})
    later = rows[1:] or rows
    for key in KEYS:
        print(f"median over steps 2..{len(rows)}: {key} = {statistics.median(r[key] for r in later):.3f}")
    if cuda:
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
