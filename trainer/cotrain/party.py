"""The other party of a co-trained episode (a judge, a simulated user): its samples as trajectories,
and its rewards. The driver is :mod:`chatgym.trainer.cotrain.loop`.

**The party's trajectory** (:func:`trace_trajectory`) is token-exact: ``prompt_ids`` (loss mask 0)
then the ids its engine sampled (loss mask 1, their logprobs), one turn, its reward on the last
sampled token. Its group (the GRPO baseline) is the policy episode's group and the party's turn in
it (``question_turn`` for a judge, the reply's index for a user): the party's samples that answered
the same task at the same point of the dialogue.

**The party's reward** (a party sample with no reward, ``None``, is not trained on):

- ``judge``: agreement with a reference rating, ``1 - |r - r_ref| / 9`` for a parsed rating ``r``
  (MT-bench's ``[[r]]``, 1..10), 0 for a reply with no valid rating. ``r_ref`` is the rating the
  rule-based :class:`~chatgym.envs.judge.env.ReferenceF1Judge` gives the same rubric prompt
  (``1 + round(9 * F1)`` of the judged answer against MT-bench's reference answer), so only prompts
  with a reference answer are scored (use ``split: reference``).
- ``user``: faithfulness to the scenario (:func:`faithfulness`): a user may state only facts its
  instructions or the dialogue gave it, and should state the ones it knows. Facts are the
  identifier-like tokens (a digit, ``_`` or ``@`` in them: user ids, reservation/order codes,
  e-mails, amounts). For a reply: ``grounded`` = share of the facts it states that occur in its own
  view (scenario + dialogue so far; 1 when it states none), ``coverage`` = share of the scenario's
  ``Known info`` facts the user stated in any reply of the episode (1 when there are none); reward
  = ``0.5 * grounded + 0.5 * coverage``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from chatgym.trainer.engines.prefill import PrefillResponder
from chatgym.trainer.rollout.types import Trajectory

# The env keyword argument the party is passed as, and the info key its samples come back under.
PARTIES = {"judge": ("judge", "judge_traces"), "user": ("user", "user_traces")}


# ---- the party's samples as trajectories ----------------------------------------------------------


class VersionedResponder(PrefillResponder):
    """:class:`~chatgym.trainer.engines.prefill.PrefillResponder` (``trace=True``) whose traces also
    name the engine's ``weight_version`` when the reply was requested (the party learner's version
    that sampled it).

    Args:
        prefill: text the reply starts with, sent to the engine as prompt tokens after the assistant
            header (so loss mask 0 in the party's trajectory); the returned message is ``prefill`` +
            the sampled text. ``"Rating: [["`` makes a small judge answer in MT-bench's format.
        engine, tokenizer, kwargs: as :class:`~chatgym.trainer.engines.responder.EngineResponder`.
    """

    def __init__(self, engine: Any, tokenizer: Any = None, *, prefill: str = "", **kwargs: Any):
        super().__init__(engine, tokenizer, trace=True, prefill=prefill, **kwargs)

    async def respond_with_trace(self, messages: list[Any]) -> tuple[Any, dict[str, Any] | None]:
        version = int(getattr(self.engine, "weight_version", 0))
        message, trace = await super().respond_with_trace(messages)
        if trace is not None:
            trace.update(weight_version=version)
        return message, trace


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
    from chatgym.envs.judge.env import ReferenceF1Judge, parse_rating

    reply = await ReferenceF1Judge().respond(list(messages))
    return parse_rating(reply["content"])[0]


async def trace_reference(trace: dict[str, Any]) -> float | None:
    """A judge sample's reference rating: ``trace["reference_rating"]``, which Judge-v0 and
    :func:`~chatgym.trainer.cotrain.calibration.calibration_episodes` record with the task's own rule-based judge
    (:func:`~chatgym.envs.judge.env.reference_rating`); a trace without it is rated by
    :func:`reference_rating` (MT-bench's rubric) and keeps the value, so the reward and the
    evaluation's metrics read one value (and the trace files show it)."""
    if "reference_rating" not in trace:
        trace["reference_rating"] = await reference_rating(trace.get("messages", []))
    return trace["reference_rating"]


async def judge_agreement(traces: list[dict[str, Any]]) -> list[float | None]:
    """Per judge sample: ``1 - |rating - reference| / 9``; 0.0 when the sample has no valid rating or
    one above its rubric's ``trace["rating_top"]`` (:func:`~chatgym.envs.judge.env.rating_top`: the
    arithmetic rubric offers 9 and 1, and a ``[[10]]`` that counted rewarded the token ``1`` on right
    and wrong answers alike); None when the prompt has no reference rating (not trained on)."""
    out: list[float | None] = []
    for trace in traces:
        ref = await trace_reference(trace)
        rating = trace.get("rating")
        if ref is None:
            out.append(None)
        elif rating is None or rating > trace.get("rating_top", 10):
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


def faithfulness_parts(traces: list[dict[str, Any]]) -> tuple[list[float], float]:
    """``(grounded per reply, coverage)`` of one episode's simulated-user replies (module docstring)."""
    stated_all: set[str] = set()
    for trace in traces:
        stated_all |= facts(trace.get("text", ""))
    known = known_facts(traces[0].get("messages", [])) if traces else set()
    coverage = len(known & stated_all) / len(known) if known else 1.0
    grounded = []
    for trace in traces:
        stated = facts(trace.get("text", ""))
        seen: set[str] = set()
        for m in trace.get("messages", []):
            seen |= facts(m.get("content") or "")
        grounded.append(len(stated & seen) / len(stated) if stated else 1.0)
    return grounded, coverage


def faithfulness(traces: list[dict[str, Any]]) -> list[float]:
    """Per simulated-user reply of one episode: ``0.5 * grounded + 0.5 * coverage`` (module docstring)."""
    grounded, coverage = faithfulness_parts(traces)
    return [0.5 * g + 0.5 * coverage for g in grounded]


def user_checks(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """What a simulated user's faithfulness is made of, and whether it beats a user that ignores its
    scenario, over the episodes of ``trajs`` with user replies (failed ones give none):

    - ``user/grounded`` (mean over replies) and ``user/coverage`` (mean over episodes): the two halves.
    - ``user/blind_faithfulness``: the faithfulness of a user that ignores its scenario and states no
      identifier (grounded 1, coverage 0 where there are known facts), which a user that cannot
      know the scenario's identifiers cannot beat by stating any; mean over replies.
    - ``user/faithfulness_over_blind``: the replies' mean faithfulness minus that.
    - ``user/opening_distinct``: distinct opening replies / episodes (1: every episode opened in its
      own words; a constant user: ``1 / episodes``). Read on the held-out set, one greedy episode a
      scenario.

    ``{}`` when no episode has a user reply."""
    replies: list[float] = []
    grounded: list[float] = []
    coverage: list[float] = []
    blind: list[float] = []
    openings: list[str] = []
    for t in trajs:
        traces = list(t.info.get("user_traces") or []) if not t.failed else []
        if not traces:
            continue
        g, c = faithfulness_parts(traces)
        replies += [0.5 * x + 0.5 * c for x in g]
        grounded += g
        coverage.append(c)
        no_known = not known_facts(traces[0].get("messages", []))
        blind += [0.5 + 0.5 * no_known] * len(traces)
        openings.append(str(traces[0].get("text", "")))
    if not replies:
        return {}
    return {
        "user/grounded": float(np.mean(grounded)),
        "user/coverage": float(np.mean(coverage)),
        "user/blind_faithfulness": float(np.mean(blind)),
        "user/faithfulness_over_blind": float(np.mean(replies) - np.mean(blind)),
        "user/opening_distinct": len(set(openings)) / len(openings),
    }


async def _faithfulness(traces: list[dict[str, Any]]) -> list[float | None]:
    return list(faithfulness(traces))


REWARDS: dict[str, RewardFn] = {"judge": judge_agreement, "user": _faithfulness}


def best_constant_agreement(references: Sequence[float], top: int = 10) -> tuple[float, float]:
    """``(agreement, rating)`` of the best judge that ignores its input: the constant rating ``c`` in
    ``1..top`` (the rubric's ratings: :func:`~chatgym.envs.judge.env.rating_top`) with the highest mean
    ``1 - |c - ref| / 9`` over ``references`` (the lowest such ``c`` on a tie). A co-trained judge whose agreement does not beat it has learned no more than the
    references' distribution (the check issue 32 asks of a judge that "moves").

    Raises:
        ValueError: ``references`` is empty.
    """
    if not references:
        raise ValueError("best_constant_agreement needs at least one reference rating")
    # Ties compared on the summed distance (exact for whole ratings), not on float means whose last
    # bit depends on the order of the references.
    distance, c = min((sum(abs(c - float(r)) for r in references), c) for c in range(1, top + 1))
    return 1.0 - distance / 9.0 / len(references), float(c)


async def judge_constant_baseline(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """The judge's agreement against a constant rating's, over every judge sample of ``trajs`` whose
    prompt has a reference rating (failed episodes give none): ``judge/rating_distinct`` (distinct
    valid ratings among them), ``judge/best_constant_agreement`` and ``judge/best_constant_rating``
    (:func:`best_constant_agreement` on their references, over the lowest ``rating_top`` among them),
    and ``judge/agreement_over_constant`` (their mean :func:`judge_agreement`, the reward's, minus the
    best constant's). ``{}`` when no sample has a reference."""
    traces = []
    for t in trajs:
        if t.failed:
            continue
        for trace in t.info.get("judge_traces") or []:
            if await trace_reference(trace) is not None:
                traces.append(trace)
    if not traces:
        return {}
    refs = [trace["reference_rating"] for trace in traces]
    ratings = [trace.get("rating") for trace in traces]
    constant, c = best_constant_agreement(refs, min(int(trace.get("rating_top", 10)) for trace in traces))
    agreement = np.mean(await judge_agreement(traces))
    return {
        "judge/rating_distinct": float(len({float(r) for r in ratings if r is not None})),
        "judge/best_constant_agreement": constant,
        "judge/best_constant_rating": c,
        "judge/agreement_over_constant": float(agreement) - constant,
    }


async def policy_reference_metrics(
    trajs: Sequence[Trajectory], *, failed_as_miss: bool = False
) -> dict[str, float]:
    """``policy/reference_reward``: the policy's Judge-v0 return had the rule-based reference judge
    rated it (the reference rating of each question turn's last judge sample, ``(r - 1) / 9 /
    n_turns`` summed over the question turns judged) — a fixed yardstick while the co-trained judge
    moves. Mean over the episodes whose judged turns all have a reference rating, and with
    ``failed_as_miss`` (the held-out evaluation, as ``eval/score`` counts them) the failed episodes
    as 0 (left out, a policy whose episodes crash would look better)."""
    values = []
    for t in trajs:
        traces = t.info.get("judge_traces") or []
        if t.failed and failed_as_miss:
            values.append(0.0)
            continue
        if t.failed or not traces:
            continue
        last = {int(trace.get("question_turn", 0)): trace for trace in traces}  # later samples win
        n = len(t.info.get("ratings") or []) or len(last)
        refs = [await trace_reference(trace) for trace in last.values()]
        if all(r is not None for r in refs):
            values.append(sum((r - 1.0) / 9.0 / n for r in refs))
    return {"policy/reference_reward": float(np.mean(values))} if values else {}
