"""The training loop: collect groups -> rewards -> advantages -> policy (and value) update -> weight
sync to the engine -> repeat, with evaluation, metrics, curves and checkpoints.

    chatgym train examples/configs/math_grpo.yaml train.max_steps=3 --output-dir runs/x   (train_cli.py)

One step (0-based ``s``) trains on ``tasks_for_step(s)`` — a pure function of (seed, step) — with
reset seeds and sampling seeds derived from (seed, step), so a run resumed from the checkpoint of
step ``s`` draws the same next batch as the uninterrupted run. Everything goes under
``train.output_dir``: ``config.yaml``, ``metrics.jsonl``, ``tensorboard/``, ``learning_curve.png``,
``batches.jsonl`` (the groups each update trained on: :mod:`~chatgym.trainer.logging.ledger`),
``traces.jsonl`` (a sample of rollouts), ``eval_traces.jsonl``, ``checkpoints/step_NNNNNN/``,
``summary.json``.

``trainer.pipeline`` picks how rollout overlaps training: every mode runs a
:class:`~chatgym.trainer.pipeline.Pipeline` over the rollout source and the learner (``sync``:
collect, update, send weights, per step), and the loop logs, evaluates and checkpoints each step it
yields (an async checkpoint carries the replay buffer and the groups in flight). Co-training
(:mod:`chatgym.trainer.cotrain.loop`) is this loop with a second learner.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chatgym.trainer.config.env import count_tasks
from chatgym.trainer.config.resume import eval_changes, keep_changed_config
from chatgym.trainer.config.run import Config, config_to_dict, save_config
from chatgym.trainer.engines import engine_dtype
from chatgym.trainer.learner.checkpoint import find_checkpoint, load_pipeline_state
from chatgym.trainer.learner.learner import Learner, seed_everything
from chatgym.trainer.logging.ledger import BatchLedger
from chatgym.trainer.logging.step_metrics import (
    all_failed,
    failure_counts,
    held_out_scores,
    multiturn_metrics,
    rollout_metrics,
    some_failed,
)
from chatgym.trainer.logging.writer import MetricsLogger
from chatgym.trainer.models.packaged import load_model_path
from chatgym.trainer.pipeline import Pipeline, PipelineOptions, StepResult
from chatgym.trainer.roles.build import build_learner, build_rollout, start_ray
from chatgym.trainer.rollout.source import RolloutRequest
from chatgym.trainer.rollout.types import Trajectory
from chatgym.trainer.sampler import tasks_for_step


def _step_seed(seed: int, step: int, salt: int) -> int:
    """A distinct, reproducible seed per (run seed, step, purpose)."""
    return int(np.random.SeedSequence([seed, step, salt]).generate_state(1)[0])


class Trainer:
    """Runs :class:`~chatgym.trainer.config.run.Config` end to end.

    One GRPO step of the main job on CPU with the transformers engine (2 prompts x 2 samples; about a
    minute with the set-up of ``scripts/setup.sh`` done)::

        import chatgym

        cfg = chatgym.load_config(
            "examples/configs/math_grpo.yaml",
            ["engine.backend=hf", "engine.options={}", "train.prompts_per_step=2",
             "train.group_size=2", "rollout.max_tokens=16", "env.eval_tasks=0",
             "train.output_dir=runs/doc"],
        )
        trainer = chatgym.Trainer(cfg)
        try:
            metrics = trainer.step(0)  # collect 2 x 2 episodes, one update, weights to the engine
            print(metrics["reward/mean"], metrics["batch/trajectories"])  # e.g. 0.0 4
        finally:
            trainer.close()

    ``trainer.train()`` runs the whole config instead (evaluation, every step, checkpoints, the
    summary); ``chatgym train`` is that from the command line. Metric names: docs/metrics.md.

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

    # Whether a run of this class can be continued (``resume``): the refusal of a used output_dir
    # offers --resume only then.
    resumable = True

    def __init__(self, config: Config, *, engine: Any = None, resume: bool | str | Path = False):
        self.cfg = cfg = config
        self.out = Path(cfg.train.output_dir)
        self.failed_steps_in_a_row = 0  # train.max_failed_steps
        # Before mkdir: a refused run leaves nothing behind.
        ckpt = find_checkpoint(self.out, resume, resumable=self.resumable)
        self.out.mkdir(parents=True, exist_ok=True)
        seed_everything(cfg.train.seed)
        self.cluster = start_ray(cfg)  # trainer.backend: ray — a local cluster, or the one to join
        self.model_path = load_model_path(cfg.model.path)
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        self.tokenizer = get_tokenizer(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

        # The learner role first: its construction order (policy, reference, critic, optimizers) is
        # the random-init order a run's seed fixes.
        self.learner: Learner = build_learner(cfg, tokenizer=self.tokenizer, ckpt=ckpt, out_dir=self.out)
        self.start_step = self.learner.start_step
        self.resumed_from = ckpt

        # The rollout role: the engine (holding the policy's weights) and its collectors.
        self.engine_dtype = engine_dtype(cfg.engine)
        self.rollout = build_rollout(
            cfg,
            engine=engine,
            tokenizer=self.tokenizer,
            model_path=self._engine_model_path(),
            out_dir=self.out,
            generation_config=getattr(self.learner.base_model(), "generation_config", None),
        )
        # Made once the rollout side exists; closed again if the rest of the set-up fails (an
        # unclosed loop is a ResourceWarning whenever the garbage collector finds it later).
        self.loop = asyncio.new_event_loop()
        try:
            # In this process with trainer.backend: local (None on Ray: the engines live in the workers).
            self.engine = getattr(self.rollout, "engine", None)
            self.collector = getattr(self.rollout, "collector", None)
            self.eval_collector = getattr(self.rollout, "eval_collector", None)
            self.pipeline = Pipeline(
                self.rollout,
                self.learner,
                self.request_for,
                pipeline_options(cfg),
                weights_dtype=getattr(torch, self.engine_dtype),
                train_on=self.train_on,
            )
            self.sync_weights()
            self.num_train_tasks = self._count_tasks(cfg.env.train_split)
            self._num_eval_tasks: int | None = None
            self.eval_failures = ""  # the last held-out evaluation's failed episodes, by error (failure_counts)
            # The settings of the held-out evaluation that differ from the first run's (its step-0
            # evaluation is the summary's "before"): the summary says the two are not comparable.
            self.eval_changes: list[str] = []
            if ckpt is not None:
                self.pipeline.load_state_dict(load_pipeline_state(ckpt) or {})
                self.eval_changes = eval_changes(self.out, cfg)
                keep_changed_config(self.out / "config.yaml", cfg, self.start_step)
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
            self.ledger = BatchLedger(self.out, resume_step=self.start_step if ckpt is not None else None)
            for warning in self.metrics.warnings:
                print(f"chatgym: {warning}", file=sys.stderr)
        except BaseException:
            self.loop.close()
            raise

    # ---- one training step ------------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        """One ``sync`` step (0-based ``step``), whatever ``trainer.pipeline`` says: the pipeline's
        sync step (collect -> update -> send weights); returns its log row (:meth:`step_metrics`)."""
        return self.step_metrics(self.loop.run_until_complete(self.pipeline.sync_step(step)))

    def step_metrics(self, result: StepResult) -> dict[str, float]:
        """A step's log row: the rollout metrics of the trajectories the step trained on
        (``timing/rollout_s``: seconds their rollout ran; ``throughput/gen_tokens_per_s``: generated
        tokens per second of it), the pipeline's (the learner's, ``timing/sync_s``, ``timing/step_s``,
        ``staleness/*``, ``pipeline/*``) and ``throughput/gen_tokens_per_step_s`` (generated tokens
        per second of the whole step: what an overlapped pipeline gains) and, on Ray, the rollout
        workers' counters since the previous row, an evaluation run in between included
        (``rollout/worker{i}/*``, ``rollout/pending_max``,
        ``rollout/workers_down``: :meth:`~chatgym.trainer.distributed.ray_rollout.RayRollout.metrics`)."""
        metrics = rollout_metrics(result.trajectories, rollout_s=result.rollout_s)
        number = result.step + 1  # as metrics.jsonl's row, the progress bar and the checkpoint count it
        warning = all_failed(result.trajectories, number)
        self.failed_steps_in_a_row = 0 if warning is None else self.failed_steps_in_a_row + 1
        if warning is not None:
            limit = self.cfg.train.max_failed_steps
            if limit and self.failed_steps_in_a_row >= limit:
                # Going on would log steps and evaluations of a model that never trains (seen on the
                # H200: runs out of GPU memory kept stepping, every episode failed, for 10 steps).
                # The warning is not printed too: the exception's message carries it.
                raise TrainingStalled(
                    f"{self.failed_steps_in_a_row} steps in a row had every episode fail "
                    f"(train.max_failed_steps={limit}); stopping. The last: {warning.removeprefix('chatgym: ')}"
                )
            print(warning, file=sys.stderr)
        partial = some_failed(result.trajectories, number)
        if partial is not None:
            print(partial, file=sys.stderr)
        metrics.update(result.metrics)
        source_metrics = getattr(self.rollout, "metrics", None)  # a local rollout has none
        if source_metrics is not None:
            metrics.update(source_metrics())
        gen_tokens = sum(t.response_tokens for t in result.trajectories)
        metrics["throughput/gen_tokens_per_step_s"] = gen_tokens / max(metrics["timing/step_s"], 1e-9)
        return metrics

    def train_on(self, trajs: list[Trajectory]) -> dict[str, float] | Awaitable[dict[str, float]]:
        """The update of one step's batch (the pipeline calls it): the learner's ``train_on``."""
        return self.learner.train_on(trajs)

    def request_for(self, step: int) -> RolloutRequest:
        """The rollout request of training step ``step`` (0-based): its tasks and seeds are a pure
        function of (seed, step), so a resumed run draws the same batch."""
        cfg = self.cfg
        return RolloutRequest(
            env_id=cfg.env.id,
            tasks=self._train_tasks(step),
            group_size=cfg.train.group_size,
            env_kwargs=self._env_kwargs(eval=False),
            reset_seed=_step_seed(cfg.train.seed, step, 2) % (2**31),
            sampling_seed=_step_seed(cfg.train.seed, step, 1),
            step=step,
        )

    def _train_tasks(self, step: int) -> tuple[Any, ...]:
        cfg = self.cfg
        return tuple(tasks_for_step(step, cfg.train.prompts_per_step, self.num_train_tasks, cfg.train.seed))

    def _env_kwargs(self, *, eval: bool) -> dict[str, Any]:
        return self.cfg.env.make_kwargs(eval=eval)  # what chatgym train checks at start-up

    def collect(self, step: int) -> list[Trajectory]:
        """The trajectories of training step ``step`` (0-based)."""
        return self.loop.run_until_complete(self.rollout.collect(self.request_for(step)))

    def sync_weights(self) -> float:
        """Send each learner's weights (cast to the engine's dtype, tagged with its version) where
        the pipeline's one rule says they are due (:class:`~chatgym.trainer.pipeline.WeightSync`);
        returns the seconds it took."""
        return self.pipeline.sync_weights()

    def evaluate(self, num_tasks: int | None = None) -> dict[str, float]:
        """Score the current policy on the first ``num_tasks`` tasks of the held-out split (one sample
        each at ``env.eval_temperature``): ``eval/score`` (mean reward), ``eval/accuracy`` (share of
        ``Trajectory.success``, where the env defines it)."""
        return self.loop.run_until_complete(self.aevaluate(num_tasks))

    async def aevaluate(self, num_tasks: int | None = None) -> dict[str, float]:
        """:meth:`evaluate` on the running event loop (the overlapped pipelines evaluate while
        their rollouts are in flight)."""
        n = self.cfg.env.eval_tasks if num_tasks is None else num_tasks
        if n <= 0:
            return {}
        if self._num_eval_tasks is None:
            self._num_eval_tasks = self._count_tasks(self.cfg.env.eval_split)
        n = min(n, self._num_eval_tasks)
        t0 = time.perf_counter()
        request = RolloutRequest(
            env_id=self.cfg.env.id,
            tasks=self._eval_tasks(n),
            env_kwargs=self._env_kwargs(eval=True),
            reset_seed=self.cfg.train.seed,
            eval=True,
        )
        trajs = await self.rollout.collect(request)
        ok = [t for t in trajs if not t.failed]
        self.eval_failures = failure_counts(trajs)  # the held-out line's why, when episodes failed
        out = {
            **held_out_scores(trajs),  # a failed episode is a miss, as on the leaderboard
            "eval/failed": len(trajs) - len(ok),
            "eval/response_length": float(np.mean([t.response_tokens for t in ok])) if ok else 0.0,
            "eval/tasks": n,
        }
        out.update(multiturn_metrics(trajs, prefix="eval/"))  # tools, turns, truncation, reward by turns
        out.update(await self._eval_extras(trajs))
        out["timing/eval_s"] = time.perf_counter() - t0
        return out

    def _eval_tasks(self, n: int) -> tuple[Any, ...]:
        return tuple(range(n))

    async def _eval_extras(self, trajs: list[Trajectory]) -> dict[str, float]:
        """More ``eval/*`` metrics of the evaluation episodes (co-training: the other party's)."""
        return {}

    # ---- set-up -------------------------------------------------------------------------------

    def _engine_model_path(self) -> Path:
        """The directory the engine loads: the model's own, or (random init: an architecture the engine
        cannot load by name) the initial policy saved under ``output_dir/init_model``."""
        if not self.cfg.model.random_init:
            return self.model_path
        path = self.out / "init_model"
        # The plain model's names and (for LoRA) merged weights, whatever wraps the policy.
        state = {name: tensor.contiguous() for name, tensor in self.learner.export_weights()}
        self.learner.base_model().save_pretrained(path, state_dict=state, safe_serialization=True)
        # A VLM's processor too: the engine and the collectors read it from this directory.
        processor = getattr(self.learner, "processor", None)
        (processor if processor is not None else self.tokenizer).save_pretrained(path)
        return path

    def _count_tasks(self, split: str) -> int:
        return count_tasks(self.cfg.env, split)

    # ---- the loop -------------------------------------------------------------------------------

    def save(self, steps_done: int) -> Path:
        """Checkpoint the run after ``steps_done`` steps; returns the checkpoint directory."""
        state = self.pipeline.state_dict() or None
        return self.learner.save(self.out, steps_done, config_to_dict(self.cfg), pipeline_state=state)

    def train(self) -> dict[str, Any]:
        """Run from ``start_step`` to ``train.max_steps``; returns the run's summary (also written to
        ``summary.json``). With ``train.gc_freeze`` the objects alive at the start are outside the
        garbage collector until it returns."""
        with frozen_gc(self.cfg.train.gc_freeze):
            return self._train()

    def _train(self) -> dict[str, Any]:
        cfg = self.cfg
        t_run = time.perf_counter()
        start_step = self.start_step
        eval_before = None
        if self.start_step == 0 and cfg.env.eval_tasks:
            if cfg.train.progress:  # it takes a while before the first step's bar appears
                print(f"chatgym: evaluating the held-out split before training (env.eval_tasks {cfg.env.eval_tasks})", file=sys.stderr)
            eval_before = self.evaluate()
            self.metrics.log(0, eval_before)
            if cfg.train.progress:  # shown now: a run stopped early shows it too
                keys = ("eval/score", "eval/accuracy")
                shown = ", ".join(f"{k[5:]} {eval_before[k]:.4f}" for k in keys if k in eval_before)
                if eval_before.get("eval/failed"):  # else a run whose every episode failed reads as a 0 score
                    shown += (f" ({eval_before['eval/failed']} of {eval_before['eval/tasks']} episodes failed, "
                              f"counted as misses: {self.eval_failures})")
                print(f"chatgym: held-out before training: {shown}", file=sys.stderr)
        elif self.start_step > 0:  # resumed: the first run's evaluation, its step-0 row of metrics.jsonl
            eval_before = self.metrics.logged(0)
        bar = _progress(self.start_step, cfg.train.max_steps, cfg.train.progress)
        first, last, checkpoint = self.loop.run_until_complete(self._run_pipeline(bar))
        if bar is not None:
            bar.close()
        if checkpoint is None or not checkpoint.name.endswith(f"{cfg.train.max_steps:06d}"):
            checkpoint = self.save(cfg.train.max_steps)
        eval_after = self.evaluate() if cfg.env.eval_tasks else None
        if eval_after:
            self.metrics.log(cfg.train.max_steps, eval_after)
        curve = self.metrics.plot()
        if self.metrics.draw_errors:  # the run went on; the final curve above is drawn in-process
            errors = self.metrics.draw_errors
            print(f"chatgym: {len(errors)} background redraw(s) of the learning curve failed; the last: "
                  f"{errors[-1]}", file=sys.stderr)
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
            "eval_changes": self.eval_changes,
            **self._summary_extras(),
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _summary_extras(self) -> dict[str, Any]:
        """More entries of ``summary.json`` (co-training: every learner's checkpoint)."""
        return {}

    def _eval_due(self, done: int) -> bool:
        every = self.cfg.env.eval_every
        return bool(every) and done % every == 0 and done < self.cfg.train.max_steps

    def _end_step(self, step: int, metrics: dict[str, float], bar: Any) -> Path | None:
        """Log step ``step``'s metrics, move the bar, save when due; returns the checkpoint written
        (None when none was)."""
        cfg = self.cfg
        done = step + 1
        self.metrics.log(done, metrics)
        self.metrics.plot_later()  # off the step: a redraw takes 0.5-1 s
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                reward=f"{metrics['reward/mean']:.3f}",
                acc=f"{metrics.get('reward/accuracy', float('nan')):.2f}",
                **({"kl": f"{metrics['actor/kl']:.4f}"} if "actor/kl" in metrics else {}),  # none: no reference
                s=f"{metrics['timing/step_s']:.1f}",
            )
        if cfg.train.save_every and done % cfg.train.save_every == 0:
            return self.save(done)  # async: the buffer as it is now, the next batch comes from it
        return None

    async def _run_pipeline(self, bar: Any) -> tuple[Any, Any, Path | None]:
        """The pipeline's steps, logged (:meth:`step_metrics`), evaluated and checkpointed (with
        ``one_step_off`` / ``async`` while its rollouts keep running). Returns (first step's
        metrics, last step's, last checkpoint written)."""
        first = last = checkpoint = None
        async with contextlib.aclosing(self.pipeline.run(self.start_step, self.cfg.train.max_steps)) as steps:
            async for result in steps:
                metrics = self.step_metrics(result)
                if self._eval_due(result.step + 1):
                    metrics.update(await self.aevaluate())
                # Before the checkpoint: a process killed between the two keeps a row its resume drops.
                tasks = {t.group_id: t.task_id for t in reversed(result.trajectories)}
                groups = result.groups or [(result.step, g) for g in sorted(tasks)]
                by_group = [tasks.get(i) for i in range(len(groups))]
                self.ledger.log(result.step + 1, self.learner.version, groups, by_group)
                checkpoint = self._end_step(result.step, metrics, bar) or checkpoint
                first, last = first or metrics, metrics
        return first, last, checkpoint

    def close(self) -> None:
        self._cancel_pending()
        self.loop.run_until_complete(self.rollout.aclose())  # also a separate GenRM judge's engine
        self.metrics.close()
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self.engine.close())
        self.loop.close()
        if hasattr(self.learner, "close"):
            self.learner.close()
        if self.cluster is not None:
            self.cluster.shutdown()

    def _cancel_pending(self) -> None:
        """Cancel, and wait for, the tasks an interrupt (Ctrl-C, SIGTERM) left on the loop: the
        pipeline and its episodes, stopped where the signal found them. Left pending, the next
        ``run_until_complete`` of :meth:`close` ran them on: episodes wrote to the closed trace file and
        the pipeline's generator was closed while it ran."""
        for _ in range(10):  # a task cancelled may leave another to cancel; never loop forever
            pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
            if not pending:
                return
            for task in pending:
                task.cancel()
            # A task that awaited the interrupted one gets the interrupt again: it ends the run once.
            with contextlib.suppress(KeyboardInterrupt):
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


class TrainingStalled(RuntimeError):
    """``train.max_failed_steps`` steps in a row had every episode fail: the run stops, since
    nothing it would log from then on comes from training."""


@contextlib.contextmanager
def frozen_gc(enabled: bool = True) -> Any:
    """Collect once, then keep every object alive now out of the collector's generations
    (``gc.freeze()``) until the block ends (``gc.unfreeze()``).

    Why: a full (generation-2) collection walks every tracked object; with a model, its optimizer, a
    tokenizer and an env's data loaded that took 0.33-0.37 s inside a 1.7 s GPU step
    (``benchmarks/vs_trl_gpu.py --report``). vLLM freezes its heap after start-up for the same reason.
    Frozen objects are still freed by reference counting; only cycles among them wait for the unfreeze.
    """
    if not enabled:
        yield
        return
    theirs = gc.get_freeze_count() > 0  # frozen by the caller: left frozen, as found
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not theirs:
            gc.unfreeze()


def pipeline_options(cfg: Config) -> PipelineOptions:
    """The :class:`~chatgym.trainer.pipeline.PipelineOptions` of ``cfg.trainer``."""
    t = cfg.trainer
    return PipelineOptions(
        mode=t.pipeline,
        max_staleness=t.max_staleness,
        stale=t.stale,
        partial=t.partial_rollout,
        priority=t.buffer_priority,
        buffer_capacity=t.buffer_capacity,
        spill_dir=t.buffer_spill_dir,
    )


def _progress(start: int, total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)
