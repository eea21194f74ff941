"""Step 1 of a training run, summarised so that a refactor can be checked to change nothing.

Three cases, each one ``Trainer.step(0)`` with the transformers engine (seeded sampling, float32):

* ``math_grpo`` — the README's main job (``examples/configs/math_grpo.yaml``: Math-v0, GRPO,
  clip-higher, TIS, no KL) on the real SmolLM2-135M weights, scaled down to 2 prompts x 4 samples
  of at most 32 tokens;
* ``tiny_kl_ppo`` — the tiny random-init Llama of the trainer tests on the letters env, with a
  frozen reference copy (``algo.kl_coef``), two PPO epochs of two mini-batches (old logprobs);
* ``tiny_lora_kl`` — the same with LoRA adapters, the reference being the base with adapters off.

What is recorded, per case: the batch the update trains on (token ids, loss mask: exact;
advantages: rounded to 6 decimals) and the weights after the step, summarised per parameter as
``[norm of the change, <change, r>]`` where ``r`` is a fixed standard-normal vector (seeded by the
parameter's name), so that a changed gradient anywhere moves the numbers.

Regenerate (only when a change is meant to alter the numbers; say so in the commit):

    .venv/bin/python tests/step1_golden.py --write

It captures the batch where ``Trainer.step`` hands it to ``chatgym.trainer.train.update``; keep that
name stable across a refactor, so the golden can be recorded from a checkout of one commit and
compared on another.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zlib
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_helpers import LETTERS_ENV_ID, TINY_LLAMA, register, torch_threads

GOLDEN = Path(__file__).parent / "data" / "step1_golden.json"
ROOT = Path(__file__).resolve().parent.parent

# Relative tolerances of the weight summary (float32 kernels may round differently on another CPU
# kind, e.g. AVX-512 vs AVX2; on one machine the values repeat to the last bit). The projection's is
# PROJECTION_RTOL x the change's norm: AdamW's first step is ~lr x sign(g) per element, so an element
# whose tiny gradient rounds the other way moves by up to 2 lr. Measured on an AVX-512 BF16 EPYC against
# this AVX2-recorded golden: norms within 1.5e-7 relative; projections off by 1.01e-3-1.04e-3 x the
# norm in 3 of the main job's tensors, within 1e-3 x the norm in the rest.
WEIGHT_RTOL = 1e-4
PROJECTION_RTOL = 3e-3
ADVANTAGE_ATOL = 2e-6
# Recorded and compared with one torch thread, whatever the machine's cores: the number of threads
# splits float32 sums differently, so with it fixed only the CPU's own kernels differ (the tolerances
# above).
THREADS = 1



def case_config(name: str, out: Path) -> Any:
    from chatgym.trainer.config.run import load_config

    common = [
        "engine.backend=hf",
        "engine.dtype=float32",
        "model.dtype=float32",
        "model.device=cpu",
        "model.compute_dtype=float32",
        "env.eval_tasks=0",
        "train.max_steps=1",
        "train.progress=false",
        "train.tensorboard=false",
        "train.trace_fraction=0.0",
        f"train.output_dir={out}",
    ]
    if name == "math_grpo":
        return load_config(
            ROOT / "examples" / "configs" / "math_grpo.yaml",
            [
                *common,
                "engine.options={}",
                "rollout.max_tokens=32",
                "rollout.max_response_tokens=32",
                "rollout.max_model_len=256",
                "train.prompts_per_step=2",
                "train.group_size=4",
                "train.micro_batch_size=4",
                "train.save_every=0",
                # Seed 3 draws two tasks whose groups of 4 have mixed rewards (0, 0, 1, 1 and
                # 1, 0.5, 0, 0): non-zero advantages, so the weights move.
                "train.seed=3",
            ],
        )
    register()
    tiny = [
        *common,
        "model.random_init=true",
        "model.config_overrides=" + json.dumps(TINY_LLAMA),
        f"env.id={LETTERS_ENV_ID}",
        "rollout.max_tokens=8",
        "rollout.max_response_tokens=8",
        "rollout.max_model_len=128",
        "train.prompts_per_step=2",
        "train.group_size=4",
        "train.micro_batch_size=3",
        "optim.lr=1e-3",
        "algo.kl_coef=0.01",
    ]
    if name == "tiny_kl_ppo":
        return load_config(None, [*tiny, "algo.ppo_epochs=2", "algo.mini_batches=2"])
    if name == "tiny_lora_kl":
        return load_config(None, [*tiny, "lora.enabled=true", "lora.r=4", "lora.alpha=8"])
    raise KeyError(name)


CASES = ("math_grpo", "tiny_kl_ppo", "tiny_lora_kl")


def _capture_point() -> tuple[Any, str]:
    """Where the step hands the prepared batch to the update: ``chatgym.trainer.learner.learner.update``
    (called as ``update(models, batch, ...)``; it was ``chatgym.trainer.train.update`` until the
    learner became its own role)."""
    from chatgym.trainer.learner import learner as role

    return role, "update"


def _weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.learner.policy.named_parameters() if p.requires_grad}


def run_case(name: str, out: Path) -> dict[str, Any]:
    """Run step 1 of case ``name`` (outputs under ``out``) and return its summary."""
    from chatgym.trainer.train import Trainer

    module, attr = _capture_point()
    original = getattr(module, attr)
    seen: list[dict[str, Any]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        batch = kwargs.get("batch", args[1] if len(args) > 1 else None)
        seen.append(
            {
                "input_ids": batch.input_ids.clone(),
                "attention_mask": batch.attention_mask.clone(),
                "loss_mask": batch.loss_mask.clone(),
                "advantages": batch.advantages.clone(),
            }
        )
        return original(*args, **kwargs)

    setattr(module, attr, recording)
    try:
        with torch_threads(THREADS):
            trainer = Trainer(case_config(name, out))
            try:
                before = _weights(trainer)
                metrics = trainer.step(0)
                after = _weights(trainer)
            finally:
                trainer.close()
    finally:
        setattr(module, attr, original)
    if len(seen) != 1:
        raise AssertionError(f"{name}: the update ran {len(seen)} times in step 1, expected once")
    return summarize(seen[0], before, after, metrics)


def _probe(name: str, shape: torch.Size) -> torch.Tensor:
    seed = zlib.crc32(name.encode())
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def summarize(batch: dict[str, torch.Tensor], before: dict, after: dict, metrics: dict) -> dict[str, Any]:
    rows = []
    for i in range(batch["input_ids"].shape[0]):
        n = int(batch["attention_mask"][i].sum())
        mask = batch["loss_mask"][i, :n]
        rows.append(
            {
                "token_ids": batch["input_ids"][i, :n].tolist(),
                "loss_mask": mask.int().tolist(),
                # Advantages of the trained tokens only (elsewhere they are never used).
                "advantages": [round(float(a), 6) for a in batch["advantages"][i, :n][mask]],
            }
        )
    weights = {}
    for name, w0 in before.items():
        delta = (after[name] - w0).double()
        weights[name] = [float(delta.norm()), float((delta * _probe(name, delta.shape)).sum())]
    digest = hashlib.sha256(json.dumps([r["token_ids"] for r in rows]).encode()).hexdigest()[:16]
    return {
        "rows": rows,
        "token_ids_sha": digest,
        "trained_tokens": int(metrics.get("batch/trained_tokens", 0)),
        "weights": weights,
    }


def compare(name: str, got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """The differences of ``got`` from ``want`` (empty: the same within the stated tolerances)."""
    problems = []
    if len(got["rows"]) != len(want["rows"]):
        return [f"{name}: {len(got['rows'])} rows trained, golden {len(want['rows'])}"]
    for i, (g, w) in enumerate(zip(got["rows"], want["rows"], strict=True)):
        for key in ("token_ids", "loss_mask"):
            if g[key] != w[key]:
                problems.append(f"{name}: row {i} {key} differs")
        if len(g["advantages"]) != len(w["advantages"]) or any(
            abs(a - b) > ADVANTAGE_ATOL for a, b in zip(g["advantages"], w["advantages"], strict=False)
        ):
            problems.append(f"{name}: row {i} advantages differ")
    if set(got["weights"]) != set(want["weights"]):
        problems.append(f"{name}: trained parameter names differ")
    for pname, (norm_w, proj_w) in want["weights"].items():
        if pname not in got["weights"]:
            continue
        norm_g, proj_g = got["weights"][pname]
        scale = max(norm_w, 1e-12)
        if abs(norm_g - norm_w) > WEIGHT_RTOL * scale or abs(proj_g - proj_w) > PROJECTION_RTOL * scale:
            problems.append(f"{name}: {pname} change [{norm_g:.9g}, {proj_g:.9g}], golden [{norm_w:.9g}, {proj_w:.9g}]")
    return problems


def main(argv: list[str]) -> int:
    import tempfile

    if argv not in ([], ["--write"]):
        print("usage: tests/step1_golden.py [--write]", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        result = {name: run_case(name, Path(tmp) / name) for name in CASES}
    if argv == ["--write"]:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(result, indent=None, separators=(",", ":")) + "\n")
        print(f"wrote {GOLDEN}")
        return 0
    want = json.loads(GOLDEN.read_text())
    problems = [p for name in CASES for p in compare(name, result[name], want[name])]
    print("\n".join(problems) or "same as the golden")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
