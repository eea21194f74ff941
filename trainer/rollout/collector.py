"""The vectorized async rollout collector: many episodes at once, token-exact trajectories.

Each episode is one asyncio task::

    areset -> prompt ids -> loop { engine.generate -> decode -> env.astep(text)
                                   -> closing ids + chat-template delta of the new messages }

Episodes never wait for each other: while one waits for a slow tool, the others generate (the
engine batches whatever requests are in flight). Sync envs run in a thread pool (``env_runner``).

**Token-in/token-out.** The sampled ids are appended exactly as the engine returned them (never
decoded and re-encoded), with their logprobs 1:1 and loss mask 1. Everything else — prompt, the
tokens that close a turn, observation messages, the next assistant header — has loss mask 0 and
logprob 0.0; it comes from :mod:`chatgym.trainer.chat.delta` (its docstring says exactly which
tokens sit between a completion and the next observation). Message text is always encoded as plain
text: the only control ids are those the chat template writes. The chat template is probed at
start-up; one that re-renders history (Qwen3 drops earlier ``<think>`` blocks) gets its observation
deltas rendered after a fixed base conversation, and one that fits neither way is refused.

**Budgets** (all in tokens, checked before each turn):

* ``max_tokens`` — per turn;
* ``max_response_tokens`` — generated tokens over the whole trajectory;
* ``max_model_len`` — the whole sequence (prompt + completions + observations).

Turn ``k`` may generate ``min(max_tokens, max_response_tokens - generated, max_model_len - len(ids))``
tokens. If that is <= 0 the episode ends ``truncated`` with ``info["truncated_by"]`` naming the budget
(``max_model_len`` is reported when both are spent). A completion cut by any budget is still given to
the env (like any text); its turn record (``info["turns"][k]``) names the budget in ``cut_by``. An observation is appended only if at least one token of context is left
after it; otherwise the episode ends truncated by ``max_model_len`` and the observation is dropped
(``info["dropped_observation_tokens"]``). A prompt that alone fills the context is kept, with no turn,
as a failed trajectory (``error_kind`` ``prompt_too_long``): the policy never acted.
Each observation message's content is cut to ``max_observation_tokens`` tokens with a visible marker.
An env's own truncation (``max_turns``) is reported as ``truncated_by="env"``.

**Images** (with a ``processor``; docs/multimodal.md). Image parts of observations are decoded once and
stored by sha256 in ``Trajectory.image_store``; messages and traces keep ``{"type": "image", "ref"}``
parts. Each image's placeholder is expanded to the processor's image token ids in the ids of the turn
that introduces it, so image tokens count in ``max_model_len`` like any token (an observation that
does not fit is dropped whole). ``max_observation_tokens`` counts them too: a message's parts are kept
while they fit, an image never cut inside its run. ``engine.generate(ids, params, images=...)`` gets
every image of the episode so far, in the order of their placeholder runs (``Trajectory.images``);
a text-only episode calls ``engine.generate(ids, params)`` as before. An image the model cannot read
(no processor, a network URL, bad data) fails the episode as ``image_error``.

**EOS** is judged on the completion's ids only: a turn's ``finish_reason`` is ``stop`` iff its last
sampled id is one of the model's EOS ids, ``length`` if it has ``max_tokens`` ids without one, else the
engine's reason (``abort`` fails the episode).

**Stop strings.** An env's ``stop_strings`` attribute (Search-v0 tags mode: ``["</search>",
"</answer>"]``) is sent with every request (``SamplingParams.stop``), so a turn ends after its first
action. The turn keeps every sampled id through the one that completed the stop string (the rule of
``engines.common.StopStringChecker``; the stop string is content, so the env sees it and the whole
turn suffix, EOS included, closes the turn as for a cut completion). The collector checks the rule
on the ids itself: a completion that runs past a stop string (an engine that ignored ``stop``) is
cut there, the extra ids dropped (``turns[k]["stop_cut_tokens"]``). The turn's ``finish_reason`` is
then ``stop`` and ``Trajectory.stop_reasons`` / ``turns[k]["stop_reason"]`` name the stop string;
for an EOS ending they hold the EOS id.

**Failure isolation.** Per episode: an exception in the env fails that trajectory only (``error`` =
``"env_error: ..."``, kept with what it had); ``episode_timeout_s`` cancels a stuck episode (``"timeout:
..."``); engine and template errors likewise (``engine_error``, ``engine_abort``, ``template_error``).
:class:`CollectStats` counts them. Trajectories are returned in (group, sample) order.

``info["tool_results_total"]`` counts the ``tool`` messages the env returned over the episode (one per
tool call, malformed calls included) and ``info["tool_errors_total"]`` the env's ``tool_errors``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from chatgym.envs.messages import Message
from chatgym.trainer.chat.delta import (
    TemplateError,
    closing_ids,
    probe_chat_template,
)
from chatgym.trainer.chat.images import ImageInputError, intern_images
from chatgym.trainer.engines.base import Engine, SamplingParams
from chatgym.trainer.rollout.config import RolloutConfig
from chatgym.trainer.rollout.env_runner import EnvRunner, EnvSource, env_name, make_env
from chatgym.trainer.rollout.episode import (
    EpisodeFailure,
    check_observation,
    cut_observation,
    ended,
    env_call,
    env_stop_strings,
    fail,
    record_step,
    run_guarded,
)
from chatgym.trainer.rollout.stats import CollectStats, summarize
from chatgym.trainer.rollout.trace import TraceWriter
from chatgym.trainer.rollout.turn import Turn, TurnBudget, sampled_turn
from chatgym.trainer.rollout.types import Trajectory


@dataclass
class _EpisodeSpec:
    env: EnvSource
    options: dict[str, Any] | None
    seed: int | None
    group_id: int
    sample_index: int
    sampling_seed: int | None = None


def _task_options(task: Any, i: int) -> dict[str, Any]:
    if isinstance(task, bool) or not isinstance(task, (int, Mapping)):
        raise TypeError(f"tasks[{i}] must be a task index (int) or a task row (dict), got {task!r:.100}")
    return {"task_index": task} if isinstance(task, int) else {"task": dict(task)}


def request_seed(base: int | None, *parts: int) -> int | None:
    """The per-request sampling seed of a grid place: ``hash((base, *parts)) % 2**31`` (None when
    ``base`` is None); the collector's ``parts`` are ``(group_id, sample_index, turn)``."""
    # Tuples of ints hash the same in every process (no hash randomisation for ints).
    return None if base is None else hash((base, *parts)) % (2**31)


class Collector:
    """Collects trajectories from envs with an engine.

    Args:
        engine: anything implementing the Engine contract (``async generate(prompt_ids, params)``).
        tokenizer: the model's Hugging Face tokenizer (with a chat template, or pass
            ``config.chat_template``).
        config: :class:`RolloutConfig`.
        generation_config: the model's ``GenerationConfig``. EOS ids come from
            ``config.eos_token_ids``, else the engine's ``eos_token_ids`` attribute, else this config's
            ``eos_token_id`` list plus the tokenizer's ``eos_token_id``.
        processor: the model's multimodal processor (``image_token``, ``processor(text=, images=)``),
            for episodes whose messages hold images; None: text only (a processor passed as
            ``tokenizer`` is taken as this, with its ``tokenizer`` as the tokenizer).

    Raises:
        TemplateError: at construction, if the chat template is not prefix-preserving or does not end
            assistant turns with an EOS id (see :func:`chatgym.trainer.chat.template_probe.probe_template`).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        config: RolloutConfig | None = None,
        generation_config: Any = None,
        processor: Any = None,
    ):
        if processor is None and hasattr(tokenizer, "image_processor") and hasattr(tokenizer, "tokenizer"):
            processor, tokenizer = tokenizer, tokenizer.tokenizer
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config or RolloutConfig()
        self.eos_token_ids, self.renderer, self.probe = probe_chat_template(
            tokenizer, self.config, getattr(engine, "eos_token_ids", None), generation_config, processor
        )
        self._eos = frozenset(self.eos_token_ids)
        self._pool: ThreadPoolExecutor | None = None
        self.tracer = (
            TraceWriter(self.config.trace_path, self.config.trace_fraction, self.config.seed or 0, tokenizer)
            if self.config.trace_path
            else None
        )
        self.batches = 0
        self.last_stats: CollectStats | None = None
        self._prompts: dict[str, list[int]] = {}  # a collect call's rendered text-only prompts (_prompt_ids)

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.config.env_threads, thread_name_prefix="chatgym-env")
        return self._pool

    def close(self) -> None:
        """Stop the sync-env threads and close the trace file (the engine is the caller's)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.tracer is not None:
            self.tracer.close()

    async def collect(
        self,
        envs: EnvSource | Sequence[EnvSource],
        tasks: int | Sequence[int | Mapping[str, Any]],
        group_size: int = 1,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        seed: int | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
        only: Collection[tuple[int, int]] | None = None,
        sampling_seed: int | None = None,
    ) -> list[Trajectory]:
        """Run ``group_size`` episodes of every task concurrently and return their trajectories.

        Args:
            envs: an env id / factory used for every task, or one per task (same length as ``tasks``).
                Each episode gets a fresh env instance, closed when the episode ends.
            tasks: task indices of the env's split (``options={"task_index": i}``) or task rows
                (``options={"task": row}``); an int ``n`` means indices ``0..n-1``.
            group_size: G, samples per task. Trajectories of task ``i`` share ``group_id = i`` and have
                ``sample_index`` 0..G-1 (GRPO groups).
            env_kwargs: keyword arguments of ``gym.make`` for env ids.
            seed: reset seed of group ``i`` is ``seed + i`` (same for all its samples); None: unseeded.
            on_trajectory: called with each trajectory as it finishes (progress bars).
            sampling_seed: base of the per-request sampling seeds for this call only (None:
                ``config.seed``); concurrent calls for different steps each pass their own.
            only: run just these ``(group_id, sample_index)`` episodes of the tasks x group_size grid
                (resuming a partial evaluation). Seeds depend on the position in the grid, so an
                episode samples the same way whichever subset of the grid runs with it.

        Returns:
            ``len(tasks) * group_size`` trajectories (those in ``only`` when given) ordered by
            (group_id, sample_index); failed ones
            included with ``error`` set. Counts are in ``self.last_stats``.

        Raises:
            ValueError / TypeError: for bad arguments (naming the argument).
        """
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
        task_list: list[Any] = list(range(tasks)) if isinstance(tasks, int) else list(tasks)
        if isinstance(envs, str) or callable(envs):
            env_list: list[EnvSource] = [envs] * len(task_list)  # type: ignore[list-item]
        else:
            env_list = list(envs)
            if len(env_list) != len(task_list):
                raise ValueError(
                    f"envs has {len(env_list)} entries but tasks has {len(task_list)}; give one env or one per task"
                )
        base = self.config.seed if sampling_seed is None else sampling_seed
        specs = [
            _EpisodeSpec(env_list[g], _task_options(task, g), None if seed is None else seed + g, g, s, base)
            for g, task in enumerate(task_list)
            for s in range(group_size)
            if only is None or (g, s) in only
        ]
        batch = self.batches
        self.batches += 1
        self._prompts = {}  # per call: a template may read the clock (Llama 3's date line)
        sem = asyncio.Semaphore(self.config.max_concurrent_episodes)
        t0 = time.perf_counter()

        async def one(spec: _EpisodeSpec) -> Trajectory:
            queued = time.perf_counter()
            async with sem:
                traj = await self._run_episode(spec, dict(env_kwargs or {}), t0)
            traj.timing["queue_s"] = traj.timing.get("start_s", 0.0) - (queued - t0)
            if self.tracer is not None:
                self.tracer.write(traj, batch)
            if on_trajectory is not None:
                on_trajectory(traj)
            return traj

        trajectories = await asyncio.gather(*(one(s) for s in specs))
        self.last_stats = summarize(trajectories, time.perf_counter() - t0)
        return list(trajectories)

    async def _run_episode(self, spec: _EpisodeSpec, env_kwargs: dict[str, Any], t0: float) -> Trajectory:
        name = spec.env if isinstance(spec.env, str) else env_name(spec.env, None)
        options = spec.options or {}
        # Known before reset, so a trajectory whose env fails to start still names its task.
        task_id = options["task"].get("task_id") if "task" in options else options.get("task_index")
        traj = Trajectory(
            env_id=name, task_id=task_id, group_id=spec.group_id, sample_index=spec.sample_index
        )
        traj.timing.update(start_s=time.perf_counter() - t0, generate_s=0.0, env_s=0.0, render_s=0.0)
        await run_guarded(
            traj, lambda state: self._episode(spec, env_kwargs, traj, state), self.config.episode_timeout_s
        )
        traj.timing["end_s"] = time.perf_counter() - t0
        traj.timing["total_s"] = traj.timing["end_s"] - traj.timing["start_s"]
        return traj

    async def _env_call(self, traj: Trajectory, coro: Any) -> Any:
        t = time.perf_counter()
        try:
            return await env_call(coro)
        finally:
            traj.timing["env_s"] += time.perf_counter() - t

    def _render(self, traj: Trajectory, fn: Callable[..., Any], *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args)
        except TemplateError as exc:
            raise EpisodeFailure("template_error", str(exc)) from exc
        except ImageInputError as exc:
            raise EpisodeFailure("image_error", str(exc)) from exc
        finally:
            traj.timing["render_s"] += time.perf_counter() - t

    def _intern(self, traj: Trajectory, obs: list[Message], new: Any = None) -> tuple[list[Message], dict, list]:
        """``obs`` with image parts as refs, the images ``traj`` lacks, and every image part's ref."""
        store = traj.image_store if new is None else {**traj.image_store, **new}
        try:
            obs, found, refs = intern_images(obs, store)
        except ImageInputError as exc:
            raise EpisodeFailure("image_error", str(exc)) from exc
        if refs and self.renderer.image_tokens is None:
            raise EpisodeFailure("image_error", "the env sent an image but the model reads no images (no processor)")
        return obs, found, refs

    def _cut_observation(self, messages: list[Message], traj: Trajectory, images: dict) -> list[Message]:
        tokens = self.renderer.image_tokens
        return cut_observation(self.tokenizer, messages, self.config.max_observation_tokens, traj.info,
                               lambda ref: tokens.count(ref, images[ref]))  # type: ignore[union-attr]

    async def _episode(
        self, spec: _EpisodeSpec, env_kwargs: dict[str, Any], traj: Trajectory, state: dict
    ) -> None:
        # Run under run_guarded: an EpisodeFailure raised by any step fails this trajectory only.
        ep = await self._start(spec, env_kwargs, traj, state)
        while (budget := self._budget(ep)).limit > 0:
            turn = await self._generate(ep, budget)
            self._record(ep, turn)
            if turn.finish_reason == "abort":
                raise EpisodeFailure("engine_abort", f"engine aborted turn {turn.index}")
            obs = await self._step(ep, self._decode(turn))
            if obs is None:
                return  # the env ended it: terminated, or truncated by its own limit (max_turns)
            if not self._observe(ep, turn, obs):
                return  # truncated: the observation would leave no token of max_model_len
        self._out_of_budget(ep, budget)  # truncated: max_model_len or max_response_tokens spent

    async def _start(
        self, spec: _EpisodeSpec, env_kwargs: dict[str, Any], traj: Trajectory, state: dict
    ) -> _Episode:
        """Make and reset the env, and put the rendered prompt into ``traj``."""
        env = await self._env_call(
            traj, asyncio.get_running_loop().run_in_executor(self.pool, make_env, spec.env, env_kwargs)
        )
        runner = state["runner"] = EnvRunner(env, self.pool)
        traj.env_id = env_name(spec.env, env)
        obs, reset_info = await self._env_call(traj, runner.reset(spec.seed, spec.options))
        obs, traj.image_store, traj.images = self._intern(traj, check_observation(obs, "reset"))
        traj.task_id = reset_info.get("task_id", traj.task_id)
        tools = reset_info.get("tools") or getattr(getattr(env, "unwrapped", env), "tools", None) or None
        self.renderer.warn_if_tools_ignored(self.probe, tools)
        ep = _Episode(spec, traj, runner, tools, env_stop_strings(env), list(obs))
        traj.messages = ep.history
        prompt = self._prompt_ids(traj, ep.history, tools)
        _append_context(traj, prompt)
        traj.prompt_len = len(prompt)
        traj.info["turns"] = ep.turns
        return ep

    def _prompt_ids(self, traj: Trajectory, history: list[Message], tools: Any) -> list[int]:
        """The episode's rendered opening prompt. A group's samples open with the same messages, so a
        text-only prompt is rendered once a collect call (keyed by the messages and tools as JSON): the
        template and tokenizer took ~0.4 ms an episode, 64 a step on the event loop's thread before the
        last request reached the engine (an H100 profile of SmolLM2's rollouts)."""
        key = None
        if not traj.image_store:
            try:
                key = json.dumps([history, tools], sort_keys=True, ensure_ascii=False)
            except (TypeError, ValueError):  # not plain JSON: rendered every time
                key = None
        found = self._prompts.get(key) if key is not None else None
        if found is None:
            found = self._render(traj, self.renderer.prompt_ids, history, tools, traj.image_store)
            if key is not None:
                self._prompts[key] = found
        return list(found)

    def _budget(self, ep: _Episode) -> TurnBudget:
        cfg = self.config
        return TurnBudget(
            max_tokens=cfg.max_tokens,
            response_left=cfg.max_response_tokens - ep.generated,
            context_left=cfg.max_model_len - len(ep.traj.token_ids),
        )

    def _out_of_budget(self, ep: _Episode, budget: TurnBudget) -> None:
        traj = ep.traj
        traj.truncated = True
        traj.info["truncated_by"] = budget.spent()
        if not ep.turns:
            # The policy never acted: a 0 reward here would score the set-up, not the model.
            fail(
                traj,
                "prompt_too_long",
                f"the prompt has {traj.prompt_len} tokens and max_model_len is {self.config.max_model_len}",
            )

    async def _generate(self, ep: _Episode, budget: TurnBudget) -> Turn:
        """Sample one turn of at most ``budget.limit`` tokens; engine errors are ``engine_error``."""
        cfg, spec, index = self.config, ep.spec, len(ep.turns)
        params = SamplingParams(
            max_tokens=budget.limit,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop_token_ids=self.eos_token_ids,
            seed=request_seed(spec.sampling_seed, spec.group_id, spec.sample_index, index),
            logprobs=True,
            stop=ep.stop_strings,
        )
        t = time.perf_counter()
        # Read at the call: an engine whose weights are swapped while this turn is being sampled
        # says so per token in Completion.weight_versions.
        version = int(getattr(self.engine, "weight_version", 0))
        try:
            ids, images = list(ep.traj.token_ids), ep.traj.image_list()
            # A text-only episode calls exactly as every engine expects; images go beside the ids.
            call = self.engine.generate(ids, params, images=images) if images else self.engine.generate(ids, params)
            completion = await call
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise EpisodeFailure("engine_error", f"{type(exc).__name__}: {exc}") from exc
        gen_s = time.perf_counter() - t
        ep.traj.timing["generate_s"] += gen_s
        return sampled_turn(
            completion,
            index=index,
            budget=budget,
            version=version,
            generate_s=gen_s,
            tokenizer=self.tokenizer,
            stop_strings=ep.stop_strings,
            eos=self._eos,
        )

    def _record(self, ep: _Episode, turn: Turn) -> None:
        """Append the turn's sampled ids (loss mask 1, their logprobs) and its ``info["turns"]`` entry."""
        traj = ep.traj
        start = len(traj.token_ids)
        traj.token_ids.extend(turn.token_ids)
        traj.loss_mask.extend([1] * len(turn.token_ids))
        traj.engine_logprobs.extend(turn.logprobs)
        traj.weight_versions.extend(turn.weight_versions)
        ep.generated += len(turn.token_ids)
        traj.finish_reasons.append(turn.finish_reason)
        traj.stop_reasons.append(turn.stop_reason)
        ep.turns.append(turn.record(start))

    def _decode(self, turn: Turn) -> str:
        return self.tokenizer.decode(turn.text_ids, skip_special_tokens=False)

    async def _step(self, ep: _Episode, text: str) -> list[Message] | None:
        """Give ``text`` to the env as the assistant's turn and book the result; the observation, or
        None when the env ended the episode."""
        ep.history.append({"role": "assistant", "content": text})
        record = ep.turns[-1]
        t = time.perf_counter()
        obs, reward, terminated, truncated, info = await self._env_call(ep.traj, ep.runner.step(text))
        record["env_s"] = time.perf_counter() - t
        obs = check_observation(obs, "step")
        record_step(ep.traj, obs, reward, info)
        record["reward"] = float(reward)
        return None if ended(ep.traj, terminated, truncated) else obs

    def _observe(self, ep: _Episode, turn: Turn, obs: list[Message]) -> bool:
        """Append the ids that close ``turn`` and the observation's chat-template delta (loss mask 0);
        False, with the episode truncated by ``max_model_len`` and the observation dropped, when they
        would leave no token of context."""
        traj = ep.traj
        obs, new, _ = self._intern(traj, obs)
        images = {**traj.image_store, **new}
        obs, _, refs = self._intern(traj, self._cut_observation(obs, traj, images), new)
        if not self.probe.renders_tool_messages and any(m.get("role") == "tool" for m in obs):
            raise EpisodeFailure(
                "template_error",
                "the chat template drops tool messages: the model would never see this tool result "
                "(use a template that renders them, e.g. chatml_tools)",
            )
        closing = closing_ids(self.probe, turn.token_ids)
        delta = self._render(traj, self.renderer.delta_ids, ep.history, obs, ep.tools, self.probe, images)
        added = closing + delta
        if len(traj.token_ids) + len(added) >= self.config.max_model_len:
            traj.truncated = True
            traj.info["truncated_by"] = "max_model_len"
            traj.info["dropped_observation_tokens"] = len(added)
            return False
        ep.history.extend(obs)
        record = ep.turns[-1]
        record["closing_tokens"] = len(closing)
        record["observation_tokens"] = len(delta)
        if refs:
            record["observation_images"] = len(refs)
            traj.image_store.update((ref, images[ref]) for ref in refs)
            traj.images.extend(refs)
        _append_context(traj, added)
        return True


@dataclass
class _Episode:
    """What one running episode keeps beside its trajectory."""

    spec: _EpisodeSpec
    traj: Trajectory
    runner: EnvRunner
    tools: Any
    stop_strings: tuple[str, ...]
    history: list[Message]  # the conversation so far, the same list as traj.messages
    turns: list[dict[str, Any]] = field(default_factory=list)  # the same list as info["turns"]
    generated: int = 0  # sampled tokens over all turns


def _append_context(traj: Trajectory, ids: list[int]) -> None:
    """Append ids the policy did not sample: loss mask 0, logprob 0.0, weight version -1."""
    traj.token_ids.extend(ids)
    traj.loss_mask.extend([0] * len(ids))
    traj.engine_logprobs.extend([0.0] * len(ids))
    traj.weight_versions.extend([-1] * len(ids))
