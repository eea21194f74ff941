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

The loop is :class:`~chatgym.trainer.train.Trainer`'s (its pipeline's sync step, evaluation,
checkpoints and summary); :class:`CoTrainer` changes only the update (both learners), the requests
(the party in the env's keyword arguments) and adds the party's engine to the weight sync. The party's
trajectories and rewards are :mod:`chatgym.trainer.cotrain.party`'s.

The policy's episodes that ended on a judge failure (``info["status"] == "judge_error"``: no
rating, reward 0 that is not the policy's score) are left out of the policy's batch (the judge is
still trained on its malformed replies, with reward 0).

Not here yet: resume from a checkpoint, the Ray backend, pipelines other than ``sync``, a shared
model playing both roles (two models only).
"""

from __future__ import annotations

import argparse
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

import yaml

from chatgym.trainer.config.cotrain import CoTrainConfig, load_cotrain_config, party_config
from chatgym.trainer.config.env import count_tasks
from chatgym.trainer.config.loader import SEED_MAX
from chatgym.trainer.config.run import Config, ConfigError, config_to_dict
from chatgym.trainer.cotrain.calibration import calibration_episodes, calibration_order, first_answers
from chatgym.trainer.cotrain.party import (
    PARTIES,
    REWARDS,
    RewardFn,
    VersionedResponder,
    judge_constant_baseline,
    party_trajectories,
    policy_reference_metrics,
    user_checks,
)
from chatgym.trainer.engines.base import SamplingParams
from chatgym.trainer.learner.checkpoint import CheckpointNotWritten
from chatgym.trainer.logging.step_metrics import rollout_metrics
from chatgym.trainer.pipeline import WeightSync
from chatgym.trainer.rollout.types import Trajectory
from chatgym.trainer.sampler import tasks_for_step
from chatgym.trainer.train import Trainer, TrainingStalled
from chatgym.trainer.train_cli import (
    check_env,
    check_model_and_engine,
    interruption,
    sigterm_unwinds,
    startup_refusal,
)


def _prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


class _EngineTarget:
    """A bare engine as the target of a :class:`~chatgym.trainer.pipeline.WeightSync` (the party
    has no collector of its own: the policy's env calls it)."""

    def __init__(self, engine: Any):
        self.engine = engine

    @property
    def weight_version(self) -> int:
        return int(self.engine.weight_version)

    def set_weights(self, weights: Any, version: int) -> None:
        self.engine.update_weights(weights)
        self.engine.weight_version = int(version)


@dataclass
class _Party:
    learner: Any
    engine: Any
    responder: VersionedResponder
    eval_responder: VersionedResponder


class CoTrainer(Trainer):
    """Co-trains the policy and the party (see the module docstring): the :class:`Trainer` loop whose
    update trains both learners and whose weight sync serves both engines.

    Args:
        config: the policy's run (``model``, ``engine``, ``env``, ``rollout``, ``algo``, ``optim``,
            ``train``); ``env.id`` must take the party (``Judge-v0``: ``judge``, ``UserSim-v0``: ``user``).
        cotrain: the party's settings.
        engine: the policy's engine (None: built from ``config.engine``).
        party_engine: the party's engine (None: built from ``config.engine`` on ``cotrain.model_path``).
        reward_fn: the party's reward (None: :data:`REWARDS` of ``cotrain.party``).

    Raises:
        ConfigError: ``trainer.backend``/``pipeline`` other than local/sync, ``engine.options.sleep_level``,
            or ``model.random_init`` without both engines given.
        FileExistsError: an ``output_dir`` that already holds checkpoints (as ``chatgym train``).
    """

    resumable = False  # no resume argument, no --resume

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
        from chatgym.trainer.models.packaged import load_model_path
        from chatgym.trainer.roles.build import build_learner

        cfg = config
        if cfg.trainer.backend != "local" or cfg.trainer.pipeline != "sync":
            raise ConfigError("trainer: cotrain runs backend 'local' with pipeline 'sync' only")
        if cfg.engine.options.get("sleep_level"):  # the party's engine takes the same options
            raise ConfigError(
                "engine.options.sleep_level: cotrain runs the party's vLLM engine in this process too, and "
                "vLLM's sleep mode (one allocator per process) would put it to sleep with the policy's; leave it 0"
            )
        if cfg.model.random_init and (engine is None or party_engine is None):
            raise ConfigError("model.random_init: cotrain needs both engines given (engine=, party_engine=)")
        self.co = co = cotrain
        if co.calibration:  # the calibration answers' questions: every row of both splits by task_id
            self._judge_rows = judge_rows(config)
        self.kwarg, _ = PARTIES[co.party]
        self.reward_fn = reward_fn or REWARDS[co.party]
        super().__init__(cfg, engine=engine)  # the policy: its learner, engine, collectors, pipeline
        try:
            # The party: its own learner (optimizer, version), engine and responders.
            pcfg = party_config(cfg, co)
            party_path = load_model_path(co.model_path)
            same = Path(party_path) == Path(self.model_path)
            ptok = self.tokenizer if same else get_tokenizer(party_path)
            plearner = build_learner(pcfg, tokenizer=ptok)
            if party_engine is None:
                # Wrapped: train.seed may be SEED_MAX, and vLLM seeds NumPy's legacy generator with it.
                party_seed = (cfg.train.seed + 1) % (SEED_MAX + 1)
                party_engine = build_engine(pcfg.engine, party_path, ptok, party_seed, co.max_model_len)
            party_engine.weight_version = 0
            train_responder = VersionedResponder(
                party_engine,
                ptok,
                params=SamplingParams(max_tokens=co.max_tokens, temperature=co.temperature, stop=co.stop),
                max_prompt_tokens=co.max_prompt_tokens,
                prefill=co.prefill,
            )
            eval_responder = copy.copy(train_responder)  # shares the chat renderer (slow to build)
            eval_responder.params = dataclasses.replace(
                train_responder.params, temperature=cfg.env.eval_temperature
            )
            self.party = _Party(plearner, party_engine, train_responder, eval_responder)
            dtype = getattr(torch, engine_dtype(pcfg.engine))
            self.pipeline.weight_syncs.append(WeightSync(_EngineTarget(party_engine), plearner, dtype))
            self.sync_weights()
            (self.out / "eval_calibration.jsonl").unlink(missing_ok=True)  # a fresh run, as metrics.jsonl
            (self.out / "cotrain.yaml").write_text(yaml.safe_dump(config_to_dict(co), sort_keys=False))
        except BaseException:
            self.close()
            raise

    # ---- what differs from chatgym train: the requests, the update, the checkpoints ---------------

    def _train_tasks(self, step: int) -> tuple[Any, ...]:
        pool = self.co.tasks
        if pool is None:
            return super()._train_tasks(step)
        cfg = self.cfg
        return tuple(pool[i] for i in tasks_for_step(step, cfg.train.prompts_per_step, len(pool), cfg.train.seed))

    def _env_kwargs(self, *, eval: bool) -> dict[str, Any]:
        responder = self.party.eval_responder if eval else self.party.responder
        return {**super()._env_kwargs(eval=eval), self.kwarg: responder}

    def _eval_tasks(self, n: int) -> tuple[Any, ...]:
        picks = self.co.eval_task_ids if self.co.eval_task_ids is not None else range(n)
        return tuple(picks)[:n]

    async def train_on(self, trajs: list[Trajectory]) -> dict[str, float]:  # type: ignore[override]
        """The step's update: score both sides of the episodes (:meth:`score`), then :meth:`update`."""
        policy_trajs, party_trajs, metrics = await self.score(trajs)
        metrics.update(self.update(policy_trajs, party_trajs))
        return metrics

    async def score(self, trajs: list[Trajectory]) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
        """``(policy_trajs, party_trajs, metrics)`` of a step's episodes: the policy's are the episodes
        less those ended by a judge failure; the party's, every party sample scored
        (:func:`~chatgym.trainer.cotrain.party.party_trajectories`) and the calibration samples
        (with ``cotrain.train_on_answers: false``, the calibration samples alone)."""
        party_trajs, metrics = await party_trajectories(trajs, self.co.party, self.reward_fn)
        policy_trajs = [t for t in trajs if t.info.get("status") != "judge_error"]
        metrics["policy/judge_error_episodes"] = len(trajs) - len(policy_trajs)
        if self.co.party == "judge":
            metrics.update(await policy_reference_metrics(trajs))
        else:
            metrics.update(user_checks(trajs))
        if self.co.calibration:
            _, calibration_trajs, calibration_metrics = await self.calibration(trajs, eval=False)
            first = max((t.group_id for t in party_trajs), default=-1) + 1
            for t in calibration_trajs:  # their own groups, after the policy answers' ones
                t.group_id += first
            party_trajs = [*party_trajs, *calibration_trajs] if self.co.train_on_answers else calibration_trajs
            metrics.update(calibration_metrics)
        return policy_trajs, party_trajs, metrics

    async def calibration(
        self, trajs: Sequence[Trajectory], *, eval: bool
    ) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
        """The judge's samples on ``cotrain.calibration`` answers to the tasks of ``trajs``
        (:func:`~chatgym.trainer.cotrain.calibration.calibration_episodes`; ``train.group_size`` samples of
        each in training, one at ``env.eval_temperature`` in evaluation), scored: ``(episodes,
        trajectories, metrics)``, the metrics under ``judge/calibration/``."""
        responder = self.party.eval_responder if eval else self.party.responder
        samples = 1 if eval else self.cfg.train.group_size
        episodes = await calibration_episodes(
            [str(t.task_id) for t in trajs], self.co.calibration, responder, samples=samples,
            tasks=self._judge_rows, env_id=self.cfg.env.id, policy_answers=first_answers(trajs),
            judge_view=self.cfg.env.make_kwargs(eval=eval).get("judge_view", "reply"),
            negative=self.co.calibration_negative,
        )
        scored, metrics = await party_trajectories(episodes, "judge", self.reward_fn)
        if eval:
            metrics.update(await judge_constant_baseline(episodes))
            metrics.update(calibration_order(episodes))
        return episodes, scored, {k.replace("judge/", "judge/calibration/", 1): v for k, v in metrics.items()}

    def rollouts(self, step: int) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
        """Collect step ``step``'s episodes and :meth:`score` them, with the episodes' rollout metrics."""
        t0 = time.perf_counter()
        trajs = self.collect(step)
        metrics = rollout_metrics(trajs, rollout_s=time.perf_counter() - t0)
        policy_trajs, party_trajs, scored = self.loop.run_until_complete(self.score(trajs))
        metrics.update(scored)
        return policy_trajs, party_trajs, metrics

    def update(
        self, policy_trajs: Sequence[Trajectory], party_trajs: Sequence[Trajectory]
    ) -> dict[str, float]:
        """Update each learner on its trajectories (the weights go out in the pipeline's
        :meth:`sync_weights` after it); returns the learners' metrics (``policy/*``, ``<party>/*``),
        versions and timings."""
        party = self.co.party
        metrics: dict[str, float] = {}
        t = time.perf_counter()
        metrics.update(_prefixed("policy", self.learner.train_on(policy_trajs)))
        metrics["timing/policy_update_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if party_trajs:
            metrics.update(_prefixed(party, self.party.learner.train_on(party_trajs)))
        metrics[f"timing/{party}_update_s"] = time.perf_counter() - t
        metrics["policy/version"] = self.learner.version
        metrics[f"{party}/version"] = self.party.learner.version
        return metrics

    async def _eval_extras(self, trajs: list[Trajectory]) -> dict[str, float]:
        """The party's side of the evaluation: ``eval/<party>/*`` and, for a judge,
        ``eval/policy/reference_reward`` and the constant-rating check
        (:func:`~chatgym.trainer.cotrain.party.judge_constant_baseline`)."""
        _, metrics = await party_trajectories(trajs, self.co.party, self.reward_fn)
        if self.co.party == "judge":
            metrics.update(await policy_reference_metrics(trajs, failed_as_miss=True))
            metrics.update(await judge_constant_baseline(trajs))
        else:
            metrics.update(user_checks(trajs))
        if self.co.calibration:
            episodes, _, calibration_metrics = await self.calibration(trajs, eval=True)
            self._write_calibration(episodes)
            metrics.update(calibration_metrics)
        return {f"eval/{k}": v for k, v in metrics.items()}

    def _write_calibration(self, episodes: Sequence[Trajectory]) -> None:
        """One row per held-out calibration sample in ``output_dir/eval_calibration.jsonl``
        (``judge_version``, ``task_id``, ``fraction``, ``rating``, ``reference_rating``), so a
        change between evaluations can be read sample by sample (they rate the same prompts)."""
        with open(self.out / "eval_calibration.jsonl", "a") as f:
            for t in episodes:
                for trace in t.info["judge_traces"]:
                    row = {
                        "judge_version": self.party.learner.version,
                        "task_id": t.task_id,
                        "fraction": trace["calibration"],
                        "rating": trace["rating"],
                        "reference_rating": trace.get("reference_rating"),
                    }
                    f.write(json.dumps(row) + "\n")

    def save(self, steps_done: int) -> Path:
        """Both learners' checkpoints (the party's under ``output_dir/<party>``); returns the policy's."""
        policy = super().save(steps_done)
        party = self.party.learner.save(self.out / self.co.party, steps_done, config_to_dict(self.cfg))
        self._checkpoints = (policy, party)
        return policy

    def _summary_extras(self) -> dict[str, Any]:
        return {"checkpoints": {"policy": str(self._checkpoints[0]), self.co.party: str(self._checkpoints[1])}}

    def close(self) -> None:
        party = getattr(self, "party", None)
        if party is not None:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(party.engine.close())
            if hasattr(party.learner, "close"):
                party.learner.close()
        super().close()


# ---- CLI -------------------------------------------------------------------------------------------


def judge_rows(config: Config) -> dict[str, dict[str, Any]]:
    """Judge-v0's rows of ``env.train_split`` then ``env.eval_split`` (as ``env.kwargs`` build them), by
    ``task_id``: the questions :func:`~chatgym.trainer.cotrain.calibration.calibration_episodes` answers."""
    from chatgym.trainer.rollout.env_runner import build_env

    rows: dict[str, dict[str, Any]] = {}
    for eval in {config.env.train_split: False, config.env.eval_split: True}.values():  # one split: once
        env = build_env(config.env.id, config.env.make_kwargs(eval=eval))
        with contextlib.closing(env):
            rows.update((row["task_id"], row) for row in env.unwrapped.tasks)
    return rows


def check_party_env(config: Config, co: CoTrainConfig) -> None:
    """``chatgym train``'s env check (:func:`~chatgym.trainer.train_cli.check_env`: ``env.kwargs`` and
    each split build), that ``env.id`` takes the party's keyword (``judge=`` / ``user=``), that
    ``cotrain.tasks`` / ``cotrain.eval_task_ids`` are task indices of their splits, and that
    ``cotrain.model_path`` names a model: each would otherwise fail (every episode, or the party's
    load) once the policy had loaded.

    Raises:
        ConfigError: naming ``env.kwargs``, the split's field, ``env.id``, ``cotrain.party``,
            ``cotrain.tasks``, ``cotrain.eval_task_ids`` or ``cotrain.model_path``.
    """
    from chatgym.trainer.models.packaged import load_model_path
    from chatgym.trainer.rollout.env_runner import EnvBuildError, build_env

    check_env(config.env)
    kwarg = PARTIES[co.party][0]
    try:  # None: the env's own default party, so only the keyword is tested
        env = build_env(config.env.id, {**config.env.make_kwargs(eval=False), kwarg: None})
    except EnvBuildError:
        raise ConfigError(
            f"cotrain.party: {co.party!r} answers through the env's {kwarg}= keyword, which env.id "
            f"{config.env.id!r} does not take (Judge-v0 takes judge=, UserSim-v0 user=)"
        ) from None
    with contextlib.closing(env):
        sizes = {config.env.train_split: len(env.unwrapped.tasks)}  # from the env just built
    checks = [("cotrain.tasks", co.tasks, config.env.train_split)]
    if config.env.eval_tasks:
        checks.append(("cotrain.eval_task_ids", co.eval_task_ids, config.env.eval_split))
    for field, ids, split in checks:
        if ids:
            if split not in sizes:  # the eval split, when it is another one
                sizes[split] = count_tasks(config.env, split)
            n = sizes[split]
            if outside := [i for i in ids if not 0 <= i < n]:
                raise ConfigError(f"{field}: {outside} out of range for split {split!r} ({n} tasks: 0..{n - 1})")
    try:
        load_model_path(co.model_path)
    except FileNotFoundError as exc:
        raise ConfigError(f"cotrain.model_path: {exc}") from exc


def main(argv: Sequence[str] | None = None) -> int:
    """``chatgym cotrain CONFIG [key.sub=value ...] [--max-steps N] [--output-dir DIR]``; 0 done, 1 a
    stalled run (train.max_failed_steps), 2 a bad config or a missing package, 130 interrupted
    (Ctrl-C), 143 terminated (SIGTERM; both close the engines first and name the last checkpoints)."""
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
        config, co = load_cotrain_config(args.config, overrides)  # env.id: a registered one
        check_party_env(config, co)
        check_model_and_engine(config)  # before the two models load (the party's is checked by its load)
    except (ConfigError, OSError, yaml.YAMLError, ModuleNotFoundError) as exc:  # ...: check_options imports vLLM
        print(f"chatgym cotrain: {startup_refusal(exc) or exc}", file=sys.stderr)
        return 2
    try:
        trainer = CoTrainer(config, co)
    except (ConfigError, FileExistsError, ModuleNotFoundError) as exc:  # no CUDA, a used output_dir, a package
        print(f"chatgym cotrain: {startup_refusal(exc) or exc}", file=sys.stderr)
        return 2
    try:
        with sigterm_unwinds():
            summary = trainer.train()
    # every episode failed train.max_failed_steps steps in a row / the disk refused a checkpoint
    except (TrainingStalled, CheckpointNotWritten) as exc:
        print(f"chatgym cotrain: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated): a traceback before
        how, status = interruption(exc)
        print(f"\nchatgym cotrain: {how}; {_checkpoints_line(config, co)}", file=sys.stderr)
        return status
    finally:
        trainer.close()
    print(
        json.dumps(
            {k: summary[k] for k in ("output_dir", "eval_before", "eval_after", "checkpoints")}, indent=2
        )
    )
    return 0


def _checkpoints_line(config: Config, co: CoTrainConfig) -> str:
    """Where an interrupted co-training run's last checkpoints are (the policy's, and the party's under
    ``<output_dir>/<party>/``), or that none was saved."""
    from chatgym.trainer.learner.checkpoint import latest_checkpoint

    out = Path(config.train.output_dir)
    found = [str(c) for c in (latest_checkpoint(out), latest_checkpoint(out / co.party)) if c]
    return f"the last checkpoints are {' and '.join(found)}" if found else "no checkpoint was saved yet"


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["CoTrainer", "main"]
