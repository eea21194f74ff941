"""The gateway: an OpenAI-compatible chat server (aiohttp, 127.0.0.1) that records token-exact trajectories.

An agent program written against the OpenAI API is pointed at it unchanged
(``openai.OpenAI(base_url=base_url, api_key=session_id)``); every request is rendered with the
collector's chat-delta code (:mod:`chatgym.trainer.gateway.session`), sampled by a chatgym engine,
and booked into the session's trajectory. Routes:

* ``POST /v1/chat/completions`` (see :mod:`chatgym.trainer.gateway.openai_api` for the fields);
* ``GET /v1/models``: the one model served (``model_name``); a request may name any model;
* ``POST /v1/sessions`` (only with ``http_sessions=True``) ``{"task_id", "meta", "group_id",
  "sample_index", "sampling_seed"}`` (all optional; an empty body is fine) -> ``{"session_id",
  "base_url"}``: a program outside chatgym opens its own session;
* ``POST /v1/sessions/{sid}/reward`` ``{"reward": float}`` -> ``{"ok": true}``;
* ``POST /v1/sessions/{sid}/end`` -> ``{"session_id", "trajectories": [Trajectory.to_json(), ...]}``;
* the same ``/v1/...`` routes under ``/s/{sid}/v1/...`` (the session id in the base URL).

The session of a request is the path's ``/s/{sid}``, else the header ``X-Chatgym-Session``, else the
API key (``Authorization: Bearer <sid>``). An unknown or ended session is refused with HTTP 401, a
malformed body with 400, a new session or request at shutdown with 503 (all in OpenAI's error shape);
a bad request changes nothing in its session. Requests of one session are served one at a time, in
arrival order; sessions run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

import jinja2
from aiohttp import web

from chatgym.envs.parsers import get_parser
from chatgym.envs.parsers.base import ToolCallParser
from chatgym.trainer.chat.delta import ChatRenderer, ConversationRefused, TemplateError, resolve_eos_ids
from chatgym.trainer.chat.template_probe import probe_template
from chatgym.trainer.engines.base import Engine, SamplingParams
from chatgym.trainer.gateway import openai_api as api
from chatgym.trainer.gateway.session import Plan, Rendering, Session, messages_view, set_reward, tool_counts
from chatgym.trainer.rollout.collector import request_seed
from chatgym.trainer.rollout.episode import EpisodeFailure
from chatgym.trainer.rollout.turn import Turn, sampled_turn
from chatgym.trainer.rollout.types import Trajectory

MAX_BODY_BYTES = 64 * 2**20


class SessionEnded(KeyError):
    """The session id is unknown, or its session ended and its trajectories were already collected."""


class Gateway:
    """The gateway server (see the module docstring).

    Args:
        engine: any chatgym engine (``async generate(prompt_ids, params) -> Completion``).
        tokenizer: the model's Hugging Face tokenizer.
        parser: the tool-call format of the model's text (a name of ``chatgym.envs.parsers``, or a parser).
        sampling: defaults of each request (``max_tokens`` per turn, ``temperature``, ``top_p``,
            ``top_k``, ``seed``, ``stop``); a request's own fields override them.
        chat_template: as the collector's ``RolloutConfig.chat_template`` (None: the tokenizer's).
        chat_template_kwargs: extra template variables of every rendering, as the collector's
            ``RolloutConfig.chat_template_kwargs`` (Qwen3's ``{"enable_thinking": False}``; None: none).
        session_timeout_s: seconds without a request after which a session ends by itself.
        max_model_len: the context budget of a trajectory (tokens).
        max_response_tokens: sampled tokens per segment (None: no limit but ``max_model_len``).
        max_observation_tokens: each ``tool`` message's content is cut to this many tokens, as the
            collector cuts an env's observations (``RolloutConfig.max_observation_tokens``); the
            segment's ``info["observation_tokens_cut"]`` counts what was left out.
        host, port: where to listen (port 0: a free port).
        env_id: the trajectories' ``env_id``.
        weight_version: read when each turn is sampled (default: the engine's ``weight_version``, else 0).
        eos_token_ids: the model's EOS ids (default: the engine's ``eos_token_ids``, else the tokenizer's).
        scorer: ``scorer(messages, meta) -> float`` (or an awaitable), called at the end of a session
            that reported no reward; ``messages`` is the client's last conversation with the last
            returned assistant message. An exception is kept in ``info["scorer_error"]``.
        model_name: the model id ``/v1/models`` lists and responses name.
        on_end: ``on_end(session_id, trajectories)``, called as each session ends (end, HTTP end,
            timeout, :meth:`end_open_sessions`); the trajectories are then handed over, not kept for
            :meth:`pop_ended` (:meth:`end_session` still returns them). If it raises they are kept.
        http_sessions: serve ``POST /v1/sessions``, so that any program that reaches the port can
            open sessions (``chatgym gateway``); off, only :meth:`open_session` opens them.

    Ended sessions: :meth:`end_session` (or ``POST .../end``) ends a session and returns one
    :class:`Trajectory` per segment, in order, filled as the collector fills one, plus
    ``info["segment"]`` (k), ``info["segments"]`` (n), ``timing["serve_s"]`` (seconds the server
    spent on the segment's requests, from reading the body to the encoded answer; ``render_s`` and
    ``generate_s`` are parts of it), ``info["session_id"]``, ``info["ended_by"]``
    (``end`` / ``timeout``), ``info["gateway_*"]`` counters (``requests``, ``bad_requests``,
    ``engine_errors``, ``rewrites``, ``parser_errors``, ``tool_choice_not_enforced``; a counter appears
    once it is non-zero); ``reward`` is the reported one
    (else the scorer's, else 0.0 with ``info["reward_missing"] = True``) and sits on the last turn of
    ``rewards``. A session that times out fails its trajectories with ``error_kind="timeout"`` (as
    the collector fails a stuck episode); they wait until :meth:`end_session` of that id or
    :meth:`pop_ended` collects them. A session ended over HTTP waits likewise. The last segment of
    an ended session that was not truncated is ``terminated``.

    Raises:
        TemplateError: the chat template fits neither delta mode (as the collector refuses it).
        ValueError: an unknown parser name or a bad budget (``max_model_len`` < 2, a
            ``max_response_tokens`` or ``max_observation_tokens`` < 1, ``session_timeout_s`` <= 0).
    """

    def __init__(
        self, engine: Engine, tokenizer: Any, *, parser: str | ToolCallParser = "hermes",
        sampling: SamplingParams | None = None, chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        session_timeout_s: float = 600.0, max_model_len: int = 4096, max_response_tokens: int | None = None,
        max_observation_tokens: int = 1024,
        host: str = "127.0.0.1", port: int = 0, env_id: str = "gateway",
        weight_version: Callable[[], int] | None = None, eos_token_ids: tuple[int, ...] | None = None,
        scorer: Callable[[list[Any], Any], Any] | None = None, model_name: str = "chatgym",
        on_end: Callable[[str, list[Trajectory]], Any] | None = None, http_sessions: bool = False,
    ):
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        if max_response_tokens is not None and max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be >= 1 or None, got {max_response_tokens}")
        if not isinstance(max_observation_tokens, int) or max_observation_tokens < 1:
            raise ValueError(f"max_observation_tokens must be an int >= 1, got {max_observation_tokens!r}")
        if not session_timeout_s > 0:
            raise ValueError(f"session_timeout_s must be > 0, got {session_timeout_s}")
        self.engine, self.tokenizer = engine, tokenizer
        self.parser = get_parser(parser) if isinstance(parser, str) else parser
        self.sampling = sampling or SamplingParams()
        engine_eos = tuple(sorted(getattr(engine, "eos_token_ids", None) or ()))
        self.eos_token_ids = tuple(eos_token_ids or engine_eos or resolve_eos_ids(tokenizer))
        self._eos = frozenset(self.eos_token_ids)
        renderer = ChatRenderer(tokenizer, chat_template, chat_template_kwargs)
        self.rendering = Rendering(renderer, probe_template(renderer, self.eos_token_ids), max_model_len,
                                   max_response_tokens, max_observation_tokens)
        self.session_timeout_s = session_timeout_s
        self.host, self.port, self.env_id, self.model_name = host, port, env_id, model_name
        self.weight_version = weight_version or (lambda: int(getattr(engine, "weight_version", 0)))
        self.scorer, self.on_end, self.http_sessions = scorer, on_end, http_sessions
        self.on_end_errors: list[str] = []
        self._sessions: dict[str, Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._ended: dict[str, list[Trajectory]] = {}
        self._runner: web.AppRunner | None = None
        self._reaper: asyncio.Task | None = None
        self._closing = False

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> str:
        """Start listening; returns the base URL ``"http://<host>:<port>/v1"``."""
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_openai_errors])
        for prefix in ("", "/s/{sid}"):
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_get(prefix + "/v1/models", self._models)
        if self.http_sessions:
            app.router.add_post("/v1/sessions", self._open_route)
        app.router.add_post("/v1/sessions/{sid}/reward", self._reward)
        app.router.add_post("/v1/sessions/{sid}/end", self._end_route)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._reaper = asyncio.create_task(self._reap())
        return f"http://{self.host}:{self.port}/v1"

    async def stop(self) -> None:
        """Stop the server and the timeout task (open sessions stay; :meth:`end_session` still works)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def stop_accepting(self) -> None:
        """From now on answer new sessions and chat requests with HTTP 503 (shutdown: call it before
        :meth:`end_open_sessions`, so no session opens or gets a turn after); those in flight finish."""
        self._closing = True

    # ---- sessions -----------------------------------------------------------------------------

    def open_session(self, task_id: Any = None, group_id: int = 0, sample_index: int = 0, meta: Any = None,
                     sampling_seed: int | None = None) -> str:
        """Open a session; returns its id (``secrets.token_urlsafe(24)``: the agent's API key).

        ``sampling_seed``: a request that names no ``seed`` is sampled with the collector's seed of its
        place, ``request_seed(sampling_seed, group_id, sample_index, turn)`` (``turn``: the turns the
        session sampled before it, over all its segments; a request that failed sampled none, so its
        retry gets the same seed); the session thus samples as the collector's episode ``(group_id,
        sample_index)`` of a request with that sampling seed. None: the gateway's default seed.
        """
        sid = secrets.token_urlsafe(24)
        self._sessions[sid] = Session(sid, self.env_id, task_id, group_id, sample_index, meta,
                                      sampling_seed=sampling_seed)
        self._locks[sid] = asyncio.Lock()
        return sid

    def set_reward(self, sid: str, reward: float) -> None:
        """Report the session's reward (a finite number; the last report wins). Works until its
        trajectories are collected.

        Raises:
            SessionEnded: unknown id, or trajectories already collected.
            ValueError: ``reward`` is not a finite number.
        """
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"reward must be a finite number, got {reward!r}")
        if sid in self._sessions:
            self._sessions[sid].reward = float(reward)
        elif sid in self._ended:
            for traj in self._ended[sid]:
                set_reward(traj, float(reward))
        else:
            raise SessionEnded(sid)

    async def end_session(self, sid: str) -> list[Trajectory]:
        """End the session (after its request in flight, if any) and collect its trajectories, one per
        segment (empty when the agent made no request); a session that already ended (timeout, HTTP
        end) gives the trajectories it left.

        Raises:
            SessionEnded: unknown id, or its trajectories were already collected.
        """
        return await self.end_session_as(sid, "end")

    async def end_open_sessions(self, ended_by: str = "shutdown") -> dict[str, list[Trajectory]]:
        """End every open session (after its request in flight) with ``info["ended_by"] = ended_by``;
        returns ``{session_id: trajectories}`` (also handed to ``on_end`` / kept, as any end)."""
        # One ended meanwhile (timeout, HTTP end) was handed over already; ending it again would raise.
        return {sid: await self.end_session_as(sid, ended_by) for sid in list(self._sessions) if sid in self._sessions}

    async def end_session_as(self, sid: str, ended_by: str) -> list[Trajectory]:
        """:meth:`end_session` recording ``ended_by`` (``"end"``: what :meth:`end_session` records).

        Raises:
            SessionEnded: as :meth:`end_session`.
        """
        if sid in self._sessions:
            trajs = await self._finish(sid, ended_by)
            return self._ended.pop(sid, trajs)
        if sid not in self._ended:
            raise SessionEnded(sid)
        return self._ended.pop(sid)

    def pop_ended(self) -> dict[str, list[Trajectory]]:
        """Collect the trajectories of every session that ended by itself or over HTTP and was not
        collected yet: ``{session_id: trajectories}``."""
        out, self._ended = self._ended, {}
        return out

    @property
    def open_sessions(self) -> list[str]:
        """Ids of the sessions not ended yet."""
        return list(self._sessions)

    async def _finish(self, sid: str, ended_by: str) -> list[Trajectory]:
        async with self._locks[sid]:
            session = self._sessions.pop(sid, None)
            if session is None:  # ended while we waited for its lock
                return self._ended.get(sid, [])
            self._locks.pop(sid, None)
            reward = session.reward
            info: dict[str, Any] = {}
            if reward is None and self.scorer is not None and session.segments:
                try:
                    value = self.scorer(messages_view(session.segments), session.meta)
                    reward = float(await value if inspect.isawaitable(value) else value)
                except Exception as exc:  # a scorer bug loses the reward, never the trajectories
                    info["scorer_error"] = f"{type(exc).__name__}: {exc}"
            trajs = session.finish(ended_by, reward, timeout_s=self.session_timeout_s)
            for traj in trajs:
                traj.info.update(info)
            self._hand_over(sid, trajs)
            return trajs

    def _hand_over(self, sid: str, trajs: list[Trajectory]) -> None:
        """To ``on_end`` when there is one, else (or when it raises) kept for collection."""
        if self.on_end is not None:
            try:
                self.on_end(sid, trajs)
                return
            except Exception as exc:  # a failing sink must not lose the session
                self.on_end_errors.append(f"{sid}: {type(exc).__name__}: {exc}")
        self._ended[sid] = trajs

    async def _reap(self) -> None:
        tick = min(1.0, self.session_timeout_s / 4)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for sid, session in list(self._sessions.items()):
                lock = self._locks.get(sid)
                if lock is not None and not lock.locked() and now - session.last_seen > self.session_timeout_s:
                    await self._finish(sid, "timeout")

    # ---- HTTP ---------------------------------------------------------------------------------

    def _session_of(self, request: web.Request) -> tuple[str, Session, asyncio.Lock]:
        sid = request.match_info.get("sid") or request.headers.get("X-Chatgym-Session")
        if not sid:
            auth = request.headers.get("Authorization", "")
            sid = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        session = self._sessions.get(sid or "")
        if session is None:
            raise api.unauthorized(sid)
        return sid, session, self._locks[sid]  # type: ignore[index]

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "chatgym"}]})

    async def _open_route(self, request: web.Request) -> web.Response:
        try:
            raw = await request.read()
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            err = api.bad(f"We could not parse the JSON body of your request ({exc}).", None, None)
            return web.json_response(err.body(), status=err.status)
        try:
            kwargs = api.session_fields(body)
            if self._closing:  # after the last await: none opens once end_open_sessions took its list
                raise api.shutting_down()
        except api.ApiError as err:
            return web.json_response(err.body(), status=err.status)
        sid = self.open_session(**kwargs)
        return web.json_response({"session_id": sid, "base_url": f"http://{self.host}:{self.port}/s/{sid}/v1"})

    async def _reward(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            reward = body.get("reward") if isinstance(body, dict) else None
            try:
                self.set_reward(request.match_info["sid"], reward)  # type: ignore[arg-type]
            except ValueError as exc:
                raise api.bad(str(exc), "reward") from None
            except SessionEnded:
                raise api.unauthorized(request.match_info["sid"]) from None
        except api.ApiError as err:
            return web.json_response(err.body(), status=err.status)
        return web.json_response({"ok": True})

    async def _end_route(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        if sid not in self._sessions:
            err = api.unauthorized(sid)
            return web.json_response(err.body(), status=err.status)
        trajs = await self._finish(sid, "end")
        return web.json_response({"session_id": sid, "trajectories": [t.to_json() for t in trajs]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        session: Session | None = None
        t0 = time.perf_counter()
        try:
            sid, session, lock = self._session_of(request)
            body = await _json_body(request)
            chat = api.parse_request(body)
            if self._closing:  # no await from here to the lock's queue: one that passes is served first
                raise api.shutting_down()
            waited = time.perf_counter()
            async with lock:
                waited = time.perf_counter() - waited
                if sid not in self._sessions:
                    raise api.unauthorized(sid)
                session.last_seen = time.monotonic()
                try:
                    answer = await self._complete(session, chat)
                    response = None if chat.stream else web.json_response(answer)
                    # The server's own time for the request (body, plan, sample, answer, JSON), so a
                    # benchmark can tell it from the client's; the wait for the session's lock is not ours.
                    timing = session.segments[-1].traj.timing
                    timing["serve_s"] = timing.get("serve_s", 0.0) + time.perf_counter() - t0 - waited
                finally:
                    session.last_seen = time.monotonic()
        except api.ApiError as err:
            if session is not None and err.status == 400:
                session.count("bad_requests")
            return web.json_response(err.body(), status=err.status)
        return response if response is not None else await _stream(request, answer)

    # ---- one completion -----------------------------------------------------------------------

    async def _complete(self, session: Session, chat: api.ChatRequest) -> dict[str, Any]:
        """Plan, sample, book and answer one request (the session's lock is held)."""
        session.count("requests")
        if chat.tool_choice in ("required", "function"):
            session.count("tool_choice_not_enforced")
        max_tokens = chat.max_tokens or self.sampling.max_tokens
        t0 = time.perf_counter()
        try:
            plan = session.plan(chat, self.rendering, max_tokens)
        except ConversationRefused as exc:  # the template's own raise_exception: a conversation it refuses
            raise api.bad(f"the chat template refused these messages: {exc}", "messages") from exc
        except TemplateError as exc:
            raise api.ApiError(500, f"the chat template cannot render these messages: {exc}", None,
                               "template_error") from exc
        except jinja2.TemplateError as exc:
            raise api.bad(f"the chat template refused these messages: {exc}", "messages") from exc
        render_s = time.perf_counter() - t0
        if plan.budget is None:
            returned: dict[str, Any] = {"role": "assistant", "content": ""}
            seg = session.commit(plan, chat, api.as_history_message(returned), None, "")
            seg.traj.timing["render_s"] += render_s
            return self._answer(session, plan, returned, "length", None, chat)
        turn = await self._sample(session, plan, chat)
        text = self.tokenizer.decode(turn.text_ids, skip_special_tokens=False)
        parsed = None
        if chat.tools:
            try:
                # Ids count on over the session (not per turn), as an env's do over its episode.
                parsed = session.numbered(self.parser.parse(text), chat)
            except Exception:  # a parser bug: the agent gets the text as content, never a 500
                session.count("parser_errors")
        returned = api.returned_message(parsed, text)
        seg = session.commit(plan, chat, api.as_history_message(returned), turn, text)
        seg.traj.timing["render_s"] += render_s
        if parsed is not None:
            session.book_calls(parsed)
            tool_counts(seg, len(parsed.calls), len(parsed.errors))
        # A turn cut by a budget says so even when the cut text holds complete calls (OpenAI's rule).
        finish = "tool_calls" if returned.get("tool_calls") and turn.finish_reason != "length" else turn.finish_reason
        return self._answer(session, plan, returned, finish, turn, chat)

    async def _sample(self, session: Session, plan: Plan, chat: api.ChatRequest) -> Turn:
        """One turn from the engine, checked as the collector checks it; failures are 500s that leave
        the session unchanged."""
        budget = plan.budget
        assert budget is not None
        defaults = self.sampling
        stop = chat.stop if chat.stop is not None else defaults.stop
        params = SamplingParams(
            max_tokens=budget.limit,
            temperature=defaults.temperature if chat.temperature is None else chat.temperature,
            top_p=defaults.top_p if chat.top_p is None else chat.top_p,
            top_k=defaults.top_k,
            stop_token_ids=self.eos_token_ids,
            seed=self._seed(session, chat),
            logprobs=True,
            stop=stop,
        )
        index = len(plan.segment.traj.finish_reasons) if plan.segment is not None else 0
        version = int(self.weight_version())
        t = time.perf_counter()
        try:
            completion = await self.engine.generate(list(plan.prompt_ids), params)
            turn = sampled_turn(completion, index=index, budget=budget, version=version,
                                generate_s=time.perf_counter() - t, tokenizer=self.tokenizer,
                                stop_strings=stop, eos=self._eos)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            session.count("engine_errors")
            detail = str(exc) if isinstance(exc, EpisodeFailure) else f"{type(exc).__name__}: {exc}"
            raise api.ApiError(500, f"the engine failed: {detail}", None, "engine_error") from exc
        if turn.finish_reason == "abort":
            session.count("engine_errors")
            raise api.ApiError(500, "the engine aborted the request", None, "engine_abort")
        return turn

    def _seed(self, session: Session, chat: api.ChatRequest) -> int | None:
        """The request's own seed, else the session's seed rule, else the gateway's default."""
        if chat.seed is not None:
            return chat.seed
        if session.sampling_seed is not None:
            return request_seed(session.sampling_seed, session.group_id, session.sample_index, session.sampled)
        return self.sampling.seed

    def _answer(self, session: Session, plan: Plan, returned: dict[str, Any], finish: str, turn: Turn | None,
                chat: api.ChatRequest) -> dict[str, Any]:
        seg = session.current
        assert seg is not None
        ids = turn.token_ids if turn is not None else []
        logprobs = None
        if chat.logprobs:
            lps = turn.logprobs if turn is not None else []
            logprobs = api.token_logprobs(self.tokenizer, ids, lps, chat.top_logprobs)
        extra = {"segment": len(session.segments) - 1, "turn": len(seg.traj.finish_reasons) - 1 if turn else None,
                 "new_segment": plan.segment is None, "rewrite": plan.rewrite}
        return api.completion_body(model=self.model_name, message=returned, finish_reason=finish,
                                   prompt_tokens=len(plan.prompt_ids), completion_tokens=len(ids),
                                   logprobs=logprobs, extra=extra)


@web.middleware
async def _openai_errors(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    """Every error in OpenAI's shape: aiohttp's own (404 unknown route, 405, 413 body too large) with
    their status, and an unexpected exception as a 500 ``internal_error`` (the session's state is only
    changed after a turn is sampled, by code that does not raise on a client's input)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err = api.ApiError(exc.status, f"{exc.reason}: {request.method} {request.path}", None, None)
    except Exception as exc:
        err = api.ApiError(500, f"internal error: {type(exc).__name__}: {exc}", None, "internal_error")
    return web.json_response(err.body(), status=err.status)


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise api.bad(f"We could not parse the JSON body of your request ({exc}).", None, None) from None


async def _stream(request: web.Request, answer: dict[str, Any]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in api.stream_chunks(answer):
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
