"""``trainer.rollout_source: gateway``: the trajectories of a step come from the user's agent program.

    rollout = build_gateway_rollout(cfg, engine, tokenizer, out_dir=out, generation_config=gc)
    trajs = await rollout.collect(RolloutRequest("Math-v0", tasks=(3, 17), group_size=8))

For each episode ``(g, s)`` of a request (task ``tasks[g]``, sample ``s``), :class:`GatewayCollector`:

1. makes the env and resets it on the task with the collector's seed rule (group ``g`` resets with
   ``reset_seed + g``), which gives the task the agent sees (``task`` below);
2. opens a gateway session (``group_id=g, sample_index=s``; the session's sampling seeds derive from
   ``(sampling_seed, g, s, turn)`` as the collector's do);
3. runs one copy of the agent program with the gateway's ``base_url`` and the session id as its API
   key (:mod:`chatgym.trainer.gateway.program`), at most ``trainer.gateway.concurrency`` at once,
   each under ``rollout.episode_timeout_s``;
4. ends the session and books the reward on its trajectories: ``reward: program`` — the program's
   return value / last stdout line, else what it POSTed, else 0.0 with ``info["reward_missing"]``;
   ``reward: env`` — the session's last assistant reply given to the env (reset on the same task) as
   its answer: that step's reward and ``info["success"]`` (the env's exact scorer).

``task`` (a JSON-able dict): ``task_id``, ``prompt`` (the text of the env's last opening message, the
question), ``messages`` (the env's opening messages: its system prompt and the question), ``tools``
(the env's tool schemas; the agent may bring its own instead), ``row`` (the task row, answer
included, for programs that score themselves), ``env_id``, ``group_id``, ``sample_index``.

**Segments.** A session whose history the agent rewrote is several segments, one trajectory each
(``info["segment"]`` k of ``info["segments"]``). With ``segments: all`` each is a trajectory of the
session's GRPO group (same ``group_id`` and ``sample_index``, the session's reward on every one: a
session of k segments weighs k times in its group's mean); ``segments: last`` keeps only the last.
Trajectories come back in (group, sample, segment) order.

**Failures.** A program that raises (a command that exits non-zero), times out, reports a reward that
is not a number, or made no request fails its episode only: one trajectory with ``error`` set
(``info["error_kind"]`` ``agent_error``, ``timeout``, ``no_requests``, ``env_error``), carrying what
the session recorded (its last segment), so the learner skips it and the batch goes on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from chatgym.trainer.gateway import Gateway
from chatgym.trainer.gateway.program import AgentProgram, ProgramError
from chatgym.trainer.rollout.collector import summarize
from chatgym.trainer.rollout.config import RolloutConfig
from chatgym.trainer.rollout.env_runner import EnvRunner, EnvSource, env_name, make_env
from chatgym.trainer.rollout.episode import EpisodeFailure, env_call, fail, record_step
from chatgym.trainer.rollout.source import LocalRollout
from chatgym.trainer.rollout.trace import TraceWriter
from chatgym.trainer.rollout.types import Trajectory


def task_options(task: Any, i: int) -> dict[str, Any]:
    """``reset`` options of task ``i``: ``{"task_index": n}`` for an int, ``{"task": row}`` for a row.

    Raises:
        TypeError: neither an int nor a mapping.
    """
    if isinstance(task, bool) or not isinstance(task, (int, Mapping)):
        raise TypeError(f"tasks[{i}] must be a task index (int) or a task row (dict), got {task!r:.100}")
    return {"task_index": task} if isinstance(task, int) else {"task": dict(task)}


@dataclass
class _Episode:
    env: EnvSource
    options: dict[str, Any]
    seed: int | None
    group_id: int
    sample_index: int
    sampling_seed: int | None


class GatewayCollector:
    """Runs a request's episodes as agent-program sessions on a gateway; the collector's interface.

    Args:
        gateway: a :class:`chatgym.trainer.gateway.Gateway` (started on the first ``collect``).
        program: the :class:`~chatgym.trainer.gateway.program.AgentProgram`.
        config: the rollout settings (``seed``: base of the sampling seeds; ``episode_timeout_s``: per
            program run; ``env_threads``: the env pool).
        reward: ``program`` or ``env`` (see the module docstring).
        concurrency: programs running at once.
        segments: ``all`` or ``last``.
    """

    def __init__(
        self,
        gateway: Any,
        program: AgentProgram,
        config: RolloutConfig,
        *,
        reward: str = "program",
        concurrency: int = 32,
        segments: str = "all",
    ):
        if reward not in ("program", "env"):
            raise ValueError(f"reward must be 'program' or 'env', got {reward!r}")
        if segments not in ("all", "last"):
            raise ValueError(f"segments must be 'all' or 'last', got {segments!r}")
        self.gateway = gateway
        self.program = program
        self.config = config
        self.reward = reward
        self.concurrency = concurrency
        self.segments = segments
        self.pool = ThreadPoolExecutor(config.env_threads, thread_name_prefix="chatgym-gw-env")
        self.base_url: str | None = None
        self._starting: asyncio.Lock | None = None
        self.last_stats: Any = None
        self.tracer = (
            TraceWriter(config.trace_path, config.trace_fraction, config.seed or 0, getattr(gateway, "tokenizer", None))
            if config.trace_path
            else None
        )
        self.batches = 0

    async def start(self) -> str:
        """Start the gateway once; its base URL (``http://127.0.0.1:<port>/v1``)."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self.base_url is None:
                self.base_url = await self.gateway.start()
        return self.base_url

    async def collect(
        self,
        envs: EnvSource,
        tasks: int | Sequence[int | Mapping[str, Any]],
        group_size: int = 1,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        seed: int | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
        only: Collection[tuple[int, int]] | None = None,
        sampling_seed: int | None = None,
    ) -> list[Trajectory]:
        """The trajectories of ``tasks x group_size`` sessions (those in ``only`` when given), in
        (group, sample, segment) order, failed ones included; the arguments are
        :meth:`Collector.collect <chatgym.trainer.rollout.collector.Collector.collect>`'s.

        Raises:
            ValueError / TypeError: bad arguments (naming the argument).
        """
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
        task_list = list(range(tasks)) if isinstance(tasks, int) else list(tasks)
        base = self.config.seed if sampling_seed is None else sampling_seed
        episodes = [
            _Episode(envs, task_options(task, g), None if seed is None else seed + g, g, s, base)
            for g, task in enumerate(task_list)
            for s in range(group_size)
            if only is None or (g, s) in only
        ]
        base_url = await self.start()
        sem = asyncio.Semaphore(self.concurrency)
        batch = self.batches
        self.batches += 1
        t0 = time.perf_counter()

        async def one(ep: _Episode) -> list[Trajectory]:
            async with sem:
                trajs = await self._run_episode(ep, dict(env_kwargs or {}), base_url, t0)
            for traj in trajs:
                if self.tracer is not None:
                    self.tracer.write(traj, batch)
                if on_trajectory is not None:
                    on_trajectory(traj)
            return trajs

        results = await asyncio.gather(*(one(ep) for ep in episodes))
        out = [traj for trajs in results for traj in trajs]
        self.last_stats = summarize(out, time.perf_counter() - t0)
        return out

    async def _run_episode(
        self, ep: _Episode, env_kwargs: dict[str, Any], base_url: str, t0: float
    ) -> list[Trajectory]:
        start = time.perf_counter()
        options = ep.options
        task_id = options["task"].get("task_id") if "task" in options else options.get("task_index")
        name = ep.env if isinstance(ep.env, str) else env_name(ep.env, None)
        runner: EnvRunner | None = None
        sid: str | None = None
        trajs: list[Trajectory] = []
        failure: tuple[str, str] | None = None
        program_reward: float | None = None
        try:
            env = await env_call(asyncio.get_running_loop().run_in_executor(self.pool, make_env, ep.env, env_kwargs))
            runner = EnvRunner(env, self.pool)
            name = env_name(ep.env, env)
            obs, info = await env_call(runner.reset(ep.seed, options))
            task_id = info.get("task_id", task_id)
            task = _agent_task(env, name, task_id, obs, info, ep)
            sid = self.gateway.open_session(
                task_id=task_id,
                group_id=ep.group_id,
                sample_index=ep.sample_index,
                meta={"env_id": name},
                sampling_seed=ep.sampling_seed,
            )
            program_reward = await self.program.run(base_url, sid, task, self.config.episode_timeout_s)
        except asyncio.TimeoutError:
            failure = ("timeout", f"the agent program ran past episode_timeout_s={self.config.episode_timeout_s}")
        except ProgramError as exc:
            failure = ("agent_error", str(exc))
        except EpisodeFailure as exc:
            failure = (exc.kind, str(exc))
        except Exception as exc:  # a bug here must not take the batch down; it is reported per episode
            failure = ("internal_error", f"{type(exc).__name__}: {exc}")
        try:
            if sid is not None:
                trajs = list(await self.gateway.end_session(sid))
            if failure is None and not trajs:
                failure = ("no_requests", "the agent program made no chat request in its session")
            failed = [t for t in trajs if t.failed]
            if failure is None and failed:  # the gateway failed it (session timeout, prompt too long)
                failure = (failed[-1].info.get("error_kind", "gateway_error"), str(failed[-1].error))
            if failure is None:
                await self._book_reward(trajs, program_reward, runner)
        except EpisodeFailure as exc:
            failure = (exc.kind, str(exc))
        finally:
            if runner is not None:
                try:
                    await asyncio.wait_for(runner.close(), 5.0)
                except Exception as exc:
                    for traj in trajs:
                        traj.info["close_error"] = f"{type(exc).__name__}: {exc}"
        if failure is not None:
            trajs = [trajs[-1] if trajs else Trajectory(env_id=name, task_id=task_id)]
            fail(trajs[0], *failure)
        elif self.segments == "last":
            trajs = trajs[-1:]
        for traj in trajs:
            traj.env_id, traj.task_id = name, task_id
            traj.group_id, traj.sample_index = ep.group_id, ep.sample_index
            traj.timing["start_s"] = start - t0
            traj.timing["episode_s"] = time.perf_counter() - start
        return trajs

    async def _book_reward(
        self, trajs: list[Trajectory], program_reward: float | None, runner: EnvRunner | None
    ) -> None:
        """Put the session's reward (and success, under ``reward: env``) on each of its segments."""
        posted = trajs[-1]
        reward = program_reward if program_reward is not None else posted.reward
        missing = program_reward is None and bool(posted.info.get("reward_missing"))
        success: bool | None = None
        scored: dict[str, Any] = {}
        if self.reward == "env":
            scored_traj = Trajectory(env_id="", task_id=None)
            answer = _last_reply(trajs)
            obs, env_reward, _terminated, _truncated, info = await env_call(runner.step(answer))
            record_step(scored_traj, obs, env_reward, info)
            reward, missing, success = float(env_reward), False, scored_traj.success
            scored = {k: v for k, v in info.items() if k in ("answer", "expected", "correct", "reward_components")}
            scored["program_reward"] = program_reward
        for traj in trajs:
            traj.reward = float(reward)
            turns = max(traj.num_turns, 1)
            traj.rewards = [0.0] * (turns - 1) + [float(reward)]
            traj.success = success
            traj.terminated = True
            traj.info.update(scored)
            traj.info["reward_missing"] = missing
            traj.info["reward_source"] = self.reward

    def close(self) -> None:
        """Stop the env threads and the program's threads (the gateway is closed by :meth:`aclose`)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.program.close()
        if self.tracer is not None:
            self.tracer.close()

    async def aclose(self) -> None:
        """:meth:`close`, and stop the gateway if it was started."""
        self.close()
        if self.base_url is not None:
            self.base_url = None
            await self.gateway.stop()


def _agent_task(env: Any, env_id: str, task_id: Any, obs: list[dict], info: dict, ep: _Episode) -> dict[str, Any]:
    """What the agent program is given about its task (see the module docstring); JSON-able."""
    core = getattr(env, "unwrapped", env)
    row = getattr(core, "task", None)
    task = {
        "task_id": task_id,
        "prompt": str(obs[-1].get("content", "")) if obs else "",
        "messages": [dict(m) for m in obs],
        "tools": info.get("tools") or getattr(core, "tools", None) or [],
        "row": dict(row) if isinstance(row, Mapping) else None,
        "env_id": env_id,
        "group_id": ep.group_id,
        "sample_index": ep.sample_index,
    }
    # Through JSON once: the program gets plain values (a row's numpy or set values as text), and a
    # command program gets the same dict a function does.
    return json.loads(json.dumps(task, default=str))


def _last_reply(trajs: Sequence[Trajectory]) -> str:
    """The content of the session's last assistant message (what ``reward: env`` scores)."""
    for traj in reversed(trajs):
        for message in reversed(traj.messages):
            if message.get("role") == "assistant":
                return str(message.get("content") or "")
    return ""


class GatewayRollout(LocalRollout):
    """:class:`~chatgym.trainer.rollout.source.LocalRollout` whose collectors are
    :class:`GatewayCollector` s (train and eval, each its own gateway); :meth:`aclose` also stops
    the gateways."""

    async def aclose(self) -> None:
        await super().aclose()
        for collector in {id(c): c for c in (self.collector, self.eval_collector)}.values():
            await collector.aclose()


def gateway_collector(
    engine: Any, tokenizer: Any, rollout: RolloutConfig, gateway_config: Any, *, env_id: str = "gateway"
) -> GatewayCollector:
    """A :class:`GatewayCollector` with its own gateway in front of ``engine``: the gateway's sampling
    defaults are ``rollout``'s (temperature, top_p, top_k, max_tokens per request; a request's own
    values override them), its budgets ``rollout.max_model_len``, ``max_response_tokens`` and
    ``max_observation_tokens`` (each tool result), its template ``rollout.chat_template`` with
    ``rollout.chat_template_kwargs`` and EOS ids ``rollout.eos_token_ids`` (empty: the engine's);
    the program and the rest come from ``gateway_config`` (a
    :class:`~chatgym.trainer.config.gateway.GatewayConfig`).

    Raises:
        ValueError: the agent cannot be loaded (named), or no program is configured.
    """
    from chatgym.trainer.engines.base import SamplingParams

    sampling = SamplingParams(
        max_tokens=rollout.max_tokens, temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k
    )
    gateway = Gateway(
        engine,
        tokenizer,
        parser=gateway_config.tool_parser,
        sampling=sampling,
        chat_template=rollout.chat_template,
        chat_template_kwargs=rollout.chat_template_kwargs,
        eos_token_ids=tuple(rollout.eos_token_ids) or None,  # None: the engine's, as the collector's
        session_timeout_s=gateway_config.session_timeout_s,
        max_model_len=rollout.max_model_len,
        max_response_tokens=rollout.max_response_tokens,
        max_observation_tokens=rollout.max_observation_tokens,
        env_id=env_id,
        weight_version=lambda: int(getattr(engine, "weight_version", 0)),
    )
    return GatewayCollector(
        gateway,
        AgentProgram.from_config(gateway_config),
        rollout,
        reward=gateway_config.reward,
        concurrency=gateway_config.concurrency,
        segments=gateway_config.segments,
    )


def build_gateway_rollout(
    cfg: Any, engine: Any, tokenizer: Any, *, train_rollout: RolloutConfig, eval_rollout: RolloutConfig,
    env_source: Any = None,
) -> GatewayRollout:
    """The rollout source of ``trainer.rollout_source: gateway``: a train and an eval
    :func:`gateway_collector` (sampling from ``train_rollout`` / ``eval_rollout``), one agent program
    each, from ``cfg.trainer.gateway``.

    Raises:
        ValueError: the agent cannot be loaded (named), or no program is configured.
    """
    gw = cfg.trainer.gateway
    gw.check_program()
    train = gateway_collector(engine, tokenizer, train_rollout, gw, env_id=cfg.env.id)
    evaluate = gateway_collector(engine, tokenizer, eval_rollout, gw, env_id=cfg.env.id)
    return GatewayRollout(engine, train, evaluate, env_source=env_source)
