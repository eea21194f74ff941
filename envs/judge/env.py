"""Judge-v0: answer MT-bench questions; a judge agent scores each answer (and may ask for a revision).

Data: MT-bench's 80 two-turn questions (:mod:`chatgym.envs.judge.mtbench`). The judge follows
MT-bench's single-answer grading (Zheng et al. 2023, arXiv:2306.05685; FastChat's ``single-v1``,
``single-math-v1`` and their multi-turn forms): a rubric prompt (``prompts/judge_*.txt``; the
``_ref`` forms carry the reference answer, used where the question has one) and a rating written
``[[r]]``, ``1 <= r <= 10``. This is generative reward modelling (GenRM): the reward is parsed from a
model's text.

Episode: the user asks turn 1; the agent answers; the judge scores the answer. With
``max_revisions > 0`` and a rating below ``accept_rating``, the judge's critique (its text without
the rating) comes back as the next user turn (``prompts/judge_feedback.txt``) and the agent revises;
the last rating of a question turn counts. Then the user asks turn 2, judged with the multi-turn
prompt on the final answers. Each question turn's reward is ``(rating - 1) / 9 / n_turns``, given on
the step that closes it, so the episode return is in [0, 1]; ``info["reward_components"]`` has one
entry per question turn and ``info["ratings"]`` every rating.

A judge reply with no valid rating is asked again (``judge_retries`` times, each a new sample); if
it still has none, the episode ends ``truncated`` with reward 0 and ``info["status"] =
"judge_error"`` and ``info["judge_error"]`` saying why — never a made-up score. Filter those
trajectories out of training (their 0 is not the agent's score).

``questions="arithmetic"`` swaps MT-bench for Math-v0's arithmetic tasks (one question turn; the
reference is the gold answer; :mod:`~chatgym.envs.judge.arithmetic`): the judge is asked only whether
the final answer is the reference's, which a 135M judge can learn where MT-bench's rubric is beyond it.

The judge is any :class:`~chatgym.envs.agents.Responder` (an engine through
``chatgym.trainer.engines.responder``, possibly the policy's own engine). A judge being trained
returns its own samples (``respond_with_trace``); they are in ``info["judge_traces"]``, each with
the rating parsed from it (``None`` when malformed) and the rule-based judge's rating of the same
prompt (``reference_rating``, None without a reference answer), so the judge can be trained too. The default
judge, :class:`ReferenceF1Judge`, is rule-based (token F1 against the reference answer), runs
offline, and can only judge questions with a reference answer: without a judge, the default split is
``"reference"``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from chatgym.envs import messages as M
from chatgym.envs.agents import Responder, ask
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome, load_prompt
from chatgym.envs.judge.arithmetic import CATEGORY, load_arithmetic
from chatgym.envs.judge.arithmetic import SPLITS as ARITHMETIC_SPLITS
from chatgym.envs.judge.mtbench import load_mtbench
from chatgym.envs.math.answer import ANSWER_MARK, answers_equal, extract_answer
from chatgym.envs.messages import Message
from chatgym.envs.parsers import ParsedAction
from chatgym.envs.search.qa_metrics import token_f1

_RATING = re.compile(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_RATING_LINE = re.compile(r"(?:\b[Rr]ating:\s*)?\[\[\s*\d+(?:\.\d+)?\s*\]\]\.?")


def parse_rating(text: str) -> tuple[float | None, str | None]:
    """The judge's rating: the LAST ``[[r]]`` in ``text`` (an earlier one may echo the format's
    example); returns ``(rating, None)`` or ``(None, why)`` when there is none or it is outside 1..10."""
    found = _RATING.findall(text)
    if not found:
        return None, f"no [[rating]] in judge output: {text[-300:]!r}"
    rating = float(found[-1])
    if not 1 <= rating <= 10:
        return None, f"judge rating {found[-1]} is outside 1..10"
    return rating, None


def rating_top(task: dict[str, Any]) -> int:
    """The highest rating ``task``'s rubric offers a model judge: 9 on the arithmetic rubric, which
    asks for ``[[9]]`` or ``[[1]]`` (see :class:`ReferenceAnswerJudge`), else MT-bench's 10. A
    co-trained judge's sample rating above it earns agreement 0 (``trace["rating_top"]``); the
    episode still reads it as a rating."""
    return 9 if task.get("category") == CATEGORY else 10


def critique_of(text: str) -> str:
    """The judge's explanation without the rating."""
    return _RATING_LINE.sub("", text).strip() or "No further comments."


def fill(template: str, values: dict[str, str]) -> str:
    """Replace ``{name}`` placeholders in ONE pass, so braces inside the values (code answers) are
    left alone. Unknown names stay as written."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def _between(text: str, start: str, end: str) -> str | None:
    i = text.rfind(start)
    if i < 0:
        return None
    j = text.find(end, i + len(start))
    return text[i + len(start) : j if j >= 0 else len(text)].strip()


JUDGE_VIEWS = ("reply", "final_answer")


def final_answer_view(answer: str) -> str:
    """What the judge sees of ``answer`` with ``judge_view="final_answer"``: its final answer as
    Math-v0 reads it (:func:`~chatgym.envs.math.answer.extract_answer`, normalised) in ``<answer>``
    tags, or ``(no final answer)`` when it has none. A tag marker inside that answer (``\\boxed{5</answer>}``
    reads as ``5</answer>``) is written ``&lt;/answer&gt;``: left as it is, the view's own tag would
    end early and the reference judge would read ``5``, a right answer where Math-v0 read a wrong one."""
    final = extract_answer(answer)[0]
    if final is None:
        return "(no final answer)"
    return "<answer>" + ANSWER_MARK.sub(r"&lt;\1answer&gt;", final) + "</answer>"


def rubric_prompt(task: dict[str, Any], answers: Sequence[str], *, judge_view: str = "reply") -> str:
    """MT-bench's rubric prompt judging the last of ``answers``: one answer, the single-turn form
    (question turn 1); two, the multi-turn form (turn 2, with turn 1's answer as context). The
    ``_ref`` forms, with the reference answers, where ``task`` has them. An arithmetic row
    (:mod:`~chatgym.envs.judge.arithmetic`) gets ``judge_answer_ref.txt``: the same blocks, asking
    only whether the final answer is the reference's (reply ``[[9]]``) or not (``[[1]]``).

    Args:
        task: a :func:`~chatgym.envs.judge.mtbench.load_mtbench` or
            :func:`~chatgym.envs.judge.arithmetic.load_arithmetic` row.
        answers: the agent's answers to the first ``len(answers)`` question turns (1 or 2).
        judge_view: ``"reply"``: the answer as written; ``"final_answer"`` (arithmetic rows only): its
            final answer alone (:func:`final_answer_view`).

    Raises:
        ValueError: not 1 or 2 answers; an unknown ``judge_view``, or ``"final_answer"`` for an MT-bench row.
    """
    if len(answers) not in (1, 2):
        raise ValueError(f"rubric_prompt judges question turn 1 or 2: got {len(answers)} answers")
    if judge_view not in JUDGE_VIEWS:
        raise ValueError(f"judge_view must be one of {list(JUDGE_VIEWS)}, got {judge_view!r}")
    if judge_view == "final_answer" and task.get("category") != CATEGORY:
        raise ValueError("judge_view='final_answer' is for arithmetic questions (MT-bench answers are prose)")
    ref = task.get("reference")
    first = final_answer_view(answers[0]) if judge_view == "final_answer" else answers[0]
    values = {"question_1": task["turns"][0], "answer_1": first}
    if task.get("category") == CATEGORY:  # a one-turn arithmetic row: is the final answer the reference?
        name = "judge_answer_ref.txt"
    elif len(answers) == 1:
        name = "judge_single_ref.txt" if ref else "judge_single.txt"
    else:
        name = "judge_multi_ref.txt" if ref else "judge_multi.txt"
        values.update(question_2=task["turns"][1], answer_2=answers[1])
    if ref:
        values.update(ref_answer_1=ref[0], ref_answer_2=ref[1] if len(ref) > 1 else "")
    return fill(load_prompt(__package__, name), values)


class _NoTools:
    """Judge-v0 answers are prose; nothing in them is a tool call."""

    name = "none"

    def parse(self, text: str) -> ParsedAction:
        return ParsedAction(text, [], [])


class ReferenceF1Judge:
    """Rule-based judge: ``rating = 1 + round(9 * F1)``, F1 = SQuAD token F1 of the judged answer
    against the reference answer, both read back from the ``_ref`` rubric prompts. Deterministic
    and offline (for tests and ``check_env``); it is no substitute for a model judge."""

    async def respond(self, messages: list[Message]) -> Message:
        prompt = messages[-1]["content"]
        if "### Reference answer:" in prompt:  # multi-turn form: judge the second answer
            answer = _between(prompt, "### Assistant A:\n", "<|The End of Assistant A's Conversation")
            reference = _between(prompt, "### Reference answer:\n", "<|The End of Reference Answer|>")
        else:
            answer = _between(
                prompt, "[The Start of Assistant's Answer]\n", "[The End of Assistant's Answer]"
            )
            reference = _between(prompt, "[The Start of Reference Answer]\n", "[The End of Reference Answer]")
        if reference is None or answer is None:
            return M.assistant("I need a reference answer to judge this; I cannot rate it.")
        f1 = token_f1(answer, [reference])
        return M.assistant(f"Token F1 with the reference answer: {f1:.3f}.\nRating: [[{1 + round(9 * f1)}]]")


class ReferenceAnswerJudge:
    """Rule-based judge of the arithmetic rubric (``prompts/judge_answer_ref.txt``): rating 10 when the
    judged answer's final answer (:func:`~chatgym.envs.math.answer.extract_answer`) equals the reference
    (:func:`~chatgym.envs.math.answer.answers_equal`, as Math-v0 scores it), else 1. Read back from
    the prompt, as :class:`ReferenceF1Judge` does; deterministic and offline.

    The prompt asks a model judge for ``[[9]]`` or ``[[1]]``, not ``[[10]]``: SmolLM2 writes ``10`` as
    the tokens ``1``, ``0``, so a judge choosing between ``[[10]]`` and ``[[1]]`` decides only at the
    second token, and co-trained that way it rated every answer 1 within 4 steps (two CPU runs); with
    ``9`` the two verdicts differ at their first token. For the same reason a co-trained judge's
    ``[[10]]`` earns agreement 0 on this rubric (:func:`rating_top` 9): while it counted, the token
    ``1`` earned reward on both answers (``10`` on a right one, ``1`` on a wrong one) and a CPU
    co-training run's judge rated everything 1 by step 20 (examples/recipes/verifier_cotrain/, run G).
    ``9`` against this judge's 10 costs a model judge 1/9 of agreement on a right answer; the
    policy's rule-based yardstick stays its accuracy."""

    async def respond(self, messages: list[Message]) -> Message:
        prompt = messages[-1]["content"]
        # The answer is everything between the template's first start marker and its last end marker,
        # and the reference is read before it: an answer quoting any marker cannot move either.
        start, end = prompt.find("[The Start of Assistant's Answer]\n"), prompt.rfind("[The End of Assistant's Answer]")
        head = prompt[:start]
        reference = _between(head, "[The Start of Reference Answer]\n", "[The End of Reference Answer]")
        if start < 0 or end < start or reference is None:
            return M.assistant("I need a reference answer to judge this; I cannot rate it.")
        answer = prompt[start + len("[The Start of Assistant's Answer]\n") : end].strip()
        question = _between(head, "[Question]\n", "[The Start of Reference Answer]") or ""
        same = answers_equal(extract_answer(answer)[0], reference, question)
        verdict = "matches" if same else "does not match"
        return M.assistant(f"The final answer {verdict} the reference.\nRating: [[{10 if same else 1}]]")


def reference_judge(category: str | None) -> Responder:
    """The rule-based judge of a row's rubric by its ``category`` (or the env's ``questions``):
    :class:`ReferenceAnswerJudge` for arithmetic, :class:`ReferenceF1Judge` for MT-bench."""
    return ReferenceAnswerJudge() if category == CATEGORY else ReferenceF1Judge()


async def reference_rating(task: dict[str, Any], view: list[Message]) -> float | None:
    """The rating :func:`reference_judge` gives the judge prompt ``view`` of ``task``; None when the
    task has no reference answer (the co-trained judge's target: ``trace["reference_rating"]``)."""
    if not task.get("reference"):
        return None
    reply = await reference_judge(task.get("category")).respond(list(view))
    return parse_rating(reply["content"])[0]


class JudgeEnv(ChatEnv):
    """Judge-v0 (see the module docstring).

    Args:
        split: MT-bench: ``"all"`` (80 questions) or ``"reference"`` (30 with reference answers);
            default ``"all"`` with a judge given, ``"reference"`` with the default rule-based judge.
            Arithmetic: ``"train"`` (default) or ``"test"``.
        questions: ``"mtbench"`` (default) or ``"arithmetic"`` (Math-v0's tasks, one question turn,
            judged on whether the final answer is the reference's:
            :mod:`~chatgym.envs.judge.arithmetic`).
        size: arithmetic only: tasks in the split (None: Math-v0's 5,000 train / 200 test).
        judge_view: what the judge is shown of an answer: ``"reply"`` (default), the whole reply, or
            ``"final_answer"`` (arithmetic only), its final answer alone (:func:`final_answer_view`):
            the judge then checks one number against the reference, which a 135M judge learns on the
            CPU in 30 GRPO steps (``examples/recipes/verifier_cotrain/``), where in the reply's words
            its co-trained ratings became one value.
        judge: a :class:`~chatgym.envs.agents.Responder`, or None for the rule-based
            :func:`reference_judge` (:class:`ReferenceF1Judge`; :class:`ReferenceAnswerJudge` for arithmetic).
        max_revisions: judge-feedback rounds allowed per question turn (0: no feedback).
        accept_rating: a rating at or above this ends the feedback rounds of a turn.
        judge_retries: extra judge samples when a reply has no valid rating.
        system_prompt: optional system message for the agent (MT-bench uses none; arithmetic
            defaults to Math-v0's, which asks for the answer in ``<answer>`` tags).
        kwargs: passed to :class:`ChatEnv` (``render_mode``; ``max_turns`` defaults to
            ``2 * (max_revisions + 1)``, enough for every turn).

    Raises:
        ValueError: unknown ``questions``, split or ``judge_view``, ``size`` or ``judge_view="final_answer"``
            given for MT-bench, ``max_revisions < 0``,
            ``judge_retries < 0``, or ``accept_rating`` outside 1..10.
    """

    def __init__(
        self,
        *,
        split: str | None = None,
        questions: str = "mtbench",
        size: int | None = None,
        judge_view: str = "reply",
        judge: Responder | None = None,
        max_revisions: int = 0,
        accept_rating: float = 10.0,
        judge_retries: int = 1,
        system_prompt: str | None = None,
        **kwargs: Any,
    ):
        if questions not in ("mtbench", CATEGORY):
            raise ValueError(f"questions must be 'mtbench' or {CATEGORY!r}, got {questions!r}")
        if judge_view not in JUDGE_VIEWS:
            raise ValueError(f"judge_view must be one of {list(JUDGE_VIEWS)}, got {judge_view!r}")
        if judge_view == "final_answer" and questions != CATEGORY:
            raise ValueError("judge_view='final_answer' is for questions='arithmetic' (MT-bench answers are prose)")
        if questions == CATEGORY:
            split = split or "train"
            if split not in ARITHMETIC_SPLITS:
                raise ValueError(f"split must be one of {list(ARITHMETIC_SPLITS)} for arithmetic questions, got {split!r}")
            if system_prompt is None:
                system_prompt = load_prompt("chatgym.envs.math", "math_system.txt")
        elif size is not None:
            raise ValueError("size sets the arithmetic questions' split size; MT-bench has 80 questions")
        else:
            split = split or ("all" if judge is not None else "reference")
            if split not in ("all", "reference"):
                raise ValueError(f"split must be 'all' or 'reference', got {split!r}")
        if max_revisions < 0:
            raise ValueError(f"max_revisions must be >= 0, got {max_revisions}")
        if judge_retries < 0:
            raise ValueError(f"judge_retries must be >= 0, got {judge_retries}")
        if not 1 <= accept_rating <= 10:
            raise ValueError(f"accept_rating must be in 1..10, got {accept_rating}")
        kwargs.setdefault("max_turns", 2 * (max_revisions + 1))
        # Answers are prose: no tool calls are parsed out of them.
        kwargs.setdefault("parser", _NoTools())
        super().__init__(split=split, **kwargs)
        self.questions = questions
        self.size = size
        self.judge_view = judge_view
        self.judge: Responder = judge if judge is not None else reference_judge(questions)
        self.max_revisions = max_revisions
        self.accept_rating = accept_rating
        self.judge_retries = judge_retries
        self.system_prompt = system_prompt

    def load_tasks(self, split: str) -> Sequence[dict[str, Any]]:
        return load_arithmetic(split, self.size) if self.questions == CATEGORY else load_mtbench(split)

    async def on_reset(self, task: dict[str, Any]) -> None:
        if isinstance(self.judge, ReferenceF1Judge) and not task.get("reference"):
            raise ValueError(
                f"{task.get('task_id')} has no reference answer, which the default rule-based judge "
                "needs; pass judge= (a model judge) or use split='reference'"
            )
        self.q_turn = 0  # index of the question turn being answered
        self.revisions = 0
        self.answers: list[str] = []  # final answer of each question turn
        self.ratings: list[list[float]] = [[] for _ in task["turns"]]
        self.components: dict[str, float] = {}
        self.judge_traces: list[dict[str, Any]] = []

    def initial_messages(self, task: dict[str, Any]) -> list[Message]:
        first = [M.system(self.system_prompt)] if self.system_prompt else []
        return [*first, M.user(task["turns"][0])]

    # ---- judging ---------------------------------------------------------------------------

    def judge_prompt(self, answer: str) -> str:
        """The rubric prompt for the current question turn's ``answer``."""
        return rubric_prompt(self.task, [*self.answers[: self.q_turn], answer], judge_view=self.judge_view)

    async def _judge(self, answer: str) -> tuple[float | None, str, str | None]:
        """Ask the judge (with retries); returns ``(rating, judge_text, error)``."""
        view = [M.user(self.judge_prompt(answer))]
        text, error = "", None
        for attempt in range(self.judge_retries + 1):
            reply, trace = await ask(self.judge, view)
            text = reply["content"]
            rating, error = parse_rating(text)
            if trace is not None:
                self.judge_traces.append(
                    {
                        **trace,
                        "reference_rating": await reference_rating(self.task, view),
                        "rating_top": rating_top(self.task),
                        "question_turn": self.q_turn,
                        "attempt": attempt,
                        "rating": rating,
                        "error": error,
                    }
                )
            if rating is not None:
                return rating, text, None
        return None, text, error

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        answer = turn.message["content"]
        rating, text, error = await self._judge(answer)
        info: dict[str, Any] = {"question_turn": self.q_turn + 1, "judge_output": text}
        if self.judge_traces:
            info["judge_traces"] = list(self.judge_traces)
        if rating is None:
            info.update(status="judge_error", judge_error=error, ratings=[list(r) for r in self.ratings])
            self.force_truncate = True
            return StepOutcome(reward=0.0, terminated=False, info=info)
        self.ratings[self.q_turn].append(rating)
        info.update(status="ok", rating=rating, ratings=[list(r) for r in self.ratings])
        if rating < self.accept_rating and self.revisions < self.max_revisions:
            self.revisions += 1
            feedback = fill(
                load_prompt(__package__, "judge_feedback.txt"), {"rating": f"{rating:g}", "critique": critique_of(text)}
            )
            info["reward_components"] = dict(self.components)
            return StepOutcome(messages=[M.user(feedback)], info=info)
        n = len(self.task["turns"])
        reward = (rating - 1.0) / 9.0 / n
        self.components[f"turn_{self.q_turn + 1}"] = reward
        info["reward_components"] = dict(self.components)
        self.answers.append(answer)
        self.q_turn += 1
        self.revisions = 0
        if self.q_turn == n:
            return StepOutcome(reward=reward, terminated=True, info=info)
        return StepOutcome(messages=[M.user(self.task["turns"][self.q_turn])], reward=reward, info=info)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.force_truncate = False
        return await super().areset(seed=seed, options=options)

    async def astep(self, action: str | Message):
        obs, reward, terminated, truncated, info = await super().astep(action)
        if self.force_truncate:  # a judge failure ends the episode without a score
            self._done = True
            return obs, reward, False, True, info
        return obs, reward, terminated, truncated, info

    # ---- the scripted reference agent ------------------------------------------------------

    def reference_action(self) -> str:
        """The reference answer of the current question turn.

        Raises:
            RuntimeError: called before ``reset``.
            NotImplementedError: the question has no reference answer (50 of MT-bench's 80).
        """
        if self.task is None:
            raise RuntimeError("call reset() before reference_action()")
        ref = self.task.get("reference")
        if not ref:
            raise NotImplementedError(f"{self.task.get('task_id')} has no reference answer")
        return ref[min(self.q_turn, len(ref) - 1)]
