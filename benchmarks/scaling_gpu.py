"""The distributed trainer's scaling on one GPU machine: rollout replicas, learners, splits.

The main job's shape (SmolLM2-135M-Instruct, Math-v0, GRPO, 8 prompts x 8 samples, <= 128 new tokens;
``benchmarks/distributed_gpu.py``'s config), ``trainer.backend: ray``, the HF engine (bf16, static-cache
CUDA-graph decode). For every split of the machine's GPUs (up to ``--gpus``) between engine replicas
and learners, one Trainer runs one warm-up step and ``--steps`` timed steps:

- rollout scaling: engine replicas = 1 .. G GPUs, one learner sharing GPU 0 with replica 0 (a fixed 64
  completions per step): generation tokens/s and s/step;
- learner scaling: data-parallel FSDP2 learners = 1 .. G GPUs on the same collected batches
  (``distributed_gpu.run_learners``): training tokens/s;
- splits: everything on one GPU (colocated), 1 learner + 1 replica on their own GPUs
  (disaggregated), G replicas + 1 learner, G learners + G replicas colocated pairwise: s/step.

Each figure is printed with its ratio to one GPU, and the curves go to ``scaling.png``.

    python benchmarks/scaling_gpu.py --steps 3 --out /tmp/scaling
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distributed_gpu import run_learners, run_trainer


def splits(gpus: int) -> dict[str, tuple[int, list[str]]]:
    """name -> (GPUs it uses, trainer.ray overrides)."""
    out: dict[str, tuple[int, list[str]]] = {
        "1 GPU: learner + replica colocated": (
            1,
            [
                "trainer.ray.placement=colocated",
                "trainer.ray.learner_num_gpus=0.5",
                "trainer.ray.worker_num_gpus=0.5",
            ],
        ),
        "2 GPUs: learner | replica": (
            2,
            [
                "trainer.ray.placement=disaggregated",
                "trainer.ray.learner_num_gpus=1",
                "trainer.ray.worker_num_gpus=1",
            ],
        ),
    }
    for g in range(2, gpus + 1):
        # 0.6 + 0.6 > 1: no two replicas share a GPU; the learner (0.4) fits beside one of them.
        out[f"{g} GPUs: {g} replicas, learner beside replica 0"] = (
            g,
            [
                "trainer.ray.placement=disaggregated",
                f"trainer.ray.num_rollout_workers={g}",
                "trainer.ray.worker_num_gpus=0.6",
                "trainer.ray.learner_num_gpus=0.4",
            ],
        )
        out[f"{g} GPUs: {g} learners + {g} replicas, pairwise colocated"] = (
            g,
            [
                "trainer.ray.placement=colocated",
                f"trainer.ray.num_rollout_workers={g}",
                f"trainer.ray.num_learners={g}",
                "trainer.ray.learner_num_gpus=0.5",
                "trainer.ray.worker_num_gpus=0.5",
            ],
        )
    return out


def run_split(name: str, overrides: list[str], steps: int, out: Path, keep: bool) -> tuple[dict, list]:
    slug = "".join(c if c.isalnum() else "_" for c in name)[:60]
    return run_trainer(out / slug, steps, overrides, keep)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for key, label in (
        ("rollout", "generation tokens/s (engine replicas)"),
        ("learners", f"training tokens/s ({results.get('learner_sharding', 'data-parallel')} learners)"),
        ("learners_fsdp", "training tokens/s (FSDP2 learners)"),
    ):
        pts = sorted(results.get(key, {}).items(), key=lambda kv: int(kv[0]))
        if pts:
            xs = [int(k) for k, _ in pts]
            base = pts[0][1]
            ax.plot(xs, [v / base for _, v in pts], marker="o", label=label)
    xs = sorted({int(k) for key in ("rollout", "learners") for k in results.get(key, {})})
    ax.plot(xs, xs, ls=":", color="grey", label="linear")
    ax.set_xlabel("GPUs (H200)")
    ax.set_ylabel("throughput / 1 GPU")
    ax.set_xticks(xs)
    ax.set_title("chatgym on Ray: SmolLM2-135M GRPO, Math-v0, 8x8", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--steps", type=int, default=3, help="timed steps per configuration (after one warm-up)"
    )
    parser.add_argument("--gpus", type=int, default=None, help="most GPUs to use (default: all visible)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--splits", type=int, nargs="*", default=None, help="run only these splits (indices)")
    parser.add_argument("--max-learners", type=int, default=None, help="learner scaling up to this many")
    parser.add_argument("--sharding", default="fsdp", choices=["fsdp", "replicate"], help="learners > 1")
    parser.add_argument(
        "--trajs", type=Path, default=None, help="save (or, if it exists, load) the batches here"
    )
    args = parser.parse_args(argv)
    import torch

    gpus = min(args.gpus or torch.cuda.device_count(), torch.cuda.device_count())
    if gpus < 1:
        print("scaling_gpu: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="scaling-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"gpus": gpus, "steps": args.steps, "device": torch.cuda.get_device_name(), "splits": {}}
    trajs: list = []
    for index, (name, (used, overrides)) in enumerate(splits(gpus).items()):
        if used > gpus or (args.splits is not None and index not in args.splits):
            continue
        keep = name.startswith("2 GPUs: learner | replica")
        t0 = time.perf_counter()
        try:
            summary, got = run_split(name, overrides, args.steps, out, keep)
        except Exception as exc:  # one split failing still leaves the others' figures
            print(f"scaling_gpu: {name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            results["splits"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        summary["gpus"], summary["run_s"] = used, time.perf_counter() - t0
        results["splits"][name] = summary
        trajs = got or trajs
        print(f"scaling_gpu: {name}: {json.dumps(summary)}", flush=True)
    ok = {k: v for k, v in results["splits"].items() if "error" not in v}
    # Rollout scaling: one learner, replicas = GPUs (1 GPU: the colocated split, 2+: G replicas).
    rollout = {}
    for name, v in ok.items():
        if name.startswith("1 GPU") or "replicas, learner beside" in name:
            rollout[str(v["gpus"])] = v["gen_tokens_per_s"]
    results["rollout"] = rollout
    import pickle

    if args.trajs is not None and trajs:
        args.trajs.write_bytes(pickle.dumps(trajs))
    elif args.trajs is not None and args.trajs.exists():
        trajs = pickle.loads(args.trajs.read_bytes())
    if trajs and gpus >= 2:
        learners = {}
        for n in range(1, min(gpus, args.max_learners or gpus) + 1):
            try:
                r = run_learners(n, trajs, out, "replicate" if n == 1 else args.sharding, args.steps)
                learners[str(n)] = r["train_tokens_per_s"]
                results[f"learners{n}"] = r
            except Exception as exc:
                print(f"scaling_gpu: {n} learners: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        results["learners"] = learners
        results["learner_sharding"] = args.sharding
    (out / "results.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "scaling.png")
    print(table(results))
    print(f"\n(results: {out / 'results.json'}, curve: {out / 'scaling.png'})")
    return 0


def table(r: dict) -> str:
    lines = [f"scaling_gpu on {r['gpus']} x {r['device']}: median of {r['steps']} steps after a warm-up"]
    lines.append(f"{'split':<52}{'s/step':>8}{'rollout':>9}{'update':>8}{'sync':>7}{'gen tok/s':>11}")
    for name, v in r["splits"].items():
        if "error" in v:
            lines.append(f"{name:<52}  failed: {v['error'][:60]}")
            continue
        lines.append(
            f"{name:<52}{v['wall_s']:>8.2f}{v['rollout_s']:>9.2f}{v['update_s']:>8.2f}{v['sync_s']:>7.3f}{v['gen_tokens_per_s']:>11.0f}"
        )
    for key, what in (("rollout", "generation tokens/s"), ("learners", "training tokens/s")):
        pts = r.get(key) or {}
        if pts:
            base = pts.get("1")
            cells = ", ".join(
                f"{g} GPU{'s' if int(g) > 1 else ''}: {v:.0f}" + (f" ({v / base:.2f}x)" if base else "")
                for g, v in sorted(pts.items(), key=lambda kv: int(kv[0]))
            )
            lines.append(f"{key} scaling, {what}: {cells}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
