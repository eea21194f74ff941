"""The local trainer's step on CUDA with gradient checkpointing on and off, same config otherwise.

The vs-TRL / distributed_gpu.py shape: SmolLM2-135M-Instruct on Math-v0, 8 prompts x 8 samples,
<= 128 new tokens, the ``hf`` engine in bf16, fp32 master weights with bf16 autocast, GRPO
(clip-higher, TIS 2.0), micro-batches of ``--micro`` rows. Step 0 is a warm-up; steps 1..N are timed.
Prints the median s/step, rollout, update and weight-sync seconds per setting and the ratio of the
update times (off / on: the target is <= 1).

On CUDA checkpointing also turns off ``train.share_prompt_prefix`` (the padded layout's shared prompt
needs the KV cache checkpointing drops), so by default the two settings differ in that too;
``--share-prefix off`` turns it off in both, so that checkpointing is the only difference.

    python benchmarks/update_checkpointing_gpu.py --steps 5 --micro 16
    python benchmarks/update_checkpointing_gpu.py --steps 10 --micro 64 --share-prefix off
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributed_gpu import shape_overrides  # the same shape

TIMES = ("step_s", "rollout_s", "update_s", "sync_s")


def overrides(out: Path, steps: int, checkpointing: bool, micro: int, share_prefix: str = "default") -> list[str]:
    """The run's config overrides; ``share_prefix`` ``"off"`` adds ``train.share_prompt_prefix=false``."""
    extra = ["train.share_prompt_prefix=false"] if share_prefix == "off" else []
    return [
        *shape_overrides(out, steps),
        f"train.micro_batch_size={micro}",
        f"model.gradient_checkpointing={str(checkpointing).lower()}",
        *extra,
    ]


def run(out: Path, steps: int, checkpointing: bool, micro: int, share_prefix: str = "default") -> dict[str, float]:
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.train import Trainer

    cfg = load_config(None, overrides(out, steps, checkpointing, micro, share_prefix))
    trainer = Trainer(cfg)
    rows = []
    try:
        for step in range(steps + 1):
            metrics = trainer.step(step)
            if step:
                rows.append({k: metrics.get(f"timing/{k}", float("nan")) for k in TIMES})
    finally:
        trainer.close()
    return {k: statistics.median(r[k] for r in rows) for k in TIMES}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="update_checkpointing_gpu.py", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps a setting, after one warm-up step")
    parser.add_argument("--micro", type=int, default=16, help="train.micro_batch_size")
    parser.add_argument(
        "--share-prefix", choices=("default", "off"), default="default",
        help="off: train.share_prompt_prefix=false in both runs; default: the config's (true), which "
        "checkpointing overrides on CUDA, so the runs differ in it too",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the medians here")
    args = parser.parse_args(argv)
    for flag, value in (("--steps", args.steps), ("--micro", args.micro)):
        if value < 1:  # else a config error (micro) or no median (steps), after the model loaded
            parser.error(f"{flag} must be >= 1, got {value}")
    import torch

    if not torch.cuda.is_available():
        sys.exit("update_checkpointing_gpu.py: needs CUDA (torch.cuda.is_available() is False)")
    results = {}
    for checkpointing in (False, True):
        with tempfile.TemporaryDirectory() as out:
            results["on" if checkpointing else "off"] = r = run(
                Path(out), args.steps, checkpointing, args.micro, args.share_prefix
            )
        print(
            f"checkpointing {'on ' if checkpointing else 'off'}: "
            + "  ".join(f"{k} {v:.3f}" for k, v in r.items()),
            flush=True,
        )
    print(f"update off / on: {results['off']['update_s'] / results['on']['update_s']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
