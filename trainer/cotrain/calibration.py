"""Calibration answers: answers of known quality to the policy's own questions, rated by the
co-trained judge beside the policy's answers (``cotrain.calibration``), so that a judge's held-out
agreement can be told from a constant rating's (:func:`calibration_order`: does it rank a better
answer above a worse one to the same question). The driver is :mod:`chatgym.trainer.cotrain.loop`;
their judge samples are scored and grouped as any others by
:func:`~chatgym.trainer.cotrain.party.party_trajectories`.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from chatgym.envs.judge.arithmetic import CATEGORY as ARITHMETIC
from chatgym.envs.math.answer import ANSWER_MARK, answers_equal, extract_answer
from chatgym.trainer.rollout.types import Trajectory


def calibration_order(episodes: Sequence[Trajectory]) -> dict[str, float]:
    """Whether the judge ranks a question's calibration answers as the reference does: over every
    pair of samples of the same task whose reference ratings differ, the share the judge rated in
    the same order (strictly; a tie or an unparsed rating is a miss): ``judge/order_accuracy`` and
    ``judge/order_pairs``. A judge that ignores the answer (any constant) scores 0, a random one
    about 0.5 minus its ties; ``{}`` without such a pair. The paired form of the constant check:
    it asks whether the judge tells a better answer from a worse one to the same question, which a
    rating distribution alone cannot do."""
    by_task: dict[str, list[tuple[float, float | None]]] = {}
    for t in episodes:
        for trace in t.info.get("judge_traces") or []:
            ref = trace.get("reference_rating")
            if ref is not None:
                by_task.setdefault(str(t.task_id), []).append((float(ref), trace.get("rating")))
    pairs = right = 0
    for samples in by_task.values():
        for i, (ref_a, a) in enumerate(samples):
            for ref_b, b in samples[i + 1 :]:
                if ref_a == ref_b:
                    continue
                pairs += 1
                if a is not None and b is not None and (a - b) * (ref_a - ref_b) > 0:
                    right += 1
    return {"judge/order_accuracy": right / pairs, "judge/order_pairs": float(pairs)} if pairs else {}


_WORD = re.compile(r"\S+")


def calibration_answer(
    task: dict[str, Any],
    fraction: float,
    off_topic: dict[str, Any],
    policy_answer: str | None = None,
    negative: str = "other_gold",
) -> str:
    """An answer to ``task``'s first question turn whose quality is set, not sampled: the first
    ``ceil(fraction * n)`` words of its reference answer (``n`` words; formatting kept), so its
    token F1 is about ``2f / (1 + f)`` and its reference rating about ``1 + round(18f / (1 + f))``
    (1.0: the reference itself, rating 10); ``fraction == 0``: ``off_topic``'s reference answer (a
    fluent answer to another question).

    An arithmetic row (:mod:`~chatgym.envs.judge.arithmetic`) is judged on its final answer alone,
    so its calibration answers are the policy's own answer to it (``policy_answer``) with the final
    answer set (:func:`with_final_answer`) to the gold (any ``fraction > 0``) or to ``off_topic``'s
    gold (``fraction == 0``): the two differ only in that number, so a judge can tell them apart
    only by checking it, not by how the answer is written (bare ``<answer>n</answer>`` answers
    beside the policy's own let a CPU run rate by format: every bare answer 9, every policy answer 1).
    Without ``policy_answer`` (its episode failed): ``<answer>n</answer>``.

    ``negative="policy"`` (arithmetic only; ``cotrain.calibration_negative``): the ``fraction == 0``
    answer is the policy's own answer as written when the rule-based check finds it wrong (its final
    answer, :func:`~chatgym.envs.math.answer.extract_answer`, is not the gold by
    :func:`~chatgym.envs.math.answer.answers_equal`, or it has none), and ``off_topic``'s gold as
    above when it is right. The judge then trains on the policy's actual mistakes: twins that always
    carry another task's gold never show it an answer without a final answer, which a GPU run's
    policy learned to write and its judge rated 9 (examples/recipes/verifier_cotrain/).

    Raises:
        ValueError: ``fraction`` outside [0, 1], a task without a reference answer, or ``negative``
            not ``"other_gold"`` / ``"policy"``.
    """
    if negative not in ("other_gold", "policy"):
        raise ValueError(f"negative must be 'other_gold' or 'policy', got {negative!r}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"calibration fraction must be in [0, 1], got {fraction}")
    source = off_topic if fraction == 0.0 else task
    if not source.get("reference"):
        raise ValueError(f"{source.get('task_id')} has no reference answer to build a calibration answer from")
    text = source["reference"][0]
    if task.get("category") == ARITHMETIC:
        if negative == "policy" and fraction == 0.0 and policy_answer is not None:
            question = (task.get("turns") or [""])[0]
            if not answers_equal(extract_answer(policy_answer)[0], task["reference"][0], question):
                return policy_answer
        return with_final_answer(policy_answer or "", text)
    if fraction == 0.0:
        return text
    words = list(_WORD.finditer(text))
    keep = max(1, math.ceil(fraction * len(words) - 1e-9))  # the tolerance: 0.1 * 30 is 3, not 4
    return text[: words[keep - 1].end()]


_LAST_TAG = re.compile(r"(.*)<answer>(.*?)</answer>", re.S | re.I)  # greedy head: the last closed tag


def _without_tags(text: str) -> str:
    """``text`` with every ``<answer>`` / ``</answer>`` marker removed, until none is left (removing
    one can join its neighbours into another: ``<answer<answer>>``)."""
    while (shorter := ANSWER_MARK.sub("", text)) != text:
        text = shorter
    return text


def with_final_answer(text: str, value: str) -> str:
    """``text`` whose final answer (what :func:`~chatgym.envs.math.answer.extract_answer` reads) is
    ``value``: the content of the last closed ``<answer>`` tag replaced, or, in a text without one,
    ``<answer>value</answer>`` appended on its own line (``text`` empty: the tag alone). Every other
    ``<answer>`` / ``</answer>`` marker is removed (the text between them kept): an unclosed
    ``<answer>`` before the final tag would open the tag ``extract_answer`` reads and carry the text
    after it into the answer (three held-out "gold" twins of a GPU run read ``tags.\n<answer>19`` and
    were rated wrong by the reference: examples/recipes/verifier_cotrain/)."""
    m = _LAST_TAG.match(text)
    if m:
        head, tail = m.group(1), text[m.end() :]
        return f"{_without_tags(head)}<answer>{value}</answer>{_without_tags(tail)}"
    body = _without_tags(text).rstrip()
    return f"{body}\n<answer>{value}</answer>" if body.strip() else f"<answer>{value}</answer>"


async def calibration_episodes(
    task_ids: Sequence[str],
    fractions: Sequence[float],
    responder: Any,
    *,
    samples: int,
    tasks: Mapping[str, dict[str, Any]],
    env_id: str = "Judge-v0",
    policy_answers: Mapping[str, str] | None = None,
    judge_view: str = "reply",
    negative: str = "other_gold",
) -> list[Trajectory]:
    """The judge's ratings of calibration answers (:func:`calibration_answer`) to the first question turn of
    each task of ``task_ids``: for every (task, fraction), ``samples`` replies of ``responder`` to
    MT-bench's rubric prompt on that answer, all requested at once. Each (task, fraction) comes back
    as one :class:`Trajectory` whose ``info["judge_traces"]`` holds its samples (as an episode's
    info holds them, ``question_turn`` 0, ``rating`` parsed, ``calibration`` the fraction), so
    :func:`~chatgym.trainer.cotrain.party.party_trajectories` scores and groups them; it has no policy tokens and is never the
    policy's. ``group_id`` counts from 0 in (task, fraction) order.

    Args:
        task_ids: Judge-v0 ``task_id`` s (``"mtbench/104"``); those without a reference are skipped.
        fractions: calibration fractions, each in [0, 1].
        responder: the judge (``respond_with_trace``, e.g. :class:`VersionedResponder`).
        samples: replies per calibration prompt (a GRPO group in training, 1 greedy in evaluation).
        tasks: every Judge-v0 row by ``task_id`` (MT-bench's in file order; arithmetic: the train
            split's, then the evaluation split's); a task's off-topic partner (fraction 0) is the next
            row with a reference answer (wrapping round).
        policy_answers: the policy's answer to each task's first question turn (:func:`first_answers`),
            which an arithmetic task's calibration answers are written from.
        judge_view: Judge-v0's ``judge_view`` (``"final_answer"``: the judge sees each calibration
            answer's final answer alone, as it sees the policy's).
        negative: :func:`calibration_answer`'s ``negative`` (``cotrain.calibration_negative``).
    """
    from chatgym.envs import messages as M
    from chatgym.envs.judge.env import parse_rating, rating_top, reference_rating, rubric_prompt

    with_ref = [tid for tid, row in tasks.items() if row.get("reference")]
    position = {tid: i for i, tid in enumerate(with_ref)}
    jobs = []
    for tid in dict.fromkeys(task_ids):
        if tid not in position:
            continue
        off_topic = tasks[with_ref[(position[tid] + 1) % len(with_ref)]]
        for fraction in fractions:
            answer = calibration_answer(
                tasks[tid], fraction, off_topic, (policy_answers or {}).get(tid), negative=negative
            )
            prompt = rubric_prompt(tasks[tid], [answer], judge_view=judge_view)
            jobs.append((tid, float(fraction), [M.user(prompt)]))
    replies = await asyncio.gather(
        *(responder.respond_with_trace(view) for _, _, view in jobs for _ in range(samples))
    )
    out = []
    for k, (tid, fraction, view) in enumerate(jobs):
        ref = await reference_rating(tasks[tid], view)
        traces = []
        for message, trace in replies[k * samples : (k + 1) * samples]:
            rating, error = parse_rating(message["content"])
            traces.append(
                {**(trace or {}), "question_turn": 0, "rating": rating, "error": error, "calibration": fraction,
                 "reference_rating": ref, "rating_top": rating_top(tasks[tid])}
            )
        out.append(Trajectory(env_id=env_id, task_id=tid, group_id=k, sample_index=0, info={"judge_traces": traces}))
    return out


def first_answers(trajs: Sequence[Trajectory]) -> dict[str, str]:
    """The policy's answer to each task's first question turn: the first assistant message of the
    first episode of the task (in ``trajs`` order) that did not fail, by ``task_id``."""
    out: dict[str, str] = {}
    for t in trajs:
        if t.failed or str(t.task_id) in out:
            continue
        answer = next((m.get("content") for m in t.messages if m.get("role") == "assistant"), None)
        if isinstance(answer, str):
            out[str(t.task_id)] = answer
    return out
