"""One gateway session: its segments, each a token-exact trajectory built as the collector builds one.

A request's messages either **extend** the current segment — its first messages are, structurally
(:func:`~chatgym.trainer.gateway.openai_api.same_message`), the previous request's messages plus the
assistant message the gateway returned, and the tools are the same — or they open a **new segment**.

* Extension: the prompt is the segment's ids so far (the previous turn's sampled ids exactly), the
  ids that close that turn (:func:`~chatgym.trainer.chat.delta.closing_ids`) and the chat-template
  delta of the new messages (:meth:`~chatgym.trainer.chat.delta.ChatRenderer.delta_ids`, after the
  segment's history in which each assistant turn is its decoded text, as in the collector).
* New segment (the first request, or a history the agent rewrote: a dropped, summarised or edited
  message, an assistant message other than the one returned, other tools): the whole conversation is
  rendered afresh (:meth:`~chatgym.trainer.chat.delta.ChatRenderer.prompt_ids`). The segment before it
  keeps what it had; its ``info["segment_end"]`` is ``"history_rewritten"`` and ``info["rewrite"]``
  says what differed.

Tool results, as the collector's env observations: each ``tool`` message's content is cut to
``max_observation_tokens`` tokens with the collector's marker
(:func:`~chatgym.trainer.rollout.episode.cut_observation`), in an extension's new messages and in a
fresh prompt alike; the segment's history holds the cut text, its ``expected`` the client's own
messages (so the agent, which keeps the whole result, still extends the segment), and
``info["observation_tokens_cut"]`` counts the tokens left out. The agent's own messages (system,
user) are its prompt and are never cut.

Budgets, as the collector's: an extension whose closing + delta ids would leave no token of
``max_model_len`` is not appended (``truncated_by="max_model_len"``,
``info["dropped_observation_tokens"]``); a spent ``max_response_tokens`` truncates likewise; a fresh
prompt that fills the context is a failed segment (``error_kind="prompt_too_long"``). A truncated
segment is *full*: a request that extends it is answered ``finish_reason="length"`` with empty
content and no turn; a rewritten history (an agent compacting its context) opens a new one.

Nothing is changed before a turn is sampled: :meth:`Session.plan` computes the prompt, the caller
samples, then :meth:`Session.commit` books it. A request that fails (engine error) leaves the session
as it was, so the agent can retry.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chatgym.envs.messages import Message
from chatgym.envs.parsers import ParsedAction, call_ids
from chatgym.trainer.chat.delta import ChatRenderer, closing_ids
from chatgym.trainer.chat.template_probe import TemplateProbe
from chatgym.trainer.gateway.openai_api import ChatRequest, same_message
from chatgym.trainer.rollout.episode import cut_observation, fail
from chatgym.trainer.rollout.turn import Turn, TurnBudget
from chatgym.trainer.rollout.types import Trajectory


@dataclass(frozen=True)
class Rendering:
    """What a session renders with: the collector's renderer and probe, and the budgets (tokens;
    ``max_observation_tokens``: each tool message's content)."""

    renderer: ChatRenderer
    probe: TemplateProbe
    max_model_len: int
    max_response_tokens: int | None
    max_observation_tokens: int

    def cut_tool_results(self, messages: Sequence[Message]) -> tuple[list[Message], dict[str, int]]:
        """``messages`` with each ``tool`` message cut to ``max_observation_tokens``, and the counts to
        add to the segment's info (``observation_tokens_cut``; empty when nothing was cut)."""
        counts: dict[str, int] = {}
        cut = cut_observation(self.renderer.tokenizer, list(messages), self.max_observation_tokens, counts,
                              roles=("tool",))
        return cut, counts


@dataclass
class Segment:
    """One trajectory of a session and what extending it needs.

    Attributes:
        traj: the trajectory being built.
        history: the conversation as the collector keeps it (assistant turns as their decoded text).
        expected: the client's view: the last request's messages plus the returned assistant message.
        tools: the tool schemas the segment's prompt was rendered with.
        last_ids: the last turn's sampled ids (None before the first turn).
        generated: sampled tokens over the segment's turns.
        full: a budget is spent; extensions get no more turns.
    """

    traj: Trajectory
    history: list[Message]
    expected: list[Message]
    tools: list[dict[str, Any]] | None
    last_ids: list[int] | None = None
    generated: int = 0
    full: bool = False


@dataclass
class Plan:
    """The prompt of one request, computed without changing the session.

    Attributes:
        prompt_ids: the whole prompt the engine gets.
        added: the ids appended to the segment (closing + delta, or the fresh prompt), loss mask 0.
        new: the request's messages after the segment's ``expected`` (all of them for a new segment),
            tool results cut to ``max_observation_tokens``: what the segment's history gets.
        counts: info counters of the cut (``observation_tokens_cut``), added at :meth:`Session.commit`.
        segment: the segment it extends, or None for a new one.
        rewrite: why a new segment was opened on a rewritten history (None: first or an extension).
        budget: the turn's budget; None when no turn is sampled (``stop`` says why).
        stop: ``"max_model_len"``, ``"max_response_tokens"`` or ``"full"`` when no turn is sampled.
        closing: how many of ``added`` close the previous turn.
        max_model_len: the context budget the plan was made under (for the error message).
    """

    prompt_ids: list[int]
    added: list[int]
    new: list[Message]
    segment: Segment | None
    rewrite: str | None
    budget: TurnBudget | None
    stop: str | None = None
    closing: int = 0
    max_model_len: int = 0
    counts: dict[str, int] = field(default_factory=dict)


def rewrite_reason(seg: Segment, request: ChatRequest) -> str | None:
    """Why ``request`` does not extend ``seg`` (None: it does)."""
    if (request.tools or None) != (seg.tools or None):
        return "the tools differ from the segment's"
    for i, (sent, want) in enumerate(zip(request.messages, seg.expected, strict=False)):
        if not same_message(sent, want):
            what = "the assistant message returned" if i == len(seg.expected) - 1 else "the history"
            return f"message {i} ({sent['role']}) differs from {what}"
    if len(request.messages) < len(seg.expected):
        return f"{len(request.messages)} messages, fewer than the {len(seg.expected)} already in the segment"
    return None


def _append_context(traj: Trajectory, ids: list[int]) -> None:
    traj.token_ids.extend(ids)
    traj.loss_mask.extend([0] * len(ids))
    traj.engine_logprobs.extend([0.0] * len(ids))
    traj.weight_versions.extend([-1] * len(ids))


@dataclass
class Session:
    """A session's segments and bookkeeping (the gateway keeps one per session id).

    Attributes:
        sid: the session id; task_id, group_id, sample_index, meta: copied into each trajectory.
        env_id: the trajectories' ``env_id``.
        sampling_seed: base of the session's per-turn sampling seeds, the collector's rule
            ``request_seed(sampling_seed, group_id, sample_index, turn)`` (None: no seed rule).
        sampled: turns sampled so far over all segments (the next turn's ``turn`` in the seed rule).
        call_attempts: tool-call attempts parsed so far over all segments, malformed ones included:
            the next turn's calls are numbered from it (:meth:`numbered`).
        call_ids: the ids given to those attempts; the next turn's ids step around them and around
            the ids of the request's messages, so a call id never repeats within the session.
        segments: the session's segments in order; the last is the current one.
        opened, last_seen: ``time.monotonic()`` of the opening and of the last request.
        reward: the reported reward (None: none yet).
        counters: ``requests``, ``bad_requests``, ``engine_errors``, ``rewrites``, ``parser_errors``,
            ``tool_choice_not_enforced``, copied into each trajectory's info as ``gateway_<name>``.
    """

    sid: str
    env_id: str
    task_id: Any = None
    group_id: int = 0
    sample_index: int = 0
    meta: Any = None
    sampling_seed: int | None = None
    sampled: int = 0
    call_attempts: int = 0
    call_ids: set[str] = field(default_factory=set)
    segments: list[Segment] = field(default_factory=list)
    opened: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    reward: float | None = None
    counters: dict[str, int] = field(default_factory=dict)

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def numbered(self, parsed: ParsedAction, request: ChatRequest) -> ParsedAction:
        """``parsed`` (a turn's calls) with the env's rule of ids (:meth:`ParsedAction.numbered_from`)
        over the session: counted from :attr:`call_attempts`, stepping around :attr:`call_ids` and the
        ids in ``request``'s messages (a client's own, or those of a history it rewrote)."""
        return parsed.numbered_from(self.call_attempts, self.call_ids | call_ids(request.messages))

    def book_calls(self, parsed: ParsedAction) -> None:
        """Count the turn's call attempts (from :meth:`numbered`) and keep their ids."""
        self.call_attempts += len(parsed.calls) + len(parsed.errors)
        self.call_ids.update(c["id"] for c in parsed.all_calls())

    def plan(self, request: ChatRequest, r: Rendering, max_tokens: int) -> Plan:
        """The prompt for ``request`` (``max_tokens``: the per-turn budget asked for).

        Raises:
            TemplateError: the template cannot render the messages (the caller answers 500).
        """
        seg = self.current
        reason = None if seg is None else rewrite_reason(seg, request)
        if seg is None or reason is not None:
            messages, counts = r.cut_tool_results(request.messages)
            prompt = r.renderer.prompt_ids(messages, request.tools)
            plan = Plan(prompt, prompt, messages, None, reason, None, max_model_len=r.max_model_len, counts=counts)
            if len(prompt) >= r.max_model_len:
                plan.stop = "max_model_len"
            else:
                plan.budget = TurnBudget(max_tokens, _left(r, 0), r.max_model_len - len(prompt))
            return plan
        new, counts = r.cut_tool_results(request.messages[len(seg.expected) :])
        if seg.full:
            return Plan(list(seg.traj.token_ids), [], new, seg, None, None, "full")
        closing = closing_ids(r.probe, seg.last_ids or [])
        # No new message (the request ends with the returned turn): the delta is the next header alone.
        delta = r.renderer.delta_ids(seg.history, new, seg.tools, r.probe)
        added = closing + delta
        total = len(seg.traj.token_ids) + len(added)
        plan = Plan(list(seg.traj.token_ids) + added, added, new, seg, None, None, closing=len(closing),
                    counts=counts)
        if total >= r.max_model_len:
            plan.stop = "max_model_len"
        elif _left(r, seg.generated) <= 0:
            plan.stop = "max_response_tokens"
        else:
            plan.budget = TurnBudget(max_tokens, _left(r, seg.generated), r.max_model_len - total)
        return plan

    def commit(self, plan: Plan, request: ChatRequest, returned: Message | None, turn: Turn | None,
               text: str) -> Segment:
        """Book ``plan`` and its sampled ``turn`` (decoded ``text``; None when no turn was sampled, with
        ``returned`` the empty answer); returns the segment it went into."""
        seg = plan.segment
        if seg is None:
            seg = self._open(plan, request)
        elif plan.stop == "max_model_len":
            # As the collector: an observation that would leave no token of context is dropped.
            seg.traj.truncated = True
            seg.traj.info["truncated_by"] = "max_model_len"
            seg.traj.info["dropped_observation_tokens"] = len(plan.added)
            _add_counts(seg.traj.info, plan.counts)  # the collector counts the cut of a dropped observation too
            seg.full = True
        elif plan.stop != "full":
            _append_context(seg.traj, plan.added)
            seg.history.extend(plan.new)
            _add_counts(seg.traj.info, plan.counts)
            seg.traj.info["tool_results_total"] = seg.traj.info.get("tool_results_total", 0) + sum(
                m["role"] == "tool" for m in plan.new
            )
            if seg.traj.info["turns"]:
                seg.traj.info["turns"][-1].update(closing_tokens=plan.closing,
                                                  observation_tokens=len(plan.added) - plan.closing)
            if plan.stop == "max_response_tokens":
                seg.traj.truncated = True
                seg.traj.info["truncated_by"] = "max_response_tokens"
                seg.full = True
        if turn is not None:
            self._record(seg, turn, text)
        seg.expected = [*request.messages, *([returned] if returned is not None else [])]
        return seg

    def _open(self, plan: Plan, request: ChatRequest) -> Segment:
        prev = self.current
        if prev is not None:
            prev.traj.info["segment_end"] = "history_rewritten"
            prev.traj.info["rewrite"] = plan.rewrite
            self.count("rewrites")
        traj = Trajectory(env_id=self.env_id, task_id=self.task_id, group_id=self.group_id,
                          sample_index=self.sample_index)
        traj.timing.update(generate_s=0.0, render_s=0.0)
        _append_context(traj, plan.added)
        traj.prompt_len = len(plan.added)
        traj.info["turns"] = []
        traj.info["tool_results_total"] = sum(m["role"] == "tool" for m in plan.new)
        _add_counts(traj.info, plan.counts)
        seg = Segment(traj, list(plan.new), [], request.tools)
        traj.messages = seg.history
        if plan.stop == "max_model_len":
            traj.truncated = True
            traj.info["truncated_by"] = "max_model_len"
            fail(traj, "prompt_too_long",
                 f"the prompt has {traj.prompt_len} tokens and max_model_len is {plan.max_model_len}")
            seg.full = True
        self.segments.append(seg)
        return seg

    def _record(self, seg: Segment, turn: Turn, text: str) -> None:
        """Append the turn's sampled ids (loss mask 1, their logprobs), as the collector does."""
        traj = seg.traj
        start = len(traj.token_ids)
        traj.token_ids.extend(turn.token_ids)
        traj.loss_mask.extend([1] * len(turn.token_ids))
        traj.engine_logprobs.extend(turn.logprobs)
        traj.weight_versions.extend(turn.weight_versions)
        seg.generated += len(turn.token_ids)
        self.sampled += 1
        seg.last_ids = list(turn.token_ids)
        traj.finish_reasons.append(turn.finish_reason)
        traj.stop_reasons.append(turn.stop_reason)
        traj.info["turns"].append(turn.record(start))
        traj.timing["generate_s"] += turn.generate_s
        seg.history.append({"role": "assistant", "content": text})

    def finish(self, ended_by: str, reward: float | None, now: float | None = None,
               timeout_s: float | None = None) -> list[Trajectory]:
        """The session's trajectories, one per segment in order (see the Gateway docstring for the
        fields); ``ended_by`` is ``"end"`` or ``"timeout"``."""
        now = time.monotonic() if now is None else now
        out = []
        for k, seg in enumerate(self.segments):
            traj = seg.traj
            traj.info.update(segment=k, segments=len(self.segments), session_id=self.sid, ended_by=ended_by,
                             **{f"gateway_{key}": n for key, n in self.counters.items()})
            if self.meta is not None:
                traj.info["meta"] = self.meta
            if ended_by == "timeout" and traj.error is None:
                fail(traj, "timeout", f"the session had no request for session_timeout_s={timeout_s}")
            elif k == len(self.segments) - 1 and not traj.truncated and traj.error is None:
                traj.terminated = True
            traj.timing["total_s"] = now - self.opened
            set_reward(traj, reward)
            out.append(traj)
        return out


def set_reward(traj: Trajectory, reward: float | None) -> None:
    """Put the session's reward on ``traj``: ``reward``, and in ``rewards`` on its last turn (0.0 on the
    others, so their sum is the reward); None: 0.0 with ``info["reward_missing"] = True``."""
    value = 0.0 if reward is None else float(reward)
    n = len(traj.finish_reasons)
    traj.rewards = [0.0] * (n - 1) + [value] if n else []
    traj.reward = value
    if reward is None:
        traj.info["reward_missing"] = True
    else:
        traj.info.pop("reward_missing", None)


def _add_counts(info: dict[str, Any], counts: dict[str, int]) -> None:
    for key, n in counts.items():
        info[key] = info.get(key, 0) + n


def _left(r: Rendering, generated: int) -> int:
    return (r.max_response_tokens if r.max_response_tokens is not None else 2**62) - generated


def tool_counts(seg: Segment, calls: int, errors: int) -> None:
    """Add one turn's parsed calls and malformed calls to the segment's info counters
    (``tool_calls_total``, ``tool_errors_total``, ``tool_errors_by_kind["parse_error"]``)."""
    info = seg.traj.info
    info["tool_calls_total"] = info.get("tool_calls_total", 0) + calls
    info["tool_errors_total"] = info.get("tool_errors_total", 0) + errors
    by_kind = dict(info.get("tool_errors_by_kind") or {})
    if errors:
        by_kind["parse_error"] = by_kind.get("parse_error", 0) + errors
    info["tool_errors_by_kind"] = by_kind


def messages_view(segments: Sequence[Segment]) -> list[Message]:
    """The client's last conversation (its last request plus the returned message): what a scorer reads."""
    return list(segments[-1].expected) if segments else []
