"""Co-training: the policy and the other party of its episodes (a judge, a simulated user) learn together.

    chatgym cotrain examples/configs/cotrain_judge_cpu.yaml train.max_steps=3 --output-dir runs/co

``Judge-v0`` and ``UserSim-v0`` talk to a second model through a
:class:`~chatgym.envs.agents.Responder`; an engine-backed one with ``trace=True`` hands each of its
samples back in the env's ``info`` (``judge_traces`` / ``user_traces``: the whole episode's list,
one entry per reply, each with the prompt ids, sampled ids and logprobs). Here that second model is a
policy too: two :class:`~chatgym.trainer.learner.role.Learner` s (each with its own optimizer state
and weight version), two engines, and one step is

    collect the policy's episodes (the party's engine answers the env)            -> policy trajectories
    turn every party sample of every episode into a Trajectory, score it          -> party trajectories
    policy.train_on(policy trajectories); party.train_on(party trajectories)
    sync each learner's weights to its own engine

Metrics are logged as ``policy/*`` (the policy learner's, plus the episodes' ``reward/*``,
``episode/*``, ... unprefixed as in ``chatgym train``) and ``<party>/*`` (``judge/*`` or ``user/*``).

**The party's trajectory** (:func:`trace_trajectory`) is token-exact: ``prompt_ids`` (loss mask 0)
then the ids its engine sampled (loss mask 1, their logprobs), one turn, its reward on the last
sampled token. Its group (the GRPO baseline) is the policy episode's group and the party's turn in
it (``question_turn`` for a judge, the reply's index for a user): the party's samples that answered
the same task at the same point of the dialogue.

**The party's reward** (a party sample with no reward, ``None``, is not trained on):

- ``judge``: agreement with a reference rating, ``1 - |r - r_ref| / 9`` for a parsed rating ``r``
  (MT-bench's ``[[r]]``, 1..10), 0 for a reply with no valid rating. ``r_ref`` is the rating the
  rule-based :class:`~chatgym.envs.judge.ReferenceF1Judge` gives the same rubric prompt
  (``1 + round(9 * F1)`` of the judged answer against MT-bench's reference answer), so only prompts
  with a reference answer are scored (use ``split: reference``).
- ``user``: faithfulness to the scenario (:func:`faithfulness`): a user may state only facts its
  instructions or the dialogue gave it, and should state the ones it knows. Facts are the
  identifier-like tokens (a digit, ``_`` or ``@`` in them: user ids, reservation/order codes,
  e-mails, amounts). For a reply: ``grounded`` = share of the facts it states that occur in its own
  view (scenario + dialogue so far; 1 when it states none), ``coverage`` = share of the scenario's
  ``Known info`` facts the user stated in any reply of the episode (1 when there are none); reward
  = ``0.5 * grounded + 0.5 * coverage``.

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
import re
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from .config import Config, ConfigError, check_env_id, config_to_dict, save_config
from .config_io import apply_overrides, from_dict
from .engines.base import SamplingParams
from .engines.responder import EngineResponder
from .rollout.types import Trajectory

# The env keyword argument the party is passed as, and the info key its samples come back under.
PARTIES = {"judge": ("judge", "judge_traces"), "user": ("user", "user_traces")}


@dataclass(frozen=True)
class CoTrainConfig:
    """The ``cotrain:`` section: the second party and how it learns.

    Attributes:
        party: ``judge`` (``Judge-v0``: the env's ``judge=``) or ``user`` (``UserSim-v0``: ``user=``).
        model_path: the party's model (a packaged name such as ``smollm2`` or a local directory).
        lr: the party's learning rate (its own optimizer; the rest of ``optim`` is shared).
        kl_coef: the party's ``algo.kl_coef`` (0: no reference model for it).
        max_tokens: tokens per party reply (also its learner's ``max_response_tokens``).
        temperature: the party's sampling temperature in training (evaluation uses
            ``env.eval_temperature``).
        max_prompt_tokens: a party prompt longer than this is refused (``ValueError`` in the env:
            that episode fails); None: no check.
        max_model_len: the party engine's context length (tokens).
        tasks: train only on these task indices of ``env.train_split`` (None: all).
        prefill: text every party reply starts with, given as prompt tokens (not trained on):
            ``"Rating: [["`` makes a 135M judge write a parseable MT-bench rating (without it
            SmolLM2-135M-Instruct wrote no ``[[r]]`` at all: parse rate 0, nothing to learn from).
        eval_task_ids: evaluate on these task indices of ``env.eval_split`` (the first
            ``env.eval_tasks`` of them); None: its first ``env.eval_tasks`` tasks.
    """

    party: Literal["judge", "user"] = "judge"
    model_path: str = "smollm2"
    lr: float = 1e-6
    kl_coef: float = 0.0
    max_tokens: int = 128
    temperature: float = 1.0
    max_prompt_tokens: int | None = None
    max_model_len: int = 4096
    tasks: tuple[int, ...] | None = None
    prefill: str = ""
    eval_task_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.max_tokens < 1 or self.max_model_len < 1:
            raise ValueError("max_tokens and max_model_len must be >= 1")
        if self.tasks is not None and not self.tasks:
            raise ValueError("tasks must be None or non-empty")


def load_cotrain_config(
    path: str | Path | None, overrides: Sequence[str] = ()
) -> tuple[Config, CoTrainConfig]:
    """A co-training YAML: the sections of ``chatgym train``'s config plus ``cotrain:``.

    Overrides may address either (``cotrain.lr=1e-5``, ``train.max_steps=2``).

    Raises:
        ConfigError: as :func:`chatgym.trainer.config.load_config`, with the dotted field name.
        FileNotFoundError: ``path`` does not exist.
    """
    data: Any = yaml.safe_load(Path(path).read_text()) if path is not None else {}
    if not isinstance(data or {}, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    data = apply_overrides(dict(data or {}), overrides)
    section = data.pop("cotrain", None) or {}
    if not isinstance(section, dict):
        raise ConfigError("cotrain: must be a mapping")
    config = from_dict(Config, data)
    check_env_id(config.env)
    return config, from_dict(CoTrainConfig, section, prefix="cotrain")


def party_config(cfg: Config, co: CoTrainConfig) -> Config:
    """The party learner's :class:`Config`: the policy's with the party's model, lr, KL and budget."""
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, path=co.model_path, random_init=cfg.model.random_init),
        optim=dataclasses.replace(cfg.optim, lr=co.lr),
        algo=dataclasses.replace(cfg.algo, kl_coef=co.kl_coef),
        rollout=dataclasses.replace(cfg.rollout, max_response_tokens=co.max_tokens, max_tokens=co.max_tokens),
    )


# ---- the party's samples as trajectories ----------------------------------------------------------


class VersionedResponder(EngineResponder):
    """:class:`EngineResponder` (``trace=True``) whose traces also name the engine's
    ``weight_version`` when the reply was requested (the party learner's version that sampled it).

    Args:
        prefill: text the reply starts with, sent to the engine as prompt tokens after the assistant
            header (so loss mask 0 in the party's trajectory); the returned message is ``prefill`` +
            the sampled text. ``"Rating: [["`` makes a small judge answer in MT-bench's format.
        engine, tokenizer, kwargs: as :class:`EngineResponder`.
    """

    def __init__(self, engine: Any, tokenizer: Any = None, *, prefill: str = "", **kwargs: Any):
        super().__init__(engine, tokenizer, trace=True, **kwargs)
        self.prefill = prefill
        if prefill:
            self.renderer = _Prefilled(
                self.renderer, self.tokenizer.encode(prefill, add_special_tokens=False)
            )

    async def respond_with_trace(self, messages: list[Any]) -> tuple[Any, dict[str, Any] | None]:
        version = int(getattr(self.engine, "weight_version", 0))
        message, trace = await super().respond_with_trace(messages)
        if self.prefill:
            message = {"role": "assistant", "content": self.prefill + message["content"]}
        if trace is not None:
            trace.update(weight_version=version, text=message["content"], prefill=self.prefill)
        return message, trace


class _Prefilled:
    """A chat renderer whose prompts end with fixed ids (the reply's prefill)."""

    def __init__(self, renderer: Any, ids: list[int]):
        self.renderer = renderer
        self.ids = list(ids)

    def prompt_ids(self, messages: list[Any]) -> list[int]:
        return [*self.renderer.prompt_ids(messages), *self.ids]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.renderer, name)


def trace_trajectory(
    trace: dict[str, Any], reward: float, *, env_id: str, task_id: Any, group_id: int, sample_index: int
) -> Trajectory:
    """One party sample (an ``EngineResponder`` trace) as a one-turn :class:`Trajectory`.

    ``token_ids`` = ``prompt_ids + token_ids`` of the trace; ``loss_mask`` 0 on the prompt, 1 on the
    sampled ids; ``engine_logprobs`` 0.0 on the prompt, the trace's logprobs after;
    ``weight_versions`` -1 on the prompt, the trace's ``weight_version`` (default 0) after.

    Raises:
        ValueError: the trace has no ids, or its logprobs do not match its sampled ids 1:1 (a
            responder built without ``trace=True`` logprobs).
    """
    prompt = [int(i) for i in trace["prompt_ids"]]
    ids = [int(i) for i in trace["token_ids"]]
    logprobs = [float(x) for x in trace.get("logprobs") or []]
    if not ids or len(logprobs) != len(ids):
        raise ValueError(
            f"party trace of {task_id!r} has {len(ids)} sampled ids and {len(logprobs)} logprobs; "
            "a trained party needs both, 1:1 (EngineResponder(trace=True))"
        )
    n = len(prompt)
    finish = str(trace.get("finish_reason") or "stop")
    return Trajectory(
        env_id=env_id,
        task_id=task_id,
        group_id=group_id,
        sample_index=sample_index,
        token_ids=prompt + ids,
        loss_mask=[0] * n + [1] * len(ids),
        engine_logprobs=[0.0] * n + logprobs,
        weight_versions=[-1] * n + [int(trace.get("weight_version", 0))] * len(ids),
        prompt_len=n,
        rewards=[float(reward)],
        reward=float(reward),
        finish_reasons=[finish],
        stop_reasons=[trace.get("stop_reason")],
        terminated=finish == "stop",
        truncated=finish != "stop",
        messages=[*trace.get("messages", []), {"role": "assistant", "content": trace.get("text", "")}],
        info={"party_reward": float(reward)},
    )


RewardFn = Callable[[list[dict[str, Any]]], Awaitable[list[float | None]]]


async def party_trajectories(
    trajs: Sequence[Trajectory], party: str, reward_fn: RewardFn
) -> tuple[list[Trajectory], dict[str, float]]:
    """Every party sample of every episode of ``trajs`` as a scored trajectory, plus metrics.

    The samples of an episode are read from the LAST step's ``info[<party>_traces]``, which the envs
    keep whole (every reply of the episode so far), so no turn's sample is lost. Failed episodes
    (env crash, timeout) give none. Groups: (policy group, ``question_turn`` or reply index).

    Returns:
        ``(trajectories, metrics)``: metrics ``<party>/reward_mean``, ``<party>/samples``,
        ``<party>/unscored`` (samples with no reward) and, for a judge, ``judge/parse_rate``.
    """
    key = PARTIES[party][1]
    out: list[Trajectory] = []
    groups: dict[tuple[int, int], int] = {}
    sizes: dict[int, int] = {}
    unscored = parsed = total = 0
    for t in trajs:
        if t.failed:
            continue
        traces = list(t.info.get(key) or [])
        rewards = await reward_fn(traces)
        for i, (trace, reward) in enumerate(zip(traces, rewards, strict=True)):
            total += 1
            parsed += trace.get("rating") is not None
            if reward is None:
                unscored += 1
                continue
            gid = groups.setdefault((t.group_id, int(trace.get("question_turn", i))), len(groups))
            index = sizes[gid] = sizes.get(gid, -1) + 1
            out.append(
                trace_trajectory(
                    trace, reward, env_id=t.env_id, task_id=t.task_id, group_id=gid, sample_index=index
                )
            )
    metrics = {
        f"{party}/reward_mean": float(np.mean([x.reward for x in out])) if out else 0.0,
        f"{party}/samples": total,
        f"{party}/unscored": unscored,
    }
    if party == "judge":
        metrics["judge/parse_rate"] = parsed / total if total else 0.0
    return out, metrics


# ---- the party's rewards ---------------------------------------------------------------------------


async def reference_rating(messages: list[dict[str, Any]]) -> float | None:
    """The rule-based reference judge's rating of a judge prompt (``ReferenceF1Judge``), or None when
    the prompt has no reference answer."""
    from chatgym.envs.judge import ReferenceF1Judge, parse_rating

    reply = await ReferenceF1Judge().respond(list(messages))
    return parse_rating(reply["content"])[0]


async def judge_agreement(traces: list[dict[str, Any]]) -> list[float | None]:
    """Per judge sample: ``1 - |rating - reference| / 9``; 0.0 when the sample has no valid rating;
    None when the prompt has no reference rating (not trained on)."""
    out: list[float | None] = []
    for trace in traces:
        ref = await reference_rating(trace.get("messages", []))
        rating = trace.get("rating")
        if ref is None:
            out.append(None)
        elif rating is None:
            out.append(0.0)
        else:
            out.append(1.0 - abs(float(rating) - ref) / 9.0)
    return out


# An identifier-like token: letters/digits/_/@/./-/# with at least one digit, '_' or '@' in it.
_TOKEN = re.compile(r"[A-Za-z0-9_@#.\-]+")
_KNOWN = re.compile(r"Known info:\n(.*?)(?:\n(?:Unknown info|Task instructions):|\n</scenario>|$)", re.S)


def facts(text: str) -> set[str]:
    """The identifier-like tokens of ``text``, lower-cased, end punctuation stripped: those with a
    digit, ``_`` or ``@`` (user ids, reservation/order codes, e-mails, amounts)."""
    out = set()
    for raw in _TOKEN.findall(text):
        tok = raw.strip(".-#").lower()
        if tok and any(c.isdigit() or c in "_@" for c in tok):
            out.add(tok)
    return out


def known_facts(messages: list[dict[str, Any]]) -> set[str]:
    """The facts of the scenario's ``Known info`` in a simulated user's system prompt."""
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    found = _KNOWN.search(system)
    return facts(found.group(1)) if found else set()


def faithfulness(traces: list[dict[str, Any]]) -> list[float]:
    """Per simulated-user reply of one episode: ``0.5 * grounded + 0.5 * coverage`` (module docstring)."""
    stated_all: set[str] = set()
    for trace in traces:
        stated_all |= facts(trace.get("text", ""))
    known = known_facts(traces[0].get("messages", [])) if traces else set()
    coverage = len(known & stated_all) / len(known) if known else 1.0
    out = []
    for trace in traces:
        stated = facts(trace.get("text", ""))
        seen: set[str] = set()
        for m in trace.get("messages", []):
            seen |= facts(m.get("content") or "")
        grounded = len(stated & seen) / len(stated) if stated else 1.0
        out.append(0.5 * grounded + 0.5 * coverage)
    return out


async def _faithfulness(traces: list[dict[str, Any]]) -> list[float | None]:
    return list(faithfulness(traces))


REWARDS: dict[str, RewardFn] = {"judge": judge_agreement, "user": _faithfulness}


# ---- the driver ----------------------------------------------------------------------------------


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

        from .engines import build_engine, engine_dtype
        from .metrics import MetricsLogger
        from .models import load_model_path
        from .roles import build_learner, build_local_rollout
        from .rollout.tokenizer import get_tokenizer
        from .train import seed_everything

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
        from .rollout.source import RolloutRequest
        from .sampler import tasks_for_step

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
        from .step_metrics import rollout_metrics

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
        import gymnasium as gym

        import chatgym  # noqa: F401  (registers the env ids)

        env = gym.make(self.cfg.env.id, split=split, **self.cfg.env.kwargs)
        try:
            return len(env.unwrapped.tasks)
        finally:
            env.close()

    def close(self) -> None:
        self.rollout.close()
        self.metrics.close()
        for engine in (self.rollout.engine, self.party.engine):
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(engine.close())
        self.loop.close()


async def policy_reference_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """``policy/reference_reward``: the policy's Judge-v0 return had the rule-based reference judge
    rated it (the reference rating of each question turn's last judge sample, ``(r - 1) / 9 /
    n_turns`` summed over the question turns judged) — a fixed yardstick while the co-trained judge
    moves. Mean over the episodes whose judged turns all have a reference rating."""
    values = []
    for t in trajs:
        traces = t.info.get("judge_traces") or []
        if t.failed or not traces:
            continue
        last = {int(trace.get("question_turn", 0)): trace for trace in traces}  # later samples win
        n = len(t.info.get("ratings") or []) or len(last)
        refs = [await reference_rating(trace.get("messages", [])) for trace in last.values()]
        if all(r is not None for r in refs):
            values.append(sum((r - 1.0) / 9.0 / n for r in refs))
    return {"policy/reference_reward": float(np.mean(values))} if values else {}


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


__all__ = [
    "CoTrainConfig",
    "CoTrainer",
    "facts",
    "faithfulness",
    "judge_agreement",
    "load_cotrain_config",
    "party_trajectories",
    "trace_trajectory",
]
