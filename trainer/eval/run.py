"""Evaluate a model (or the scripted reference policy) on envs and store one row per episode.

For each env: resolve its identity (version + dataset hash, see :mod:`.identity`), build the grid
``tasks 0..T-1 x samples 0..n-1``, drop the episodes the store already holds for that grid, run the
rest — token engines through the rollout collector (``Collector.collect(only=...)``: each episode
samples with the seed of its grid position, whatever subset runs), the ``openai`` engine and the
``reference`` policy through :mod:`.chat_policy` — and store each episode as it finishes (trace line
first, then the row). An interrupted evaluation therefore loses only the episodes in flight, and a
restart runs exactly the missing ones.

Success (for pass@k): ``Trajectory.success`` — the env's ``info["success"]`` (the success contract of
:mod:`chatgym.envs.core`; every built-in env with a task-defined success states it) — and, only for an
env that states none (``None``: a judged rating, a foreign env), ``reward >= success_threshold``
(default 1.0). A failed episode (env crash, timeout, engine error) is never a success.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from chatgym.trainer.config.loader import ConfigError, check_writable
from chatgym.trainer.engines.http import check_server
from chatgym.trainer.eval.config import LOCAL_WEIGHT_ENGINES, REFERENCE, TOKEN_ENGINES, EvalConfig
from chatgym.trainer.eval.envs import build_envs, leave_out_image_envs, resolve_env_ids
from chatgym.trainer.eval.identity import (
    EnvId,
    ModelId,
    canonical_json,
    run_key,
    weights_hash,
)
from chatgym.trainer.eval.store import ResultsStore, checked_store
from chatgym.trainer.rollout.types import Trajectory


@dataclass
class EnvReport:
    """What happened to one env: ``skipped`` holds the reason when it was not evaluated."""

    env_id: str
    column: str = ""
    run_key: str = ""
    grid: int = 0
    already_done: int = 0
    ran: int = 0
    failed: int = 0
    wall_s: float = 0.0
    skipped: str | None = None


def model_identity(config: EvalConfig) -> ModelId:
    """Name, weights hash and engine of the evaluated model (see :mod:`.identity`)."""
    if config.engine == REFERENCE:
        return ModelId(config.model_name or REFERENCE, config.model_hash or "scripted", REFERENCE)
    name = config.model_name or Path(str(config.model)).name
    if config.model_hash:
        return ModelId(name, config.model_hash, config.engine)
    if config.engine in LOCAL_WEIGHT_ENGINES:
        from chatgym.trainer.models.packaged import load_model_path

        return ModelId(name, weights_hash(load_model_path(config.model)), config.engine)
    return ModelId(name, f"api:{config.engine}", config.engine)


def episode_row(
    traj: Trajectory, *, token_level: bool, success_threshold: float, common: Mapping[str, Any]
) -> dict[str, Any]:
    """The store row of one finished episode (``common``: the grid's identity columns).

    An episode whose reward is not a finite number (an env's score returned NaN or inf) is stored as
    a failed episode with reward 0.0 and an error saying so: it is counted, and not run again by a
    resume (SQLite cannot store NaN, which once made such episodes vanish and rerun forever).
    """
    info = traj.info
    reward, failed, error = float(traj.reward), traj.failed, traj.error
    if not math.isfinite(reward):
        failed = True
        why = f"reward is {reward}: the env's score must be a finite number"
        error = f"{why}; {error}" if error else why
        reward = 0.0
    if failed:
        success = False
    elif traj.success is not None:
        success = traj.success
    else:
        success = traj.reward >= success_threshold
    generated = traj.response_tokens if token_level else info.get("generated_tokens")
    return {
        **common,
        "task_index": traj.group_id,
        "task_id": None if traj.task_id is None else str(traj.task_id),
        "sample_index": traj.sample_index,
        "reward": reward,
        "success": int(success),
        "turns": traj.num_turns,
        "generated_tokens": generated,
        "total_tokens": len(traj.token_ids) if token_level else None,
        "tool_calls": int(info.get("tool_results_total", 0) or 0),
        "tool_errors": int(info.get("tool_errors_total", 0) or 0),
        "failed": int(failed),
        "error": error,
        "truncated": int(traj.truncated),
        "wall_s": float(traj.timing.get("total_s", 0.0)),
    }


class _Backend:
    """The policy side: an engine + collector, or a message-level policy; built once for all envs."""

    def __init__(self, config: EvalConfig):
        self.config = config
        self.engine: Any = None
        self.tokenizer: Any = None
        self.processor: Any = None
        self.collector: Any = None
        self.pool = ThreadPoolExecutor(16, thread_name_prefix="chatgym-eval-env")

    @property
    def token_level(self) -> bool:
        return self.config.engine in TOKEN_ENGINES

    def check(self) -> None:
        """Check every argument of the engine before it loads the model (and before the store is
        opened): :func:`~chatgym.trainer.rollout.cli.checked_tokenizer` for a token engine (its
        tokenizer and processor kept for :meth:`start`), the ``--engine-arg`` keys for the others.

        Raises:
            ConfigError: naming the flag.
        """
        cfg = self.config
        if cfg.engine == REFERENCE:
            return
        from chatgym.trainer.engines import check_engine_options
        from chatgym.trainer.rollout.cli import checked_tokenizer

        if not self.token_level:
            check_engine_options(cfg.engine, cfg.engine_kwargs, "--engine-arg", cfg.engine_kwargs.get("dtype"))
            return
        if cfg.engine in LOCAL_WEIGHT_ENGINES:
            from chatgym.trainer.models.packaged import load_model_path

            try:
                load_model_path(cfg.model)
            except FileNotFoundError as exc:
                raise ConfigError(f"--model: {exc}") from None
        self.tokenizer, self.processor = checked_tokenizer(
            cfg.engine, cfg.model, dict(cfg.engine_kwargs), cfg.chat_template, cfg.collector_config(),
            cfg.engine_kwargs.get("tokenizer"),
        )  # fmt: skip

    def blind(self) -> str | None:
        """Why this backend's policy reads no images (after :meth:`check`), or None when it may."""
        from chatgym.trainer.rollout.cli import reads_no_images

        return reads_no_images(self.config.engine, self.config.model, self.processor) if self.token_level else None

    def start(self) -> None:
        """Load the engine (after :meth:`check`) and its collector."""
        cfg = self.config
        if cfg.engine == REFERENCE:
            return
        from chatgym.trainer.rollout.cli import make_checked_engine, with_context_limit

        flag = "--engine-arg" if cfg.engine_kwargs else "--engine"
        if not self.token_level:
            self.engine = make_checked_engine(cfg.engine, cfg.model, dict(cfg.engine_kwargs), flag)
            return
        from chatgym.trainer.rollout.collector import Collector

        rollout = cfg.collector_config()
        kwargs = {k: v for k, v in cfg.engine_kwargs.items() if k != "tokenizer"}
        kwargs = with_context_limit(cfg.engine, kwargs, rollout.max_model_len)
        self.engine = make_checked_engine(cfg.engine, cfg.model, kwargs, flag)
        self.collector = (
            Collector(self.engine, self.tokenizer, rollout, processor=self.processor)
            if cfg.agent is None
            else _agent_collector(cfg, self.engine, self.tokenizer)
        )

    async def close(self) -> None:
        if self.collector is not None:
            self.collector.close()
            if hasattr(self.collector, "aclose"):  # an agent's gateway
                await self.collector.aclose()
        if self.engine is not None:
            await self.engine.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def has_reference(self, env_id: str, kwargs: Mapping[str, Any]) -> str | None:
        """None when the env's reference policy answers on task 0, else why not."""
        env = gym.make(env_id, **kwargs)
        try:
            await asyncio.get_running_loop().run_in_executor(
                self.pool, lambda: env.reset(seed=self.config.seed, options={"task_index": 0})
            )
            env.unwrapped.reference_action()
        except NotImplementedError as exc:
            return f"no scripted reference policy ({exc})"
        finally:
            env.close()
        return None

    async def run(
        self,
        env_id: str,
        kwargs: dict[str, Any],
        num_tasks: int,
        todo: set[tuple[int, int]],
        on_episode: Callable[[Trajectory], None],
    ) -> None:
        cfg = self.config
        rollout = cfg.collector_config()
        if self.token_level:
            await self.collector.collect(
                env_id,
                num_tasks,
                cfg.n_samples,
                env_kwargs=kwargs,
                seed=cfg.seed,
                on_trajectory=on_episode,
                only=todo,
            )
            return
        from chatgym.trainer.eval.chat_policy import api_act, reference_act, run_chat_episode

        if cfg.engine == REFERENCE:
            act = reference_act
        else:
            from chatgym.trainer.engines.base import SamplingParams

            params = SamplingParams(
                max_tokens=rollout.max_tokens, temperature=rollout.temperature, top_p=rollout.top_p
            )
            act = api_act(self.engine, params)
        sem = asyncio.Semaphore(rollout.max_concurrent_episodes)

        async def one(task: int, sample: int) -> None:
            async with sem:
                traj = await run_chat_episode(
                    act, env_id, kwargs, task, sample, cfg.seed, self.pool, rollout.episode_timeout_s
                )
            on_episode(traj)

        await asyncio.gather(*(one(t, s) for t, s in sorted(todo)))


def _agent_collector(cfg: EvalConfig, engine: Any, tokenizer: Any) -> Any:
    """The collector of ``--agent``: its program's sessions on a gateway in front of ``engine``."""
    from chatgym.trainer.config.gateway import GatewayConfig
    from chatgym.trainer.gateway.source import gateway_collector

    rollout = cfg.collector_config()
    program = GatewayConfig(agent=cfg.agent, reward=cfg.agent_reward, concurrency=min(rollout.max_concurrent_episodes, 32))
    return gateway_collector(engine, tokenizer, rollout, program)


async def evaluate(
    config: EvalConfig,
    *,
    progress: bool = True,
    argv: Sequence[str] = (),
    log: Callable[[str], None] | None = None,
) -> list[EnvReport]:
    """Run (or resume) the evaluation of ``config``; returns one report per env.

    Raises:
        ValueError: an unknown env id or bad config (before anything runs).
        ConfigError: an env that cannot be built (see :func:`~chatgym.trainer.eval.envs.build_envs`)
            or a ``--db`` that cannot be a results store, before any model loads or the store is made.
    """
    env_ids = resolve_env_ids(config.envs)
    evaluation = _Evaluation(config, env_ids, log or (lambda msg: print(msg, file=sys.stderr)))
    built = evaluation.built
    reports: list[EnvReport] = []
    try:
        for env_id in env_ids:
            report = EnvReport(env_id)
            reports.append(report)
            if isinstance(built[env_id], str):
                evaluation.skip(report, built[env_id])
                continue
            grid = await evaluation.grid(env_id, report, *built[env_id])
            if grid is not None:
                await evaluation.run(grid, report, progress=progress, argv=argv)
    finally:
        await evaluation.close()
    return reports


@dataclass
class _EnvGrid:
    """One env's episodes: the grid ``tasks 0..num_tasks-1 x samples``, those the store holds, the rest."""

    ident: EnvId
    kwargs: dict[str, Any]
    num_tasks: int
    key: str
    done: set[tuple[int, int]]
    todo: set[tuple[int, int]]


class _Evaluation:
    """The state of one :func:`evaluate` call: the model's identity, the store, the backend (checked
    first, started at the first env with episodes to run).

    The store is opened when there is one already; else it is made once the backend has started, so
    that an evaluation refused at start-up (an engine option, the chat template) leaves no file behind.

    Raises:
        ConfigError: the backend's start-up checks (:meth:`_Backend.check`), an env that cannot be
            built (:func:`~chatgym.trainer.eval.envs.build_envs`) or whose images a text-only model
            cannot read (:func:`~chatgym.trainer.eval.envs.leave_out_image_envs`), a server engine's server
            that does not answer (:func:`~chatgym.trainer.engines.http.check_server`), a ``--traces-dir``
            where no file can be made and a ``--db`` that cannot be a store
            (:func:`~chatgym.trainer.eval.store.checked_store`), before any model loads.
    """

    def __init__(self, config: EvalConfig, env_ids: Sequence[str], log: Callable[[str], None]):
        self.config = config
        self.log = log
        self.backend = _Backend(config)
        self.backend.check()
        self.built = build_envs(config, env_ids)
        leave_out_image_envs(config, self.built, self.backend.blind())
        # Else every episode fails and is stored; before the --db check, which may open the store.
        check_server(config.engine, config.engine_kwargs, "--engine-arg", "--engine")
        self.model = model_identity(config)
        self.sampling = config.sampling()
        self.db = Path(config.db).expanduser()
        # Absolute: rows store their trace's path, which a leaderboard run from another directory reads.
        traces_dir = Path(config.traces_dir).expanduser() if config.traces_dir else self.db.parent / "traces"
        self.traces_dir = traces_dir.resolve()
        if config.traces_dir:  # the default, next to --db, is --db's check's
            check_writable(self.traces_dir, "--traces-dir", config.traces_dir)
        try:  # before any model loads: a bad --db is one line, not a traceback once the model is up
            self.store: ResultsStore | None = checked_store(self.db, "--db")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.started = False

    async def close(self) -> None:
        await self.backend.close()
        if self.store is not None:
            self.store.close()

    def skip(self, report: EnvReport, reason: str) -> None:
        report.skipped = reason
        self.log(f"chatgym eval: {report.env_id}: skipped, {reason}")

    async def grid(
        self, env_id: str, report: EnvReport, ident: EnvId, kwargs: dict[str, Any]
    ) -> _EnvGrid | None:
        """The env's grid (``ident``, built with ``kwargs``) with the episodes still to run; None when
        there are none or the env is skipped (``report.skipped`` says why)."""
        config, store = self.config, self.store  # None: no results file yet, so nothing stored
        report.column = ident.column
        num_tasks = min(config.max_tasks or ident.num_tasks, ident.num_tasks)
        if num_tasks == 0:
            return self.skip(report, f"split {ident.split!r} has no tasks")
        key = report.run_key = run_key(self.model, ident, config.seed, config.n_samples, self.sampling)
        grid = {(t, s) for t in range(num_tasks) for s in range(config.n_samples)}
        if config.retry_failed and store is not None and (dropped := store.drop_failed(key)):
            self.log(f"chatgym eval: {env_id}: {dropped} failed episodes will run again")
        done = store.done(key) & grid if store is not None else set()
        todo = grid - done
        report.grid, report.already_done = len(grid), len(done)
        if config.engine == REFERENCE:
            reason = await self.backend.has_reference(env_id, kwargs)
            if reason:
                return self.skip(report, reason)
        if not todo:
            self.log(f"chatgym eval: {env_id}: all {len(grid)} episodes already stored (grid {key[:12]})")
            return None
        return _EnvGrid(ident, kwargs, num_tasks, key, done, todo)

    async def run(self, grid: _EnvGrid, report: EnvReport, *, progress: bool, argv: Sequence[str]) -> None:
        """Run the grid's missing episodes, storing each as it finishes."""
        from chatgym.trainer.rollout.trace import TraceWriter

        env_id, key = report.env_id, grid.key
        if not self.started:
            self.backend.start()
            self.started = True
        if self.store is None:
            self.store = ResultsStore(self.db)
        if grid.done:
            self.log(
                f"chatgym eval: {env_id}: resuming grid {key[:12]}: {len(grid.done)} stored, {len(grid.todo)} to run"
            )
        session = self.store.start_session(key, argv)
        trace_path = self.traces_dir / f"{env_id}-{key[:12]}.jsonl"
        writer = TraceWriter(trace_path, 1.0, self.config.seed, self.backend.tokenizer)
        common = self._columns(grid, trace_path, session)
        bar = _progress_bar(env_id, report.grid, report.already_done, progress)
        t0 = time.perf_counter()
        on_episode = _EpisodeRecorder(self, writer, common, report, bar)
        try:
            await self.backend.run(env_id, grid.kwargs, grid.num_tasks, grid.todo, on_episode)
        finally:
            bar.close()
            writer.close()
            report.wall_s = time.perf_counter() - t0

    def _columns(self, grid: _EnvGrid, trace_path: Path, session: Any) -> dict[str, Any]:
        """The identity columns every row of this grid carries."""
        from chatgym import __version__

        ident, model = grid.ident, self.model
        return {
            "run_key": grid.key,
            "model_name": model.name,
            "model_hash": model.weights_hash,
            "engine": model.engine,
            "env_id": ident.env_id,
            "env_version": ident.version,
            "dataset_hash": ident.dataset_hash,
            "split": ident.split,
            "env_kwargs": ident.env_kwargs,
            "seed": self.config.seed,
            "sampling": canonical_json(self.sampling),
            "trace_path": str(trace_path),
            "chatgym_version": __version__,
            "session_id": session,
        }


def _progress_bar(env_id: str, total: int, initial: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=env_id, unit="ep", disable=not enabled, file=sys.stderr)


class _EpisodeRecorder:
    """The ``on_episode`` callback of one env's run: stores the episode (trace line, then row) and
    counts it in the report and the progress bar."""

    def __init__(
        self, evaluation: _Evaluation, writer: Any, common: dict[str, Any], report: EnvReport, bar: Any
    ):
        self.store = evaluation.store
        self.token_level = evaluation.backend.token_level
        self.success_threshold = evaluation.config.success_threshold
        self.writer, self.common, self.report, self.bar = writer, common, report, bar

    def __call__(self, traj: Trajectory) -> None:
        # Trace before row: a kill in between leaves an extra trace line, never a row without its
        # trace; the rerun of that episode appends a second line.
        self.writer.write(traj)
        row = episode_row(
            traj, token_level=self.token_level, success_threshold=self.success_threshold, common=self.common
        )
        self.store.add_episode(row)
        self.report.ran += 1
        self.report.failed += row["failed"]  # the row's: a non-finite reward fails the episode
        self.bar.set_postfix(failed=self.report.failed, refresh=False)
        self.bar.update(1)


def report_dicts(reports: Sequence[EnvReport]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) for r in reports]
