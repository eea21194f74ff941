"""The training loop: collect groups -> rewards -> advantages -> policy (and value) update -> weight
sync to the engine -> repeat, with evaluation, metrics, curves and checkpoints.

    chatgym train examples/configs/math_grpo.yaml train.max_steps=3 --output-dir runs/x   (train_cli.py)

One step (0-based ``s``) trains on ``tasks_for_step(s)`` — a pure function of (seed, step) — with
reset seeds and sampling seeds derived from (seed, step), so a run resumed from the checkpoint of
step ``s`` draws the same next batch as the uninterrupted run. Everything goes under
``train.output_dir``: ``config.yaml``, ``metrics.jsonl``, ``tensorboard/``, ``learning_curve.png``,
``traces.jsonl`` (a sample of rollouts), ``eval_traces.jsonl``, ``checkpoints/step_NNNNNN/``,
``summary.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import Config, config_to_dict, save_config
from .engines import build_engine, engine_dtype
from .learner.checkpoint import (
    find_checkpoint,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
)
from .learner.forward import ForwardPlan
from .learner.optim import build_optimizer
from .learner.policy import (
    autocast_context,
    cpu_threads,
    export_weights,
    load_critic,
    load_policy,
    resolve_compute_dtype,
    resolve_device,
    trainable_parameters,
)
from .learner.prepare import hit_budget, prepare_batch
from .learner.reference import ReferencePolicy
from .learner.update import UpdateState, update
from .metrics import MetricsLogger
from .models import load_model_path
from .rollout.collector import Collector
from .rollout.types import Trajectory
from .sampler import tasks_for_step


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _step_seed(seed: int, step: int, salt: int) -> int:
    """A distinct, reproducible seed per (run seed, step, purpose)."""
    return int(np.random.SeedSequence([seed, step, salt]).generate_state(1)[0])


class Trainer:
    """Runs :class:`~chatgym.trainer.config.Config` end to end.

    Args:
        config: the run's configuration.
        engine: an already built engine (tests, custom set-ups); None builds ``config.engine``.
            Its weights are overwritten with the policy's at start.
        resume: False (fresh run; refuses an ``output_dir`` that already holds checkpoints), True
            (continue from the newest checkpoint in ``output_dir``, or start fresh when there is
            none), or a checkpoint directory.

    Raises:
        FileExistsError: a fresh run into an ``output_dir`` with checkpoints.
        FileNotFoundError: ``resume`` names a directory that is not a checkpoint.
    """

    def __init__(self, config: Config, *, engine: Any = None, resume: bool | str | Path = False):
        self.cfg = cfg = config
        self.out = Path(cfg.train.output_dir)
        ckpt = find_checkpoint(self.out, resume)  # before mkdir: a refused run leaves nothing behind
        self.out.mkdir(parents=True, exist_ok=True)
        seed_everything(cfg.train.seed)
        self.device = resolve_device(cfg.model.device)
        self._set_up_compute()
        self.model_path = load_model_path(cfg.model.path)
        from .rollout.tokenizer import get_tokenizer

        self.tokenizer = get_tokenizer(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

        # The learner side: policy, reference, critic, optimizers (in this order: random init seeds).
        self.plan = ForwardPlan(
            micro_batch_size=cfg.train.micro_batch_size,
            device=self.device,
            share_prefix=self.share_prefix,
            pack=self.pack,
            autocast=self._autocast,
        )
        self.policy = self._load_policy(ckpt)
        self.reference = (
            ReferencePolicy.load(cfg.model, cfg.lora, self.policy, self.plan) if cfg.algo.kl_coef > 0 else None
        )
        self.critic = self._load_critic(ckpt)
        self.state = self._build_optimizers()
        self.start_step = 0
        self.update_generator = torch.Generator().manual_seed(cfg.train.seed)
        if ckpt is not None:
            self._restore(ckpt)
        self.resumed_from = ckpt

        # The rollout side: engine (holding the policy's weights) and collectors.
        self.loop = asyncio.new_event_loop()
        self.engine_dtype = engine_dtype(cfg.engine)
        if engine is None:
            engine = build_engine(
                cfg.engine, self._engine_model_path(), self.tokenizer, cfg.train.seed, cfg.rollout.max_model_len
            )
            print(f"chatgym: engine {cfg.engine.backend} in {self.engine_dtype}", file=sys.stderr)
        self.engine = engine
        self.sync_weights()
        generation_config = getattr(self._base_model(), "generation_config", None)
        self.rollout_cfg = dataclasses.replace(
            cfg.rollout, trace_path=str(self.out / "traces.jsonl"), trace_fraction=cfg.train.trace_fraction
        )
        self.collector = Collector(self.engine, self.tokenizer, self.rollout_cfg, generation_config)
        eval_cfg = dataclasses.replace(
            cfg.rollout,
            temperature=cfg.env.eval_temperature,
            trace_path=str(self.out / "eval_traces.jsonl"),
            trace_fraction=1.0,
        )
        self.eval_collector = Collector(self.engine, self.tokenizer, eval_cfg, generation_config)
        self.num_train_tasks = self._count_tasks(cfg.env.train_split)
        self._num_eval_tasks: int | None = None
        save_config(cfg, self.out / "config.yaml")
        self.metrics = MetricsLogger(
            self.out,
            tensorboard=cfg.train.tensorboard,
            wandb=cfg.train.wandb,
            wandb_project=cfg.train.wandb_project,
            run_config=config_to_dict(cfg),
            # A fresh run drops rows an earlier, interrupted run left in metrics.jsonl.
            resume_step=self.start_step + 1 if ckpt is not None else 0,
        )
        for warning in self.metrics.warnings:
            print(f"chatgym: {warning}", file=sys.stderr)

    # ---- one training step ------------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        """One training step (0-based ``step``): collect -> prepare the batch -> update -> sync weights;
        returns its metrics for the log."""
        t_step = time.perf_counter()
        trajs = self.collect(step)
        metrics = rollout_metrics(trajs, rollout_s=time.perf_counter() - t_step)

        batch, batch_metrics = prepare_batch(
            trajs,
            self.cfg.algo,
            max_response_tokens=self.cfg.rollout.max_response_tokens,
            pad_id=self.pad_id,
            policy=self.policy,
            plan=self.plan,
            reference=self.reference,
            critic=self.critic,
        )
        metrics.update(batch_metrics)
        metrics["timing/sync_s"] = 0.0
        if batch is not None:
            t_update = time.perf_counter()
            metrics.update(
                update(
                    self.state,
                    batch,
                    self.cfg.algo,
                    self.plan,
                    max_grad_norm=self.cfg.optim.max_grad_norm,
                    generator=self.update_generator,
                )
            )
            metrics.update(self._update_timing(batch, time.perf_counter() - t_update))
            metrics["timing/sync_s"] = self.sync_weights()
        metrics["timing/step_s"] = time.perf_counter() - t_step
        return metrics

    def collect(self, step: int) -> list[Trajectory]:
        """The trajectories of training step ``step`` (0-based)."""
        cfg = self.cfg
        tasks = tasks_for_step(step, cfg.train.prompts_per_step, self.num_train_tasks, cfg.train.seed)
        self.collector.config = dataclasses.replace(
            self.rollout_cfg, seed=_step_seed(cfg.train.seed, step, 1)
        )
        coro = self.collector.collect(
            cfg.env.id,
            tasks,
            cfg.train.group_size,
            env_kwargs={"split": cfg.env.train_split, **cfg.env.kwargs},
            seed=_step_seed(cfg.train.seed, step, 2) % (2**31),
        )
        return self.loop.run_until_complete(coro)

    def sync_weights(self) -> float:
        """Send the policy's weights to the engine; returns the seconds it took."""
        t0 = time.perf_counter()
        # Cast on the way (fp32 master weights -> the engine's bf16): half the bytes to move and no
        # dtype conversion inside the engine's loaders.
        dtype = getattr(torch, self.engine_dtype)
        self.engine.update_weights((name, tensor.to(dtype)) for name, tensor in export_weights(self.policy))
        return time.perf_counter() - t0

    def _update_timing(self, batch: Any, update_s: float) -> dict[str, float]:
        passes = self.cfg.algo.ppo_epochs * (2 if self.critic is not None else 1)
        return {
            "timing/update_s": update_s,
            "throughput/train_tokens_per_s": float(batch.attention_mask.sum()) * passes / max(update_s, 1e-9),
        }

    def evaluate(self, num_tasks: int | None = None) -> dict[str, float]:
        """Score the current policy on the first ``num_tasks`` tasks of the held-out split (one sample
        each at ``env.eval_temperature``): ``eval/score`` (mean reward), ``eval/accuracy`` (share of
        ``Trajectory.success``, where the env defines it)."""
        n = self.cfg.env.eval_tasks if num_tasks is None else num_tasks
        if n <= 0:
            return {}
        if self._num_eval_tasks is None:
            self._num_eval_tasks = self._count_tasks(self.cfg.env.eval_split)
        n = min(n, self._num_eval_tasks)
        t0 = time.perf_counter()
        coro = self.eval_collector.collect(
            self.cfg.env.id,
            list(range(n)),
            1,
            env_kwargs={"split": self.cfg.env.eval_split, **self.cfg.env.kwargs},
            seed=self.cfg.train.seed,
        )
        trajs = self.loop.run_until_complete(coro)
        ok = [t for t in trajs if not t.failed]
        out = {
            "eval/score": float(np.mean([t.reward for t in ok])) if ok else 0.0,
            "eval/failed": len(trajs) - len(ok),
            "eval/response_length": float(np.mean([t.response_tokens for t in ok])) if ok else 0.0,
            "eval/tasks": n,
            "timing/eval_s": time.perf_counter() - t0,
        }
        out.update(_accuracy("eval/accuracy", ok))
        return out

    # ---- set-up -------------------------------------------------------------------------------

    def _set_up_compute(self) -> None:
        """Resolve the machine-dependent choices once, at start, and log them in one line (they are not
        written into ``config.yaml``: ``model.compute_dtype: auto`` stays ``auto`` there).

        - ``compute_dtype``: :func:`~chatgym.trainer.learner.policy.resolve_compute_dtype` (bf16 autocast on
          CUDA and native-bf16 CPUs, fp32 on AVX2-only CPUs); used by the update and by the reference
          and old-logprob passes.
        - ``pack``: on CPU each micro-batch is forwarded packed, without padding
          (:func:`~chatgym.trainer.learner.forward.forward_logprobs_packed`); CUDA keeps padded batches.
        - torch threads on CPU: set here once to the cores this process may use.
        """
        model = self.cfg.model
        self.compute_dtype, reason = resolve_compute_dtype(model.compute_dtype, model.dtype, self.device)
        self.pack = self.device.type == "cpu"
        threads = ""
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads())
            threads = f", {torch.get_num_threads()} torch threads"
        mixed = " autocast" if self.compute_dtype != model.dtype else ""
        print(
            f"chatgym: training compute {self.compute_dtype}{mixed} over {model.dtype} weights on "
            f"{self.device} ({reason}){threads}, {'packed' if self.pack else 'padded'} micro-batches",
            file=sys.stderr,
        )

    @property
    def share_prefix(self) -> bool:
        # Gradient checkpointing makes transformers drop the KV cache the padded shared forward relies
        # on; the packed one lays the prompt down once in the sequence and needs no cache.
        checkpointing = self.cfg.model.gradient_checkpointing and not self.pack
        return self.cfg.train.share_prompt_prefix and not checkpointing

    def _autocast(self) -> Any:
        """Mixed precision per the resolved ``compute_dtype`` (see :meth:`_set_up_compute`)."""
        return autocast_context(self.device, self.compute_dtype, self.cfg.model.dtype)

    def _load_policy(self, ckpt: Path | None) -> Any:
        cfg = self.cfg
        if ckpt is None:
            return load_policy(cfg.model, cfg.lora, self.device)
        if cfg.lora.enabled:
            from peft import PeftModel

            base = load_policy(cfg.model, dataclasses.replace(cfg.lora, enabled=False), self.device)
            return PeftModel.from_pretrained(base, ckpt / "policy", is_trainable=True).train()
        model_cfg = dataclasses.replace(cfg.model, path=str(ckpt / "policy"), random_init=False)
        return load_policy(model_cfg, cfg.lora, self.device)

    def _load_critic(self, ckpt: Path | None) -> Any:
        if not self.cfg.model.value_head:
            return None
        if ckpt is None:
            return load_critic(self.cfg.model, self.device)
        return load_critic(
            dataclasses.replace(self.cfg.model, path=str(ckpt / "critic"), random_init=False), self.device
        )

    def _build_optimizers(self) -> UpdateState:
        cfg = self.cfg
        updates = cfg.train.max_steps * cfg.algo.ppo_epochs * cfg.algo.mini_batches
        optimizer, scheduler = build_optimizer(
            [(trainable_parameters(self.policy), cfg.optim.lr)], cfg.optim, updates
        )
        state = UpdateState(self.policy, optimizer, scheduler)
        if self.critic is not None:
            state.critic = self.critic
            state.critic_optimizer, state.critic_scheduler = build_optimizer(
                [(trainable_parameters(self.critic), cfg.optim.value_lr or cfg.optim.lr)], cfg.optim, updates
            )
        return state

    def _restore(self, ckpt: Path) -> None:
        saved = load_trainer_state(ckpt)
        self.state.optimizer.load_state_dict(saved["optimizer"]["policy"])
        self.state.scheduler.load_state_dict(saved["scheduler"]["policy"])
        if self.critic is not None:
            self.state.critic_optimizer.load_state_dict(saved["optimizer"]["critic"])
            self.state.critic_scheduler.load_state_dict(saved["scheduler"]["critic"])
        set_rng_state(saved["rng"])
        self.update_generator.set_state(saved["rng"]["update_generator"])
        self.start_step = int(saved["step"])

    def _engine_model_path(self) -> Path:
        """The directory the engine loads: the model's own, or (random init: an architecture the engine
        cannot load by name) the initial policy saved under ``output_dir/init_model``."""
        if not self.cfg.model.random_init:
            return self.model_path
        path = self.out / "init_model"
        # The plain model's names and (for LoRA) merged weights, whatever wraps the policy.
        state = {name: tensor.contiguous() for name, tensor in export_weights(self.policy)}
        self._base_model().save_pretrained(path, state_dict=state, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        return path

    def _base_model(self) -> Any:
        return self.policy.get_base_model() if hasattr(self.policy, "get_base_model") else self.policy

    def _count_tasks(self, split: str) -> int:
        import gymnasium as gym

        import chatgym  # noqa: F401  (registers the env ids)

        env = gym.make(self.cfg.env.id, split=split, **self.cfg.env.kwargs)
        try:
            return len(env.unwrapped.tasks)
        finally:
            env.close()

    # ---- the loop -------------------------------------------------------------------------------

    def save(self, steps_done: int) -> Path:
        state_rng_extra = {"update_generator": self.update_generator.get_state()}
        optimizer = _Bundle(policy=self.state.optimizer, critic=self.state.critic_optimizer)
        scheduler = _Bundle(policy=self.state.scheduler, critic=self.state.critic_scheduler)
        path = save_checkpoint(
            self.out,
            steps_done,
            policy=self.policy,
            tokenizer=self.tokenizer,
            optimizer=optimizer,
            scheduler=scheduler,
            critic=self.critic,
            config=config_to_dict(self.cfg),
            keep=self.cfg.train.keep_checkpoints,
            rng_extra=state_rng_extra,
        )
        return path

    def train(self) -> dict[str, Any]:
        """Run from ``start_step`` to ``train.max_steps``; returns the run's summary (also written to
        ``summary.json``)."""
        cfg = self.cfg
        t_run = time.perf_counter()
        start_step = self.start_step
        first: dict[str, float] | None = None
        last: dict[str, float] | None = None
        eval_before = None
        if self.start_step == 0 and cfg.env.eval_tasks:
            eval_before = self.evaluate()
            self.metrics.log(0, eval_before)
        bar = _progress(self.start_step, cfg.train.max_steps, cfg.train.progress)
        checkpoint = None
        for step in range(self.start_step, cfg.train.max_steps):
            metrics = self.step(step)
            done = step + 1
            if cfg.env.eval_every and done % cfg.env.eval_every == 0 and done < cfg.train.max_steps:
                metrics.update(self.evaluate())
            self.metrics.log(done, metrics)
            self.metrics.plot_later()  # off the step: a redraw takes 0.5-1 s
            first = first or metrics
            last = metrics
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    reward=f"{metrics['reward/mean']:.3f}",
                    acc=f"{metrics.get('reward/accuracy', float('nan')):.2f}",
                    kl=f"{metrics.get('actor/kl', 0.0):.4f}",
                    s=f"{metrics['timing/step_s']:.1f}",
                )
            if cfg.train.save_every and done % cfg.train.save_every == 0:
                checkpoint = self.save(done)
        if bar is not None:
            bar.close()
        if checkpoint is None or not checkpoint.name.endswith(f"{cfg.train.max_steps:06d}"):
            checkpoint = self.save(cfg.train.max_steps)
        eval_after = self.evaluate() if cfg.env.eval_tasks else None
        if eval_after:
            self.metrics.log(cfg.train.max_steps, eval_after)
        curve = self.metrics.plot()
        summary = {
            "output_dir": str(self.out),
            "steps": cfg.train.max_steps,
            "steps_run": cfg.train.max_steps - start_step,
            "resumed_from": str(self.resumed_from) if self.resumed_from else None,
            "wall_s": time.perf_counter() - t_run,
            "first_step": first,
            "last_step": last,
            "eval_before": eval_before,
            "eval_after": eval_after,
            "checkpoint": str(checkpoint),
            "learning_curve": str(curve),
            "metrics": str(self.metrics.path),
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def close(self) -> None:
        self.collector.close()
        self.eval_collector.close()
        self.metrics.close()
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self.engine.close())
        self.loop.close()


def rollout_metrics(trajs: Sequence[Trajectory], rollout_s: float) -> dict[str, float]:
    """Metrics of a step's trajectories: rewards, ``reward/accuracy`` (share of ``Trajectory.success``
    among those whose env defines it; absent when none does), lengths, failures, timings."""
    ok = [t for t in trajs if not t.failed]
    rewards = [t.reward for t in ok]
    lengths = [t.response_tokens for t in ok]
    gen_tokens = sum(t.response_tokens for t in trajs)
    out = {
        "reward/mean": float(np.mean(rewards)) if ok else 0.0,
        "reward/std": float(np.std(rewards)) if ok else 0.0,
        "response/length_mean": float(np.mean(lengths)) if ok else 0.0,
        "response/length_max": max(lengths, default=0),
        "response/hit_budget_frac": float(np.mean([hit_budget(t) for t in ok])) if ok else 0.0,
        "response/turns_mean": float(np.mean([t.num_turns for t in ok])) if ok else 0.0,
        "batch/trajectories": len(trajs),
        "batch/failed": len(trajs) - len(ok),
        "timing/rollout_s": rollout_s,
        "timing/generate_s_mean": float(np.mean([t.timing.get("generate_s", 0.0) for t in trajs]))
        if trajs
        else 0.0,
        "timing/env_s_mean": float(np.mean([t.timing.get("env_s", 0.0) for t in trajs])) if trajs else 0.0,
        "throughput/gen_tokens_per_s": gen_tokens / max(rollout_s, 1e-9),
    }
    out.update(_accuracy("reward/accuracy", ok))
    return out


def _accuracy(name: str, trajs: Sequence[Trajectory]) -> dict[str, float]:
    judged = [t.success for t in trajs if t.success is not None]
    return {name: float(np.mean(judged))} if judged else {}


class _Bundle:
    """Several optimizers/schedulers saved and restored as one ``state_dict``."""

    def __init__(self, **parts: Any):
        self.parts = {k: v for k, v in parts.items() if v is not None}

    def state_dict(self) -> dict[str, Any]:
        return {k: v.state_dict() for k, v in self.parts.items()}


def _progress(start: int, total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)



