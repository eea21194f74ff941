"""chatgym's trainer vs TRL's GRPOTrainer on one GPU: wall-clock s/step, generation, memory, accuracy.

Same model (SmolLM2-135M-Instruct, real weights from the packaged GGUF), task (Math-v0 train split,
the same 8 prompts per step in the same order: ``trainer.sampler.tasks_for_step``), shape (8 prompts
x 8 samples, <= 128 new tokens, temperature 1), lr 1e-5 constant, no KL, clip 0.2 / 0.28, token-mean
loss, group-normalised advantages, Math-v0's own scorer as the reward on both sides. Held-out accuracy:
the first 64 Math-v0 test tasks, greedy, scored by the same chatgym evaluator for both (TRL's weights
are copied into it), before training and every ``--eval-every`` steps; evaluation time is not counted
in the wall clock.

Runs (``--runs``, any subset, each ``NAME:SEED``):

* ``ours``        — ``chatgym.trainer.train.Trainer`` as ``chatgym train`` runs it (HF engine,
  ``decode: static`` = per-slot KV cache + CUDA graphs, fp32 master weights, bf16 autocast, gradient
  checkpointing; per step also the metrics line and the background curve redraw);
* ``ours_dynamic`` — the same with the engine's dynamic-cache decode (what stop 10 measured);
* ``trl_bf16``    — TRL with bf16 weights (its fastest configuration in ANCHORS.md);
* ``trl_fp32``    — TRL with fp32 weights, bf16 autocast and gradient checkpointing (its most accurate).

Wall clock per step is measured around the whole step (``Trainer.step`` + logging; TRL: callback from
``on_step_begin`` to ``on_step_end``), with ``torch.cuda.synchronize()``. Each run writes
``<out>/<name>_<seed>.json``; ``--report DIR`` prints the table of all JSONs in DIR and draws
``accuracy_vs_wallclock.png`` (runs no model).

    python benchmarks/vs_trl_gpu.py --runs ours:0 ours:1 trl_bf16:0 --out /tmp/vs_trl
    python benchmarks/vs_trl_gpu.py --report /tmp/vs_trl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPTS, GROUP, NEW_TOKENS, LR = 8, 8, 128, 1e-5
DEVICE = "cuda"  # a CPU smoke run of the script sets "cpu"
EVAL_TASKS = 64


def our_config(seed: int, steps: int, out: Path, decode: str):
    from chatgym.trainer.config import load_config

    return load_config(
        None,
        [
            "model.path=smollm2",
            f"model.gradient_checkpointing={str(DEVICE == 'cuda').lower()}",
            "engine.backend=hf",
            f"engine.dtype={'bfloat16' if DEVICE == 'cuda' else 'float32'}",
            f"engine.options={{decode: {decode}}}",
            "env.id=Math-v0",
            f"env.eval_tasks={EVAL_TASKS}",
            f"rollout.max_tokens={NEW_TOKENS}",
            f"rollout.max_response_tokens={NEW_TOKENS}",
            "rollout.max_model_len=512",
            f"train.max_steps={steps}",
            f"train.prompts_per_step={PROMPTS}",
            f"train.group_size={GROUP}",
            "train.micro_batch_size=64",
            f"train.seed={seed}",
            f"train.output_dir={out}",
            "train.progress=false",
            "train.tensorboard=false",
            "algo.policy_loss=clip_higher",
            "algo.policy_loss_kwargs={eps_low: 0.2, eps_high: 0.28}",
            f"optim.lr={LR}",
        ],
    )


def run_ours(seed: int, steps: int, eval_every: int, decode: str) -> dict:
    import torch

    from chatgym.trainer.train import Trainer

    out = Path(tempfile.mkdtemp(prefix="vs-trl-ours-"))
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = Trainer(our_config(seed, steps, out, decode))
    setup_s = time.perf_counter() - t0
    try:
        curve = [(0.0, trainer.evaluate()["eval/accuracy"])]
        wall, rows = 0.0, []
        for step in range(steps):
            t = time.perf_counter()
            metrics = trainer.step(step)
            trainer.metrics.log(step + 1, metrics)
            trainer.metrics.plot_later()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            wall += dt
            rows.append(
                {
                    "wall_s": dt,
                    "gen_s": metrics["timing/rollout_s"],
                    "update_s": metrics["timing/update_s"],
                    "gen_tokens": metrics["throughput/gen_tokens_per_s"] * metrics["timing/rollout_s"],
                    "reward": metrics["reward/mean"],
                }
            )
            print(f"ours {decode} seed {seed} step {step + 1}: {rows[-1]}", flush=True)
            if (step + 1) % eval_every == 0 or step + 1 == steps:
                curve.append((wall, trainer.evaluate()["eval/accuracy"]))
        trainer.metrics.wait_plotted()
    finally:
        trainer.close()
    return {"setup_s": setup_s, "steps": rows, "curve": curve, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def run_trl(seed: int, steps: int, eval_every: int, fp32: bool, evaluator) -> dict:
    import gymnasium as gym
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.trainer.models import load_model
    from chatgym.trainer.rollout.tokenizer import get_tokenizer
    from chatgym.trainer.sampler import tasks_for_step

    _fingerprint_fallback()
    env = gym.make("Math-v0", split="train")
    num_tasks = len(env.unwrapped.tasks)
    rows = []
    for step in range(steps):
        for task in tasks_for_step(step, PROMPTS, num_tasks, seed):
            obs, _ = env.reset(options={"task_index": task})
            rows.append({"prompt": [{"role": m["role"], "content": m["content"]} for m in obs], "task": task})

    def math_reward(prompts, completions, task, **_):
        scores = []
        for completion, index in zip(completions, task, strict=True):
            env.reset(options={"task_index": index})
            scores.append(float(env.step(completion[0]["content"])[1]))
        return scores

    torch.cuda.reset_peak_memory_stats()
    tokenizer = get_tokenizer("smollm2")
    model = load_model("smollm2", dtype="float32" if fp32 else "bfloat16", device=DEVICE)
    gen: list[tuple[float, int]] = []
    plain_generate = model.generate

    def timed_generate(*args, **kwargs):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = plain_generate(*args, **kwargs)
        torch.cuda.synchronize()
        prompt_len = (kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).shape[1]
        new = out[:, prompt_len:]
        gen.append((time.perf_counter() - t, int((new != tokenizer.pad_token_id).sum())))
        return out

    model.generate = timed_generate
    curve = [(0.0, evaluator(model))]
    wall = [0.0]
    steps_out: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            self.t = time.perf_counter()
            self.gen_before = len(gen)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            torch.cuda.synchronize()
            dt = time.perf_counter() - self.t
            wall[0] += dt
            g = gen[self.gen_before :]
            steps_out.append(
                {"wall_s": dt, "gen_s": sum(x for x, _ in g), "gen_tokens": sum(n for _, n in g)}
            )
            steps_out[-1]["update_s"] = dt - steps_out[-1]["gen_s"]
            print(f"trl {'fp32' if fp32 else 'bf16'} seed {seed} step {state.global_step}: {steps_out[-1]}", flush=True)
            if state.global_step % eval_every == 0 or state.global_step == steps:
                curve.append((wall[0], evaluator(model)))

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="vs-trl-trl-"),
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",  # token-mean over the batch, as ours
        scale_rewards="group",
        shuffle_dataset=False,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=seed,
        bf16=DEVICE == "cuda",
        use_cpu=DEVICE == "cpu",
        gradient_checkpointing=fp32,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[math_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Timer()],
    )
    trainer.train()
    return {"steps": steps_out, "curve": curve, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def _fingerprint_fallback() -> None:
    """datasets hashes every new Dataset with dill; with some pyarrow/dill pairs that pickling fails
    (``Can't pickle <class 'MonthDayNano'>``, seen on the CPU box). A fingerprint only names cache
    files, so fall back to a random one, as datasets itself does for unhashable transforms."""
    import uuid

    import datasets.arrow_dataset as arrow_dataset

    plain = arrow_dataset.generate_fingerprint

    def fingerprint(dataset):
        try:
            return plain(dataset)
        except Exception:
            return uuid.uuid4().hex

    arrow_dataset.generate_fingerprint = fingerprint


def make_evaluator():
    """Held-out accuracy of any SmolLM2-shaped model through one chatgym Trainer's evaluator."""
    from chatgym.trainer.train import Trainer

    trainer = Trainer(our_config(0, 1, Path(tempfile.mkdtemp(prefix="vs-trl-eval-")), "static"))

    def evaluate(model) -> float:
        trainer.engine.update_weights(model.state_dict())
        return trainer.evaluate()["eval/accuracy"]

    return evaluate


def summarize(name: str, result: dict) -> dict:
    later = result["steps"][1:] or result["steps"]
    med = {k: statistics.median(r[k] for r in later) for k in ("wall_s", "gen_s", "update_s")}
    tps = statistics.median(r["gen_tokens"] / r["gen_s"] for r in later if r["gen_s"] > 0)
    curve = result["curve"]
    return {
        "run": name,
        "s_per_step": med["wall_s"],
        "gen_s": med["gen_s"],
        "update_s": med["update_s"],
        "gen_tok_s": tps,
        "peak_gib": result["peak_gib"],
        "acc_before": curve[0][1],
        "acc_after": curve[-1][1],
        "wall_total_s": curve[-1][0],
        "curve": curve,
    }


def accuracy_at(curve: list, wall: float) -> float:
    return [acc for t, acc in curve if t <= wall + 1e-9][-1]


def report(folder: Path) -> None:
    rows = [summarize(p.stem, json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]
    if not rows:
        raise SystemExit(f"no results in {folder}")
    equal = min(r["wall_total_s"] for r in rows)
    print(f"{'run':16s} {'s/step':>7s} {'gen s':>6s} {'upd s':>6s} {'gen tok/s':>9s} {'peak GiB':>8s} "
          f"{'acc before':>10s} {'acc after':>9s} {'acc @' + format(equal, '.0f') + ' s':>10s}")
    for r in rows:
        print(f"{r['run']:16s} {r['s_per_step']:7.3f} {r['gen_s']:6.3f} {r['update_s']:6.3f} "
              f"{r['gen_tok_s']:9,.0f} {r['peak_gib']:8.2f} {r['acc_before']:10.4f} {r['acc_after']:9.4f} "
              f"{accuracy_at(r['curve'], equal):10.4f}")
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["run"].rsplit("_", 1)[0], []).append(r)
    print("\nmeans over seeds:")
    for name, rs in groups.items():
        def mean(key: str, rs: list[dict] = rs) -> float:
            return statistics.mean(r[key] for r in rs)

        print(f"{name:16s} seeds {len(rs)}  s/step {mean('s_per_step'):.3f}  gen tok/s {mean('gen_tok_s'):,.0f}  "
              f"acc {mean('acc_before'):.4f} -> {mean('acc_after'):.4f}  "
              f"acc @ {equal:.0f} s {statistics.mean(accuracy_at(r['curve'], equal) for r in rs):.4f}")
    if "ours" in groups:
        for name, rs in groups.items():
            if name.startswith("trl"):
                ours = statistics.mean(r["s_per_step"] for r in groups["ours"])
                theirs = statistics.mean(r["s_per_step"] for r in rs)
                g_ours = statistics.mean(r["gen_tok_s"] for r in groups["ours"])
                g_theirs = statistics.mean(r["gen_tok_s"] for r in rs)
                print(f"ours vs {name}: {theirs / ours:.2f}x faster per step, {g_ours / g_theirs:.2f}x generation tok/s")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        xs, ys = zip(*r["curve"], strict=True)
        ax.plot(xs, ys, marker="o", label=r["run"])
    ax.set_xlabel("wall-clock training time (s, evaluation excluded)")
    ax.set_ylabel("held-out accuracy (64 Math-v0 test tasks, greedy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "accuracy_vs_wallclock.png", dpi=100)
    print(f"plot: {folder / 'accuracy_vs_wallclock.png'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="*", default=["ours:0", "ours:1", "trl_bf16:0", "trl_bf16:1"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--out", default="vs_trl_results")
    ap.add_argument("--report", default=None, help="print the table of the JSONs in this folder and exit")
    args = ap.parse_args()
    if args.report:
        report(Path(args.report))
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("vs_trl_gpu.py needs CUDA")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    evaluator = None
    for spec in args.runs:
        name, seed = spec.split(":")
        if name.startswith("trl") and evaluator is None:
            evaluator = make_evaluator()
        if name == "ours":
            result = run_ours(int(seed), args.steps, args.eval_every, "static")
        elif name == "ours_dynamic":
            result = run_ours(int(seed), args.steps, args.eval_every, "dynamic")
        elif name in ("trl_bf16", "trl_fp32"):
            result = run_trl(int(seed), args.steps, args.eval_every, name == "trl_fp32", evaluator)
        else:
            sys.exit(f"unknown run {name!r}")
        (out / f"{name}_{seed}.json").write_text(json.dumps(result))
        print(json.dumps({k: v for k, v in summarize(f"{name}_{seed}", result).items() if k != "curve"}), flush=True)
    report(out)


if __name__ == "__main__":
    main()
