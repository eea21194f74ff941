"""The training loop: collect groups -> rewards -> advantages -> policy (and value) update -> weight
sync to the engine -> repeat, with evaluation, metrics, curves and checkpoints.

    python -m chatgym.trainer.train examples/configs/math_grpo.yaml train.max_steps=3 --output-dir runs/x
    python -m chatgym.trainer.train examples/configs/math_grpo.yaml --output-dir runs/x --resume

One step (0-based ``s``) trains on ``tasks_for_step(s)`` — a pure function of (seed, step) — with
reset seeds and sampling seeds derived from (seed, step), so a run resumed from the checkpoint of
step ``s`` draws the same next batch as the uninterrupted run. Everything goes under
``train.output_dir``: ``config.yaml``, ``metrics.jsonl``, ``tensorboard/``, ``learning_curve.png``,
``traces.jsonl`` (a sample of rollouts), ``eval_traces.jsonl``, ``checkpoints/step_NNNNNN/``,
``summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from .batch import TokenBatch, collate
from .checkpoint import (
    checkpoint_step,
    find_checkpoint,
    latest_checkpoint,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
)
from .config import Config, ConfigError, EngineConfig, config_to_dict, load_config, save_config
from .metrics import MetricsLogger
from .modeling import (
    autocast_context,
    cpu_threads,
    export_weights,
    load_critic,
    load_policy,
    reference_logits_context,
    resolve_compute_dtype,
    resolve_device,
    trainable_parameters,
)
from .models import load_model_path
from .optim import build_optimizer
from .rollout import Collector
from .sampler import tasks_for_step
from .types import Trajectory
from .update import (
    Models,
    compute_advantages,
    forward_values,
    hit_budget,
    informative_groups,
    is_correct,
    per_token_pass,
    place_turn_rewards,
    policy_logprobs,
    shape_rewards,
    truncation_mask,
    update,
)


def build_engine(cfg: EngineConfig, model_path: Path, tokenizer: Any, seed: int, max_model_len: int) -> Any:
    """Build the engine named by ``engine.backend`` with :func:`chatgym.trainer.engines.engine_class`.

    ``dtype``, ``tokenizer``, ``seed`` and ``max_model_len`` (tokens) are passed when the engine's
    constructor takes them, then ``engine.options`` (which win).

    Raises:
        ModuleNotFoundError: the backend's package is missing (e.g. vLLM: ``pip install 'chatgym[vllm]'``).
    """
    from .engines import engine_class

    cls = engine_class(cfg.backend)
    accepted = inspect.signature(cls).parameters
    candidates = {"dtype": cfg.dtype, "tokenizer": tokenizer, "seed": seed, "max_model_len": max_model_len}
    kwargs = {k: v for k, v in candidates.items() if k in accepted}
    kwargs.update(cfg.options)
    return cls(str(model_path), **kwargs)


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
        from .tokenizer import get_tokenizer

        self.tokenizer = get_tokenizer(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

        self.policy = self._load_policy(ckpt)
        self.reference = self._load_reference()
        self.critic = self._load_critic(ckpt)
        updates = cfg.train.max_steps * cfg.algo.ppo_epochs * cfg.algo.mini_batches
        optimizer, scheduler = build_optimizer(
            [(trainable_parameters(self.policy), cfg.optim.lr)], cfg.optim, updates
        )
        self.models = Models(self.policy, optimizer, scheduler)
        if self.critic is not None:
            c_opt, c_sched = build_optimizer(
                [(trainable_parameters(self.critic), cfg.optim.value_lr or cfg.optim.lr)], cfg.optim, updates
            )
            self.models.critic, self.models.critic_optimizer, self.models.critic_scheduler = (
                self.critic,
                c_opt,
                c_sched,
            )
        self.start_step = 0
        self.update_generator = torch.Generator().manual_seed(cfg.train.seed)
        if ckpt is not None:
            state = load_trainer_state(ckpt)
            optimizer.load_state_dict(state["optimizer"]["policy"])
            scheduler.load_state_dict(state["scheduler"]["policy"])
            if self.critic is not None:
                self.models.critic_optimizer.load_state_dict(state["optimizer"]["critic"])
                self.models.critic_scheduler.load_state_dict(state["scheduler"]["critic"])
            set_rng_state(state["rng"])
            self.update_generator.set_state(state["rng"]["update_generator"])
            self.start_step = int(state["step"])
        self.resumed_from = ckpt

        self.loop = asyncio.new_event_loop()
        if engine is None:
            engine = build_engine(
                cfg.engine,
                self._engine_model_path(),
                self.tokenizer,
                cfg.train.seed,
                cfg.rollout.max_model_len,
            )
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

    # ---- set-up -------------------------------------------------------------------------------

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

    def _load_reference(self) -> Any:
        if self.cfg.algo.kl_coef <= 0:
            return None
        if self.cfg.lora.enabled:
            return "adapters-off"  # the base model under policy.disable_adapter()
        ref = load_policy(self.cfg.model, self.cfg.lora, self.device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _load_critic(self, ckpt: Path | None) -> Any:
        if not self.cfg.model.value_head:
            return None
        if ckpt is None:
            return load_critic(self.cfg.model, self.device)
        return load_critic(
            dataclasses.replace(self.cfg.model, path=str(ckpt / "critic"), random_init=False), self.device
        )

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

    def _set_up_compute(self) -> None:
        """Resolve the machine-dependent choices once, at start, and log them in one line (they are not
        written into ``config.yaml``: ``model.compute_dtype: auto`` stays ``auto`` there).

        - ``compute_dtype``: :func:`~chatgym.trainer.modeling.resolve_compute_dtype` (bf16 autocast on
          CUDA and native-bf16 CPUs, fp32 on AVX2-only CPUs); used by the update and by the reference
          and old-logprob passes.
        - ``pack``: on CPU each micro-batch is forwarded packed, without padding
          (:func:`~chatgym.trainer.update.forward_logprobs_packed`); CUDA keeps padded batches.
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

    def _autocast(self) -> Any:
        """Mixed precision per the resolved ``compute_dtype`` (see :meth:`_set_up_compute`)."""
        return autocast_context(self.device, self.compute_dtype, self.cfg.model.dtype)

    # ---- pieces of a step -----------------------------------------------------------------------

    def sync_weights(self) -> float:
        """Send the policy's weights to the engine; returns the seconds it took."""
        t0 = time.perf_counter()
        # Cast on the way (fp32 master weights -> the engine's bf16): half the bytes to move and no
        # dtype conversion inside the engine's loaders.
        dtype = getattr(torch, self.cfg.engine.dtype)
        self.engine.update_weights((name, tensor.to(dtype)) for name, tensor in export_weights(self.policy))
        return time.perf_counter() - t0

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

    def evaluate(self, num_tasks: int | None = None) -> dict[str, float]:
        """Score the current policy on the first ``num_tasks`` tasks of the held-out split (one sample
        each at ``env.eval_temperature``): ``eval/score`` (mean reward), ``eval/accuracy``."""
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
        return {
            "eval/score": float(np.mean([t.reward for t in ok])) if ok else 0.0,
            "eval/accuracy": float(np.mean([is_correct(t) for t in ok])) if ok else 0.0,
            "eval/failed": len(trajs) - len(ok),
            "eval/response_length": float(np.mean([t.response_tokens for t in ok])) if ok else 0.0,
            "eval/tasks": n,
            "timing/eval_s": time.perf_counter() - t0,
        }

    def _reference_logprobs(self, mb: TokenBatch, prefix_len: int) -> torch.Tensor:
        if self.reference == "adapters-off":
            with reference_logits_context(self.policy), self._autocast():
                return policy_logprobs(self.policy, mb, prefix_len, with_entropy=False, pack=self.pack)[0]
        with self._autocast():
            return policy_logprobs(self.reference, mb, prefix_len, with_entropy=False, pack=self.pack)[0]

    def _old_logprobs(self, mb: TokenBatch, prefix_len: int) -> torch.Tensor:
        with self._autocast():
            return policy_logprobs(self.policy, mb, prefix_len, with_entropy=False, pack=self.pack)[0]

    def _values(self, mb: TokenBatch, prefix_len: int) -> torch.Tensor:
        with self._autocast():
            return forward_values(self.critic, mb)

    @property
    def share_prefix(self) -> bool:
        # Gradient checkpointing makes transformers drop the KV cache the padded shared forward relies
        # on; the packed one lays the prompt down once in the sequence and needs no cache.
        checkpointing = self.cfg.model.gradient_checkpointing and not self.pack
        return self.cfg.train.share_prompt_prefix and not checkpointing

    def step(self, step: int) -> dict[str, float]:
        """One training step; returns its metrics."""
        cfg, algo = self.cfg, self.cfg.algo
        t_step = time.perf_counter()
        trajs = self.collect(step)
        rollout_s = time.perf_counter() - t_step
        ok = [t for t in trajs if not t.failed]
        metrics: dict[str, float] = self._rollout_metrics(trajs, ok, rollout_s)

        t0 = time.perf_counter()
        rewards = shape_rewards(ok, algo, cfg.rollout.max_response_tokens) if ok else torch.zeros(0)
        keep = list(range(len(ok)))
        if algo.dynamic_sampling and ok:
            keep = informative_groups([t.group_id for t in ok], rewards)
        metrics["batch/groups_kept"] = len({ok[i].group_id for i in keep})
        metrics["batch/trajectories_trained"] = len(keep)
        update_metrics: dict[str, float] = {}
        sync_s = 0.0
        if keep:
            trained = [ok[i] for i in keep]
            rewards = rewards[keep]
            batch = collate(trained, self.pad_id)
            token_rewards = place_turn_rewards(trained, rewards, batch)
            if algo.mask_truncated:
                batch = truncation_mask(batch, trained)
            mb_size = cfg.train.micro_batch_size
            share = self.share_prefix
            if self.reference is not None:
                batch.ref_logprobs = per_token_pass(
                    self._reference_logprobs, batch, mb_size, self.device, share
                )
            if algo.ppo_epochs * algo.mini_batches > 1:
                batch.old_logprobs = per_token_pass(self._old_logprobs, batch, mb_size, self.device, share)
            if self.critic is not None:
                batch.old_values = per_token_pass(self._values, batch, mb_size, self.device)
            group_ids = torch.tensor([t.group_id for t in trained])
            batch.advantages, batch.returns, kl_r = compute_advantages(batch, token_rewards, group_ids, algo)
            if kl_r is not None:
                metrics["reward/kl_penalty"] = float(
                    (kl_r * batch.loss_mask).sum() / batch.loss_mask.sum().clamp_min(1)
                )
            mask = batch.loss_mask
            metrics["batch/advantage_mean"] = (
                float(batch.advantages[mask].mean()) if bool(mask.any()) else 0.0
            )
            metrics["batch/advantage_abs_mean"] = (
                float(batch.advantages[mask].abs().mean()) if bool(mask.any()) else 0.0
            )
            metrics["batch/trained_tokens"] = int(mask.sum())
            metrics["timing/prepare_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            update_metrics = update(
                self.models,
                batch,
                algo,
                micro_batch_size=mb_size,
                max_grad_norm=cfg.optim.max_grad_norm,
                device=self.device,
                generator=self.update_generator,
                autocast=self._autocast,
                share_prefix=self.share_prefix,
                pack=self.pack,
            )
            update_s = time.perf_counter() - t1
            passes = algo.ppo_epochs * (2 if self.critic is not None else 1)
            metrics["timing/update_s"] = update_s
            metrics["throughput/train_tokens_per_s"] = (
                float(batch.attention_mask.sum()) * passes / max(update_s, 1e-9)
            )
            sync_s = self.sync_weights()
        metrics.update(update_metrics)
        metrics["timing/sync_s"] = sync_s
        metrics["timing/step_s"] = time.perf_counter() - t_step
        return metrics

    def _rollout_metrics(
        self, trajs: Sequence[Trajectory], ok: Sequence[Trajectory], rollout_s: float
    ) -> dict[str, float]:
        rewards = [t.reward for t in ok]
        lengths = [t.response_tokens for t in ok]
        gen_tokens = sum(t.response_tokens for t in trajs)
        return {
            "reward/mean": float(np.mean(rewards)) if ok else 0.0,
            "reward/std": float(np.std(rewards)) if ok else 0.0,
            "reward/accuracy": float(np.mean([is_correct(t) for t in ok])) if ok else 0.0,
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
            "timing/env_s_mean": float(np.mean([t.timing.get("env_s", 0.0) for t in trajs]))
            if trajs
            else 0.0,
            "throughput/gen_tokens_per_s": gen_tokens / max(rollout_s, 1e-9),
        }

    # ---- the loop -------------------------------------------------------------------------------

    def save(self, steps_done: int) -> Path:
        state_rng_extra = {"update_generator": self.update_generator.get_state()}
        optimizer = _Bundle(policy=self.models.optimizer, critic=self.models.critic_optimizer)
        scheduler = _Bundle(policy=self.models.scheduler, critic=self.models.critic_scheduler)
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
                    acc=f"{metrics['reward/accuracy']:.2f}",
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


def main(argv: Sequence[str] | None = None) -> int:
    """``chatgym train CONFIG [key.sub=value ...] [--max-steps N] [--output-dir DIR] [--resume | --resume-from CKPT]``.

    Overrides and options may come in any order. Returns the exit status: 0 done (or nothing left to
    do), 2 a bad config, output dir or checkpoint — reported before any model loads.
    """
    parser = argparse.ArgumentParser(
        prog="chatgym train", description="Train a policy with PPO/GRPO on a chatgym env."
    )
    parser.add_argument(
        "config", nargs="?", help="YAML config (examples/configs/*.yaml); defaults when omitted"
    )
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. algo.kl_coef=0.01")
    parser.add_argument("--max-steps", type=int, help="cap the run at N steps (train.max_steps)")
    parser.add_argument("--output-dir", help="where metrics, curves and checkpoints go (train.output_dir)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in the output dir"
    )
    parser.add_argument("--resume-from", metavar="CKPT", help="continue from this checkpoint directory")
    # Intermixed: `--output-dir runs/x algo.kl_coef=0.01` must not leave the override unrecognised.
    args = parser.parse_intermixed_args(argv)
    overrides = list(args.overrides)
    if args.config and "=" in args.config:  # only overrides, no file
        overrides.insert(0, args.config)
        args.config = None
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.output_dir is not None:
        overrides.append(f"train.output_dir={args.output_dir}")
    resume = args.resume_from or args.resume
    try:
        config = load_config(args.config, overrides)
        ckpt = find_checkpoint(config.train.output_dir, resume)
    except (ConfigError, OSError, yaml.YAMLError) as exc:  # OSError: missing file, a directory, ...
        print(f"chatgym train: {exc}", file=sys.stderr)
        return 2
    done = checkpoint_step(ckpt) if ckpt is not None else None
    if done is not None and done >= config.train.max_steps:
        print(
            f"chatgym train: {ckpt} is at step {done} and train.max_steps is {config.train.max_steps}: "
            "nothing to do (raise train.max_steps to continue)"
        )
        return 0
    try:
        load_model_path(config.model.path)  # an unknown model fails here, not after the output dir is made
    except FileNotFoundError as exc:
        print(f"chatgym train: {exc}", file=sys.stderr)
        return 2
    trainer = Trainer(config, resume=ckpt or False)  # already found and checked above
    try:
        summary = trainer.train()
    except KeyboardInterrupt:
        last = latest_checkpoint(config.train.output_dir)
        where = f"the last checkpoint is {last} (continue with --resume)" if last else "no checkpoint was saved yet"
        print(f"\nchatgym train: interrupted; {where}", file=sys.stderr)
        return 130
    finally:
        trainer.close()
    _print_summary(summary)
    return 0


def _print_summary(summary: dict[str, Any]) -> None:
    def pick(m: dict[str, Any] | None, *keys: str) -> str:
        if not m:
            return "-"
        return ", ".join(f"{k.split('/')[-1]}={m[k]:.4g}" for k in keys if isinstance(m.get(k), (int, float)))

    keys = (
        "reward/mean",
        "reward/accuracy",
        "actor/kl",
        "actor/entropy",
        "response/length_mean",
        "timing/step_s",
    )
    start = summary["steps"] - summary["steps_run"]
    resumed = f" (resumed at step {start})" if start else ""
    print(f"done: {summary['steps_run']} steps{resumed}, now at step {summary['steps']}, in {summary['wall_s']:.0f} s")
    print(f"  first step: {pick(summary['first_step'], *keys)}")
    print(f"  last step:  {pick(summary['last_step'], *keys)}")
    print(f"  held-out before: {pick(summary['eval_before'], 'eval/score', 'eval/accuracy')}")
    print(f"  held-out after:  {pick(summary['eval_after'], 'eval/score', 'eval/accuracy')}")
    print(f"  learning curve: {summary['learning_curve']}")
    print(f"  checkpoint:     {summary['checkpoint']}")
    print(f"  metrics:        {summary['metrics']}")


cli_main = main  # the ``chatgym train`` subcommand (chatgym/cli.py)


if __name__ == "__main__":
    raise SystemExit(main())
