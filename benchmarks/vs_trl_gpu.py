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
* ``ours_async``  — ``ours`` with ``engine.options.async_scheduling`` (decode step ``k + 1`` queued before step
  ``k``'s ids are read back);
* ``ours_dynamic`` — the same with the engine's dynamic-cache decode (``decode: dynamic``);
* ``ours_packed`` — ``ours`` with the update packed (``model.pack: true``; ``--pack`` sets it for ``ours``);
* ``ours_fp8``    — ``ours`` sampling from FP8 weights (``engine.options.quantization: fp8``: the fused
  static step on e4m3 weights, re-quantized at every sync; the learner stays fp32/bf16), with the
  rollout correction ``--correction`` (default ``token_tis``; ``--mask-band`` for the mask modes) —
  applied to every ``ours*`` run alike, so ``ours`` and ``ours_fp8`` differ in the engine's weights only;
* ``trl_bf16``    — TRL with bf16 weights (its fastest configuration in the peers' figures);
* ``trl_fp32``    — TRL with fp32 weights, bf16 autocast and gradient checkpointing (its most accurate);
* ``trl_vllm_bf16`` / ``trl_vllm_fp32`` — the same two with TRL's colocated vLLM generating
  (``use_vllm=True, vllm_mode="colocate"``, 0.3 of the GPU): the configuration a GPU user runs.

Wall clock per step is measured around the whole step (``Trainer.step`` + logging; TRL: callback from
``on_step_begin`` to ``on_step_end``), with ``torch.cuda.synchronize()``. Each run writes
``<out>/<name>_<seed>.json``; ``--report DIR`` prints the table of all JSONs in DIR and draws
``accuracy_vs_wallclock.png`` (runs no model).

Slow updates (some steps took 0.6-2.7 s against a usual 0.3 s): every step of ours also records under
``steps[i]["probe"]`` what the update was given and what happened around it: tokens in the batch,
the padded batch shape, each micro-batch forward (its shape; packed: the pack lengths), the CUDA
allocator's ``num_device_alloc`` / ``num_device_free`` / ``num_alloc_retries`` deltas over the update
and over the step, Python garbage collections (generation, seconds, whether inside the update), and
whether the background curve redraw was running when the update started / ended; ``--report``
prints the slowest updates with those fields. Toggles to test the suspects: ``--no-gc-freeze``
(ours' steps run as ``chatgym train`` runs them, with set-up's objects frozen out of the
collector, ``train.gc_freeze``; this turns that off),
``--expandable-segments`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: new shapes grow a
segment instead of allocating new blocks), ``--no-plot`` (no curve redraw during the run),
``--learner-cudnn`` (the learner's update with SDPA's cuDNN backend allowed; the engine keeps it
off). Measured on the CPU box (Python 3.11, a tiny trainer after one step,
444k objects tracked by the collector): a full (generation 2) collection takes 0.40 s, and ~0 s
after ``gc.freeze()``. The slow updates' cause was elsewhere: the probe's per-phase CUDA events
(``phases``: forward, loss + backward, optimizer; host and GPU seconds) showed the GPU itself taking
7-8x longer in the forward and the backward of those steps, which were the steps whose padded length
was new — cuDNN attention's per-shape plans (``chatgym.trainer.models.cuda.without_cudnn_attention``).

    python benchmarks/vs_trl_gpu.py --runs ours:0 ours:1 trl_bf16:0 --out /tmp/vs_trl
    python benchmarks/vs_trl_gpu.py --runs ours:0 ours_packed:0 --no-gc-freeze --out /tmp/vs_trl_packed
    python benchmarks/vs_trl_gpu.py --report /tmp/vs_trl
    python benchmarks/vs_trl_gpu.py --runs ours:0 ours:1 ours_fp8:0 ours_fp8:1 --out /tmp/vs_trl_fp8

Every ``ours*`` step also records the train/inference mismatch (``rollout/mismatch/*``: mean and max
|engine − learner| logprob, k3 KL(engine ‖ learner), the correction's clip fraction) and
``timing/sync_s``; the report prints their means per run, and the spread of held-out accuracy over the
seeds of each configuration (with two seeds: the noise a difference between configurations is judged
against).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPTS, GROUP, NEW_TOKENS, LR = 8, 8, 128, 1e-5
DEVICE = "cuda"  # a CPU smoke run of the script sets "cpu"
EVAL_TASKS = 64
# ours' update settings (--pack, --pack-max-tokens, --checkpointing); the runs named ours_packed set pack.
UPDATE = {"pack": "auto", "pack_max_tokens": None, "checkpointing": None}
# ours' rollout correction (--correction, --mask-band), the same for every ours* run.
CORRECTION = {"rollout_correction": "token_tis", "rollout_mask_band": (0.5, 2.0)}


def our_config(
    seed: int, steps: int, out: Path, decode: str, pack: str | None = None, quantization: str | None = None
):
    from chatgym.trainer.config.run import load_config

    checkpointing = UPDATE["checkpointing"] if UPDATE["checkpointing"] is not None else DEVICE == "cuda"
    extra = [f"model.pack={pack or UPDATE['pack']}", f"algo.rollout_correction={CORRECTION['rollout_correction']}",
             "algo.rollout_mask_band=[{},{}]".format(*CORRECTION["rollout_mask_band"])]
    engine_extra = [f"engine.options.quantization={quantization}"] if quantization else []
    if UPDATE["pack_max_tokens"]:
        extra.append(f"model.pack_max_tokens={UPDATE['pack_max_tokens']}")
    return load_config(
        None,
        [
            "model.path=smollm2",
            f"model.gradient_checkpointing={str(checkpointing).lower()}",
            *extra,
            "engine.backend=hf",
            f"engine.dtype={'bfloat16' if DEVICE == 'cuda' else 'float32'}",
            # "async": the static decode with async_scheduling (the next step queued before the read-back).
            "engine.options={decode: static, async_scheduling: true}"
            if decode == "async"
            else f"engine.options={{decode: {decode}}}",
            *engine_extra,  # after engine.options=..., which replaces the whole mapping
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


ALLOC_KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


def _alloc_stats() -> dict[str, int]:
    import torch

    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ALLOC_KEYS} | {
        "reserved_bytes": int(stats.get("reserved_bytes.all.current", 0))
    }


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


class UpdateProbe:
    """Records, per training step of ours, what the update was given and what ran around it (see the
    module docstring): wraps the ``update`` the Learner calls and the per-micro-batch forward it runs,
    and listens to Python's garbage collector (``gc.callbacks``). Instrumentation of this benchmark
    only; the wrappers call the originals unchanged."""

    def __init__(self, trainer: Any):
        import chatgym.trainer.learner.learner as role
        import chatgym.trainer.learner.update as update_module
        from chatgym.trainer.learner.batch import pack_chunks

        self.trainer = trainer
        self.record: dict[str, Any] = {}
        self.in_update = False
        self._gc_t = 0.0
        self._patched = [
            (role, "update", role.update),
            (update_module, "policy_logprobs", update_module.policy_logprobs),
            (update_module, "_step", update_module._step),
        ]
        plain_update, plain_forward, plain_step = role.update, update_module.policy_logprobs, update_module._step
        self._marks: list[tuple[str, float, Any]] = []  # (label, host time, CUDA event) inside the update

        def mark(label: str) -> None:
            import torch

            event = None
            if torch.cuda.is_available():
                event = torch.cuda.Event(enable_timing=True)
                event.record()
            self._marks.append((label, time.perf_counter(), event))

        def update(state, batch, algo, plan, **kw):
            import torch

            rec = self.record
            rec["tokens"] = int(batch.attention_mask.sum())
            rec["trained_tokens"] = int(batch.loss_mask.sum())
            rec["batch_shape"] = list(batch.input_ids.shape)
            rec["pack"], rec["share_prefix"] = plan.pack, plan.share_prefix
            rec["forwards"] = []
            rec["plot_running_at_update_start"] = self.plot_running()
            before = _alloc_stats()
            self.in_update = True
            self._marks = []
            t = time.perf_counter()
            mark("start")
            try:
                return plain_update(state, batch, algo, plan, **kw)
            finally:
                mark("end")
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.in_update = False
                rec["update_synced_s"] = time.perf_counter() - t
                rec["phases"] = self.phases()
                rec["update_alloc"] = _delta(_alloc_stats(), before)
                rec["plot_running_at_update_end"] = self.plot_running()

        def policy_logprobs(model, mb, prefix_len, **kw):
            entry: dict[str, Any] = {"shape": list(mb.input_ids.shape), "prefix_len": prefix_len}
            if kw.get("pack"):  # the packed forward reads the lengths on the host anyway
                lengths = mb.lengths.tolist()
                entry["packs"] = [
                    prefix_len + sum(lengths[i] - prefix_len for i in run)
                    for run in pack_chunks(lengths, prefix_len, kw.get("pack_max_tokens", 512))
                ]
            self.record.setdefault("forwards", []).append(entry)
            mark("forward")
            try:
                return plain_forward(model, mb, prefix_len, **kw)
            finally:
                mark("loss+backward")

        def step(*args, **kw):
            mark("optimizer")
            try:
                return plain_step(*args, **kw)
            finally:
                mark("after optimizer")

        role.update = update
        update_module.policy_logprobs = policy_logprobs
        update_module._step = step
        gc.callbacks.append(self._on_gc)

    def phases(self) -> list[dict[str, Any]]:
        """The update cut at the marks (synchronised first): per phase its host seconds (the time the
        Python thread spent issuing it) and GPU seconds (between its CUDA events). A phase whose host
        time far exceeds its GPU time was held up on the host (GIL, CPU), not by the device."""
        out = []
        for (label, t0, e0), (_, t1, e1) in zip(self._marks, self._marks[1:], strict=False):
            gpu = e0.elapsed_time(e1) / 1e3 if e0 is not None else None
            out.append({"phase": label, "host_s": round(t1 - t0, 5), "gpu_s": None if gpu is None else round(gpu, 5)})
        return out

    def plot_running(self) -> bool:
        drawer = getattr(self.trainer.metrics, "_drawer", None)
        return bool(drawer is not None and drawer.is_alive())

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t = time.perf_counter()
            return
        seconds = time.perf_counter() - self._gc_t
        if info["generation"] == 0 and seconds < 1e-3:  # hundreds per step: counted, not listed
            self.record["gc0_quick"] = self.record.get("gc0_quick", 0) + 1
            self.record["gc0_quick_s"] = self.record.get("gc0_quick_s", 0.0) + seconds
            return
        self.record.setdefault("gc", []).append(
            {
                "generation": info["generation"],
                "collected": info["collected"],
                "s": round(seconds, 5),
                "in_update": self.in_update,
            }
        )

    def start_step(self) -> None:
        self.record = {"gc": [], "plot_running_at_step_start": self.plot_running()}
        self._step_alloc = _alloc_stats()

    def end_step(self) -> dict[str, Any]:
        self.record["step_alloc"] = _delta(_alloc_stats(), self._step_alloc)
        self.record["gc_s"] = sum(e["s"] for e in self.record["gc"]) + self.record.get("gc0_quick_s", 0.0)
        return self.record

    def close(self) -> None:
        for module, name, original in self._patched:
            setattr(module, name, original)
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)


def run_ours(
    seed: int,
    steps: int,
    eval_every: int,
    decode: str,
    pack: str | None = None,
    options: dict | None = None,
    quantization: str | None = None,
) -> dict:
    import torch

    from chatgym.trainer.train import Trainer, frozen_gc

    options = options or {}
    cuda = torch.cuda.is_available()
    out = Path(tempfile.mkdtemp(prefix="vs-trl-ours-"))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = Trainer(our_config(seed, steps, out, decode, pack, quantization))
    if options.get("learner_cudnn"):  # cuDNN attention allowed in the update (its per-shape plans)
        import contextlib

        import chatgym.trainer.learner.learner as role

        role.without_cudnn_attention = lambda device: contextlib.nullcontext()
    setup_s = time.perf_counter() - t0
    probe = UpdateProbe(trainer)
    try:
        curve = [(0.0, trainer.evaluate()["eval/accuracy"])]
        with frozen_gc(not options.get("no_gc_freeze")):  # as Trainer.train runs its steps
            wall, rows = 0.0, []
            for step in range(steps):
                probe.start_step()
                t = time.perf_counter()
                metrics = trainer.step(step)
                t_log = time.perf_counter()
                trainer.metrics.log(step + 1, metrics)
                if not options.get("no_plot"):
                    trainer.metrics.plot_later()
                log_s = time.perf_counter() - t_log
                if cuda:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t
                wall += dt
                record = probe.end_step()
                record["log_s"] = log_s
                record["sync_s"] = metrics.get("timing/sync_s", 0.0)
                rows.append(
                    {
                        "wall_s": dt,
                        "gen_s": metrics["timing/rollout_s"],
                        "update_s": metrics["timing/update_s"],
                        "gen_tokens": metrics["throughput/gen_tokens_per_s"] * metrics["timing/rollout_s"],
                        "reward": metrics["reward/mean"],
                        "mismatch": {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("rollout/mismatch/")},
                        "sync_s": metrics.get("timing/sync_s", 0.0),
                        "probe": record,
                    }
                )
                brief = {k: v for k, v in rows[-1].items() if k != "probe"}
                forwards = record.get("forwards", [])
                print(
                    f"ours {decode} seed {seed} step {step + 1}: {brief} | tokens {record.get('tokens')} "
                    f"shape {record.get('batch_shape')} forwards {len(forwards)} alloc {record.get('update_alloc')} "
                    f"gc {record['gc_s']:.3f} s plot {record.get('plot_running_at_update_start')}",
                    flush=True,
                )
                if (step + 1) % eval_every == 0 or step + 1 == steps:
                    curve.append((wall, trainer.evaluate()["eval/accuracy"]))
        trainer.metrics.wait_plotted()
    finally:
        probe.close()
        trainer.close()
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    return {"setup_s": setup_s, "steps": rows, "curve": curve, "peak_gib": peak, "options": options}


def run_trl(seed: int, steps: int, eval_every: int, fp32: bool, evaluator, vllm: bool = False) -> dict:
    """One TRL GRPOTrainer run; ``vllm``: generation by TRL's colocated vLLM (``use_vllm=True,
    vllm_mode="colocate"``, ``vllm_gpu_memory_utilization=0.3``, TRL's defaults otherwise, including its
    importance-sampling correction), timed around ``vllm_generation.generate``."""
    import gymnasium as gym
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.models.packaged import load_model
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

    def timed(generate, count):
        """``generate`` timed into ``gen``: (seconds, ``count(out, args, kwargs)`` new tokens)."""

        def call(*args, **kwargs):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = generate(*args, **kwargs)
            torch.cuda.synchronize()
            gen.append((time.perf_counter() - t, count(out, args, kwargs)))
            return out

        return call

    def new_tokens(out, args, kwargs):  # model.generate: the ids after the (padded) prompt
        prompt_len = (kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).shape[1]
        return int((out[:, prompt_len:] != tokenizer.pad_token_id).sum())

    model.generate = timed(model.generate, new_tokens)
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
            print(
                f"trl {'vllm ' if vllm else ''}{'fp32' if fp32 else 'bf16'} seed {seed} step {state.global_step}: {steps_out[-1]}",
                flush=True,
            )
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
        **({"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3} if vllm else {}),
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[math_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Timer()],
    )
    if vllm:  # generation goes through TRL's vLLM wrapper (its completion ids second), not model.generate
        vg = trainer.vllm_generation
        vg.generate = timed(vg.generate, lambda out, *_: sum(len(ids) for ids in out[1]))
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
    mismatch = {
        key: statistics.mean(r["mismatch"][key] for r in result["steps"] if key in r.get("mismatch", {}))
        for key in ("mean_abs", "max_abs", "k3_kl", "clip_frac")
        if any(key in r.get("mismatch", {}) for r in result["steps"])
    }
    return {
        "run": name,
        "mismatch": mismatch,
        "sync_s": statistics.median(r.get("sync_s", 0.0) for r in later),
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


def slow_updates(folder: Path, top: int = 3) -> None:
    """Print each run's slowest updates next to its median, with what the probe saw (ours only)."""
    for path in sorted(folder.glob("*.json")):
        steps = json.loads(path.read_text())["steps"]
        if not steps or "probe" not in steps[0]:
            continue
        median = statistics.median(r["update_s"] for r in steps)
        print(f"\n{path.stem}: median update {median:.3f} s; slowest:")
        order = sorted(range(len(steps)), key=lambda i: -steps[i]["update_s"])[:top]
        for i in order:
            p = steps[i]["probe"]
            gc_in = [e for e in p.get("gc", []) if e["in_update"]]
            print(
                f"  step {i + 1}: update {steps[i]['update_s']:.3f} s (synced {p.get('update_synced_s', 0):.3f}), "
                f"tokens {p.get('tokens')}, shape {p.get('batch_shape')}, forwards {len(p.get('forwards', []))}, "
                f"alloc {p.get('update_alloc')}, gc in update {sum(e['s'] for e in gc_in):.3f} s "
                f"(gens {[e['generation'] for e in gc_in]}), plot running {p.get('plot_running_at_update_start')}"
                f"/{p.get('plot_running_at_update_end')}"
            )
            phases = ", ".join(
                f"{e['phase']} host {e['host_s']:.3f} gpu {e['gpu_s'] if e['gpu_s'] is None else format(e['gpu_s'], '.3f')}"
                for e in p.get("phases", [])
            )
            if phases:
                print(f"    phases (s): {phases}")


def mismatch_table(rows: list[dict], groups: dict[str, list[dict]], equal: float) -> None:
    """Per run: the mean rollout/mismatch/* over its steps and its median sync time; per configuration:
    the held-out accuracy's spread over its seeds (the noise a difference between them is judged by)."""
    if not any(r["mismatch"] for r in rows):
        return
    print(f"\n{'run':16s} {'mean |d|':>9s} {'max |d|':>8s} {'k3 KL':>9s} {'clip frac':>9s} {'sync s':>7s}")
    for r in rows:
        m = r["mismatch"]
        print(
            f"{r['run']:16s} {m.get('mean_abs', float('nan')):9.5f} {m.get('max_abs', float('nan')):8.4f} "
            f"{m.get('k3_kl', float('nan')):9.6f} {m.get('clip_frac', float('nan')):9.5f} {r['sync_s']:7.3f}"
        )
    print(f"\nheld-out accuracy over seeds (after training; @ {equal:.0f} s of training):")
    for name, rs in groups.items():
        after = [r["acc_after"] for r in rs]
        at = [accuracy_at(r["curve"], equal) for r in rs]
        print(f"{name:16s} after {min(after):.4f} .. {max(after):.4f}   @ equal wall clock {min(at):.4f} .. {max(at):.4f}")


def report(folder: Path) -> None:
    rows = [summarize(p.stem, json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]
    if not rows:
        raise SystemExit(f"no results in {folder}")
    equal = min(r["wall_total_s"] for r in rows)
    print(
        f"{'run':16s} {'s/step':>7s} {'gen s':>6s} {'upd s':>6s} {'gen tok/s':>9s} {'peak GiB':>8s} "
        f"{'acc before':>10s} {'acc after':>9s} {'acc @' + format(equal, '.0f') + ' s':>10s}"
    )
    for r in rows:
        print(
            f"{r['run']:16s} {r['s_per_step']:7.3f} {r['gen_s']:6.3f} {r['update_s']:6.3f} "
            f"{r['gen_tok_s']:9,.0f} {r['peak_gib']:8.2f} {r['acc_before']:10.4f} {r['acc_after']:9.4f} "
            f"{accuracy_at(r['curve'], equal):10.4f}"
        )
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["run"].rsplit("_", 1)[0], []).append(r)
    print("\nmeans over seeds:")
    for name, rs in groups.items():

        def mean(key: str, rs: list[dict] = rs) -> float:
            return statistics.mean(r[key] for r in rs)

        print(
            f"{name:16s} seeds {len(rs)}  s/step {mean('s_per_step'):.3f}  gen tok/s {mean('gen_tok_s'):,.0f}  "
            f"acc {mean('acc_before'):.4f} -> {mean('acc_after'):.4f}  "
            f"acc @ {equal:.0f} s {statistics.mean(accuracy_at(r['curve'], equal) for r in rs):.4f}"
        )
    for mine in [g for g in groups if g.startswith("ours")]:
        for name, rs in groups.items():
            if name.startswith("trl"):
                ours = statistics.mean(r["s_per_step"] for r in groups[mine])
                theirs = statistics.mean(r["s_per_step"] for r in rs)
                g_ours = statistics.mean(r["gen_tok_s"] for r in groups[mine])
                g_theirs = statistics.mean(r["gen_tok_s"] for r in rs)
                print(
                    f"{mine} vs {name}: {theirs / ours:.2f}x faster per step, {g_ours / g_theirs:.2f}x generation tok/s"
                )
    mismatch_table(rows, groups, equal)
    slow_updates(folder)
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
    ap.add_argument("--pack", choices=("auto", "true", "false"), default="auto", help="ours' model.pack")
    ap.add_argument("--pack-max-tokens", type=int, default=None, help="ours' model.pack_max_tokens")
    ap.add_argument(
        "--checkpointing",
        choices=("on", "off"),
        default=None,
        help="ours' gradient checkpointing (default: on)",
    )
    ap.add_argument("--no-gc-freeze", action="store_true", help="ours without train.gc_freeze")
    ap.add_argument(
        "--expandable-segments", action="store_true", help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    )
    ap.add_argument("--no-plot", action="store_true", help="no learning-curve redraw during ours' steps")
    ap.add_argument("--learner-cudnn", action="store_true", help="ours' update with cuDNN attention allowed")
    ap.add_argument("--correction", default="token_tis", help="ours' algo.rollout_correction (every ours* run)")
    ap.add_argument("--mask-band", type=float, nargs=2, default=(0.5, 2.0), help="ours' algo.rollout_mask_band")
    args = ap.parse_args()
    CORRECTION.update(rollout_correction=args.correction, rollout_mask_band=tuple(args.mask_band))
    if args.report:
        report(Path(args.report))
        return
    if args.expandable_segments:  # read when CUDA is first initialised: before importing torch
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    UPDATE.update(
        pack=args.pack,
        pack_max_tokens=args.pack_max_tokens,
        checkpointing=None if args.checkpointing is None else args.checkpointing == "on",
    )
    options = {
        "no_gc_freeze": args.no_gc_freeze,
        "no_plot": args.no_plot,
        "learner_cudnn": args.learner_cudnn,
        "expandable_segments": args.expandable_segments,
        **UPDATE,
    }
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        sys.exit("vs_trl_gpu.py needs CUDA")
    if any(spec.startswith("trl") for spec in args.runs) and importlib.util.find_spec("trl") is None:
        # Checked before any run: the TRL runs come last, after minutes of ours.
        sys.exit("vs_trl_gpu.py: the trl_* runs need TRL: pip install trl==1.16.0 datasets")
    if any(spec.startswith("trl_vllm") for spec in args.runs) and importlib.util.find_spec("vllm") is None:
        sys.exit("vs_trl_gpu.py: the trl_vllm_* runs need vLLM on CUDA: pip install vllm")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    evaluator = None
    for spec in args.runs:
        name, seed = spec.split(":")
        if name.startswith("trl") and evaluator is None:
            evaluator = make_evaluator()
        if name == "ours":
            result = run_ours(int(seed), args.steps, args.eval_every, "static", options=options)
        elif name == "ours_packed":
            result = run_ours(int(seed), args.steps, args.eval_every, "static", "true", options=options)
        elif name == "ours_async":
            result = run_ours(int(seed), args.steps, args.eval_every, "async", options=options)
        elif name == "ours_fp8":
            result = run_ours(int(seed), args.steps, args.eval_every, "static", options=options, quantization="fp8")
        elif name == "ours_dynamic":
            result = run_ours(int(seed), args.steps, args.eval_every, "dynamic", options=options)
        elif name in ("trl_bf16", "trl_fp32", "trl_vllm_bf16", "trl_vllm_fp32"):
            vllm = name.startswith("trl_vllm")
            result = run_trl(int(seed), args.steps, args.eval_every, name.endswith("fp32"), evaluator, vllm)
        else:
            sys.exit(f"unknown run {name!r}")
        (out / f"{name}_{seed}.json").write_text(json.dumps(result))
        print(
            json.dumps({k: v for k, v in summarize(f"{name}_{seed}", result).items() if k != "curve"}),
            flush=True,
        )
    report(out)


if __name__ == "__main__":
    main()
