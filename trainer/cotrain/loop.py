"""Co-training: the policy and the other party of its episodes (a judge, a simulated user) learn together.

    chatgym cotrain examples/configs/cotrain_judge_cpu.yaml train.max_steps=3 --output-dir runs/co

``Judge-v0`` and ``UserSim-v0`` talk to a second model through a
:class:`~chatgym.envs.agents.Responder`; an engine-backed one with ``trace=True`` hands each of its
samples back in the env's ``info`` (``judge_traces`` / ``user_traces``: the whole episode's list,
one entry per reply, each with the prompt ids, sampled ids and logprobs). Here that second model is a
policy too: two :class:`~chatgym.trainer.learner.learner.Learner` s (each with its own optimizer state
and weight version), two engines, and one step is

    collect the policy's episodes (the party's engine answers the env)            -> policy trajectories
    turn every party sample of every episode into a Trajectory, score it          -> party trajectories
    policy.train_on(policy trajectories); party.train_on(party trajectories)
    sync each learner's weights to its own engine

Metrics are logged as ``policy/*`` (the policy learner's, plus the episodes' ``reward/*``,
``episode/*``, ... unprefixed as in ``chatgym train``) and ``<party>/*`` (``judge/*`` or ``user/*``).

The party's trajectories and rewards are :mod:`chatgym.trainer.cotrain.party`'s.

The policy's episodes that ended on a judge failure (``info["status"] == "judge_error"``: no
rating, reward 0 that is not the policy's score) are left out of the policy's batch (the judge is
still trained on its malformed replies, with reward 0).

Not here yet: resume from a checkpoint, the Ray backend, pipelines other than ``sync``, a shared
model playing both roles (two models only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from chatgym.trainer.config.cotrain import CoTrainConfig, load_cotrain_config, party_config
from chatgym.trainer.config.run import Config, ConfigError, config_to_dict, save_config
from chatgym.trainer.cotrain.party import (
    PARTIES,
    REWARDS,
    RewardFn,
    VersionedResponder,
    party_trajectories,
    policy_reference_metrics,
)
from chatgym.trainer.engines.base import SamplingParams
from chatgym.trainer.rollout.types import Trajectory


def _step_seed(seed: int, step: int, salt: int) -> int:
    return int(np.random.SeedSequence([seed, step, salt]).generate_state(1)[0])


def _prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


@dataclass
class _Party:
    learner: Any
    engine: Any
    responder: VersionedResponder
    eval_responder: VersionedResponder
    dtype: str


class CoTrainer:
    """Co-trains the policy and the party (see the module docstring).

    Args:
        config: the policy's run (``model``, ``engine``, ``env``, ``rollout``, ``algo``, ``optim``,
            ``train``); ``env.id`` must take the party (``Judge-v0``: ``judge``, ``UserSim-v0``: ``user``).
        cotrain: the party's settings.
        engine: the policy's engine (None: built from ``config.engine``).
        party_engine: the party's engine (None: built from ``config.engine`` on ``cotrain.model_path``).
        reward_fn: the party's reward (None: :data:`REWARDS` of ``cotrain.party``).

    Raises:
        ConfigError: ``trainer.backend``/``pipeline`` other than local/sync, or ``model.random_init``
            without both engines given.
    """

    def __init__(
        self,
        config: Config,
        cotrain: CoTrainConfig,
        *,
        engine: Any = None,
        party_engine: Any = None,
        reward_fn: RewardFn | None = None,
    ):
        import torch

        from chatgym.trainer.chat.tokenizer import get_tokenizer
        from chatgym.trainer.engines import build_engine, engine_dtype
        from chatgym.trainer.logging.writer import MetricsLogger
        from chatgym.trainer.models.packaged import load_model_path
        from chatgym.trainer.roles.build import build_learner, build_local_rollout
        from chatgym.trainer.train import seed_everything

        self.cfg = cfg = config
        self.co = co = cotrain
        if cfg.trainer.backend != "local" or cfg.trainer.pipeline != "sync":
            raise ConfigError("trainer: cotrain runs backend 'local' with pipeline 'sync' only")
        if cfg.model.random_init and (engine is None or party_engine is None):
            raise ConfigError("model.random_init: cotrain needs both engines given (engine=, party_engine=)")
        self.out = Path(cfg.train.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        seed_everything(cfg.train.seed)
        self.kwarg, _ = PARTIES[co.party]
        self.reward_fn = reward_fn or REWARDS[co.party]
        self.loop = asyncio.new_event_loop()

        # The policy: its learner, then its engine and collectors (as chatgym train builds them).
        model_path = load_model_path(cfg.model.path)
        self.tokenizer = get_tokenizer(model_path)
        self.learner = build_learner(cfg, tokenizer=self.tokenizer)
        self.rollout = build_local_rollout(
            cfg, engine=engine, tokenizer=self.tokenizer, model_path=model_path, out_dir=self.out
        )
        self.engine_dtype = engine_dtype(cfg.engine)

        # The party: its own learner (optimizer, version), engine and responders.
        pcfg = party_config(cfg, co)
        party_path = load_model_path(co.model_path)
        ptok = self.tokenizer if Path(party_path) == Path(model_path) else get_tokenizer(party_path)
        plearner = build_learner(pcfg, tokenizer=ptok)
        if party_engine is None:
            party_engine = build_engine(pcfg.engine, party_path, ptok, cfg.train.seed + 1, co.max_model_len)
        party_engine.weight_version = 0

        train_responder = VersionedResponder(
            party_engine,
            ptok,
            params=SamplingParams(max_tokens=co.max_tokens, temperature=co.temperature),
            max_prompt_tokens=co.max_prompt_tokens,
            prefill=co.prefill,
        )
        eval_responder = copy.copy(train_responder)  # shares the chat renderer (slow to build)
        eval_responder.params = dataclasses.replace(
            train_responder.params, temperature=cfg.env.eval_temperature
        )
        self.party = _Party(plearner, party_engine, train_responder, eval_responder, self.engine_dtype)
        self._torch = torch
        self.sync_weights()
        self.num_train_tasks = self._count_tasks(cfg.env.train_split)
        save_config(cfg, self.out / "config.yaml")
        (self.out / "cotrain.yaml").write_text(yaml.safe_dump(config_to_dict(co), sort_keys=False))
        self.metrics = MetricsLogger(
            self.out, tensorboard=cfg.train.tensorboard, wandb=False, run_config=config_to_dict(cfg)
        )

    # ---- one step --------------------------------------------------------------------------

    def request_for(self, step: int, *, eval: bool = False, num_tasks: int | None = None) -> Any:
        """The step's rollout request (tasks and seeds a pure function of (seed, step), as in
        ``chatgym train``), with the party's responder in the env's keyword arguments."""
        from chatgym.trainer.rollout.source import RolloutRequest
        from chatgym.trainer.sampler import tasks_for_step

        cfg = self.cfg
        if eval:
            split, responder = cfg.env.eval_split, self.party.eval_responder
            picks = self.co.eval_task_ids if self.co.eval_task_ids is not None else range(num_tasks or 0)
            tasks = tuple(picks)[: num_tasks or 0]
            return RolloutRequest(
                cfg.env.id,
                tasks,
                1,
                {"split": split, **cfg.env.kwargs, self.kwarg: responder},
                reset_seed=cfg.train.seed,
                eval=True,
                step=step,
            )
        pool = self.co.tasks
        n = len(pool) if pool is not None else self.num_train_tasks
        picks = tasks_for_step(step, cfg.train.prompts_per_step, n, cfg.train.seed)
        tasks = tuple(pool[i] for i in picks) if pool is not None else tuple(picks)
        return RolloutRequest(
            cfg.env.id,
            tasks,
            cfg.train.group_size,
            {"split": cfg.env.train_split, **cfg.env.kwargs, self.kwarg: self.party.responder},
            reset_seed=_step_seed(cfg.train.seed, step, 2) % (2**31),
            sampling_seed=_step_seed(cfg.train.seed, step, 1),
            step=step,
        )

    def rollouts(self, step: int) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
        """Collect step ``step``'s episodes and score both sides: ``(policy_trajs, party_trajs,
        metrics)``; the policy's are the episodes less those ended by a judge failure."""
        from chatgym.trainer.logging.step_metrics import rollout_metrics

        t0 = time.perf_counter()
        trajs = self.loop.run_until_complete(self.rollout.collect(self.request_for(step)))
        metrics = rollout_metrics(trajs, rollout_s=time.perf_counter() - t0)
        party_trajs, party_metrics = self.loop.run_until_complete(
            party_trajectories(trajs, self.co.party, self.reward_fn)
        )
        metrics.update(party_metrics)
        metrics["policy/reward_mean"] = metrics["reward/mean"]
        policy_trajs = [t for t in trajs if t.info.get("status") != "judge_error"]
        metrics["policy/judge_error_episodes"] = len(trajs) - len(policy_trajs)
        if self.co.party == "judge":
            metrics.update(self.loop.run_until_complete(policy_reference_metrics(trajs)))
        return policy_trajs, party_trajs, metrics

    def update(
        self, policy_trajs: Sequence[Trajectory], party_trajs: Sequence[Trajectory]
    ) -> dict[str, float]:
        """Update each learner on its trajectories, then sync each engine; returns the learners'
        metrics (``policy/*``, ``<party>/*``), versions and timings."""
        party = self.co.party
        metrics: dict[str, float] = {}
        t = time.perf_counter()
        metrics.update(_prefixed("policy", self.learner.train_on(policy_trajs)))
        metrics["timing/policy_update_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if party_trajs:
            metrics.update(_prefixed(party, self.party.learner.train_on(party_trajs)))
        metrics[f"timing/{party}_update_s"] = time.perf_counter() - t
        metrics["timing/sync_s"] = self.sync_weights()
        metrics["policy/version"] = self.learner.version
        metrics[f"{party}/version"] = self.party.learner.version
        return metrics

    def step(self, step: int) -> dict[str, float]:
        """Collect, score both sides, update both learners, sync both engines; returns the metrics."""
        t0 = time.perf_counter()
        policy_trajs, party_trajs, metrics = self.rollouts(step)
        metrics.update(self.update(policy_trajs, party_trajs))
        metrics["timing/step_s"] = time.perf_counter() - t0
        return metrics

    def sync_weights(self) -> float:
        """Each learner's weights to its own engine, tagged with its version; returns seconds."""
        dtype = getattr(self._torch, self.engine_dtype)
        t0 = time.perf_counter()
        if self.rollout.weight_version != self.learner.version or self.learner.version == 0:
            self.rollout.set_weights(self.learner.export_weights(dtype), self.learner.version)
        party = self.party
        if getattr(party.engine, "weight_version", -1) != party.learner.version or party.learner.version == 0:
            party.engine.update_weights(party.learner.export_weights(getattr(self._torch, party.dtype)))
            party.engine.weight_version = party.learner.version
        return time.perf_counter() - t0

    def evaluate(self, num_tasks: int | None = None) -> dict[str, float]:
        """Both sides on the first ``num_tasks`` tasks of ``env.eval_split`` (of
        ``cotrain.eval_task_ids`` when set; one episode each, the party at ``env.eval_temperature``): ``eval/reward`` (the policy's, as the party scored it),
        ``eval/<party>/reward_mean`` and, for a judge, ``eval/policy/reference_reward``."""
        n = self.cfg.env.eval_tasks if num_tasks is None else num_tasks
        if n <= 0:
            return {}
        n = min(n, self._count_tasks(self.cfg.env.eval_split))
        t0 = time.perf_counter()
        trajs = self.loop.run_until_complete(
            self.rollout.collect(self.request_for(0, eval=True, num_tasks=n))
        )
        _, party_metrics = self.loop.run_until_complete(
            party_trajectories(trajs, self.co.party, self.reward_fn)
        )
        ok = [t for t in trajs if not t.failed]
        out = {
            "eval/reward": float(np.mean([t.reward for t in ok])) if ok else 0.0,
            "eval/failed": len(trajs) - len(ok),
            "eval/tasks": n,
            **{f"eval/{k}": v for k, v in party_metrics.items()},
        }
        if self.co.party == "judge":
            reference = self.loop.run_until_complete(policy_reference_metrics(trajs))
            out.update({f"eval/{k}": v for k, v in reference.items()})
        out["timing/eval_s"] = time.perf_counter() - t0
        return out

    def train(self) -> dict[str, Any]:
        """``train.max_steps`` steps (evaluations before and after when ``env.eval_tasks``); returns
        the summary (also ``summary.json``); checkpoints of both sides at the end."""
        cfg = self.cfg
        t_run = time.perf_counter()
        before = self.evaluate() if cfg.env.eval_tasks else None
        if before:
            self.metrics.log(0, before)
        rows = []
        for step in range(cfg.train.max_steps):
            metrics = self.step(step)
            self.metrics.log(step + 1, metrics)
            rows.append(metrics)
            if cfg.train.progress:
                print(
                    f"cotrain step {step + 1}/{cfg.train.max_steps}: reward {metrics['reward/mean']:.3f} "
                    f"{self.co.party} {metrics[f'{self.co.party}/reward_mean']:.3f} "
                    f"{metrics['timing/step_s']:.1f}s",
                    file=sys.stderr,
                )
        after = self.evaluate() if cfg.env.eval_tasks else None
        if after:
            self.metrics.log(cfg.train.max_steps, after)
        config = config_to_dict(cfg)
        policy_ckpt = self.learner.save(self.out, cfg.train.max_steps, config)
        party_ckpt = self.party.learner.save(self.out / self.co.party, cfg.train.max_steps, config)
        summary = {
            "output_dir": str(self.out),
            "steps": cfg.train.max_steps,
            "wall_s": time.perf_counter() - t_run,
            "eval_before": before,
            "eval_after": after,
            "first_step": rows[0] if rows else None,
            "last_step": rows[-1] if rows else None,
            "checkpoints": {"policy": str(policy_ckpt), self.co.party: str(party_ckpt)},
            "metrics": str(self.metrics.path),
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        return summary

    def _count_tasks(self, split: str) -> int:
        from chatgym.trainer.train import count_tasks

        return count_tasks(self.cfg.env, split)

    def close(self) -> None:
        self.loop.run_until_complete(self.rollout.aclose())  # also a separate GenRM judge's engine
        self.metrics.close()
        for engine in (self.rollout.engine, self.party.engine):
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(engine.close())
        self.loop.close()


# ---- CLI -------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``chatgym cotrain CONFIG [key.sub=value ...] [--max-steps N] [--output-dir DIR]``; 0 done, 2 a bad config."""
    parser = argparse.ArgumentParser(
        prog="chatgym cotrain", description="Co-train a policy and its judge / simulated user."
    )
    parser.add_argument(
        "config", help="YAML config with a cotrain: section (examples/configs/cotrain_*.yaml)"
    )
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. cotrain.lr=1e-5")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--output-dir")
    args = parser.parse_intermixed_args(argv)
    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.output_dir is not None:
        overrides.append(f"train.output_dir={args.output_dir}")
    try:
        config, co = load_cotrain_config(args.config, overrides)
    except (ConfigError, OSError, yaml.YAMLError) as exc:
        print(f"chatgym cotrain: {exc}", file=sys.stderr)
        return 2
    trainer = CoTrainer(config, co)
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    print(
        json.dumps(
            {k: summary[k] for k in ("output_dir", "eval_before", "eval_after", "checkpoints")}, indent=2
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["CoTrainer", "main"]
