"""GenRM: score any env's episodes with an LLM judge (generative reward model).

:class:`GenRMEnv` wraps an env. Steps pass through unchanged (their reward times ``env_weight``)
until the episode ends (terminated or truncated by the env); then the judge — any
:class:`~chatgym.envs.agents.Responder`, e.g. the policy's own engine through
``chatgym.trainer.engines.responder`` — reads a prompt built from a template and writes a verdict,
which is parsed into a score in [0, 1]. The last step's reward is::

    env_weight * env_step_reward + judge_weight * judge_score

so the episode return is ``env_weight * (env's return) + judge_weight * judge_score``. This is the
pointwise "LLM-as-a-judge" reward of Zheng et al. 2023 (arXiv:2306.05685) used as an RL reward
(generative reward models: Mahan et al. 2024, arXiv:2410.12832; Zhang et al. 2024,
arXiv:2408.15240).

**Template** placeholders (filled in one pass, so braces inside answers are left alone):
``{question}`` the first user message of the episode, ``{response}`` the policy's last turn,
``{conversation}`` the whole episode after the system prompt (``Role: text`` blocks),
``{reference}`` the task's reference answer (its ``reference``/``answer``/``answers``/``solution``
field; ``(none)`` when it has none). A template must use ``{response}`` or ``{conversation}``; any
other ``{name}`` is refused when the wrapper is built. The shipped default is
``prompts/genrm_score.txt`` (a 0-10 score in ``<score>N</score>``).

**Verdict**: :class:`VerdictParser` — a regex whose first group captures the verdict; the LAST match
in the judge's text counts (an earlier one may echo the format's example). A number is mapped from
``score_range`` (lo, hi) to [0, 1]; with ``labels`` the captured text is looked up instead (e.g.
``[[A]]``/``[[B]]`` or ``CORRECT``/``INCORRECT``). A reply without a valid verdict is asked again
``judge_retries`` times (each a new sample); after that the score is ``unparseable_reward`` and
``info["genrm"]["status"] = "unparseable"`` (counted by the trainer's metrics). A judge that raises
fails the episode like any env error.
The parser reads the judge's whole reply message: a judge whose reply is prefilled (the trainer's
``reward.prefill``, :class:`chatgym.trainer.engines.prefill.PrefillResponder`) returns prefill +
sampled text, so ``"<score>"`` + ``"7</score>"`` parses as 7.

**What the last step's info gets**: ``info["reward_components"]`` keeps the env's components and adds
``env`` (the env's return) and ``genrm`` (the judge score used); ``info["genrm"]`` holds ``score``
(parsed, or None), ``reward`` (the score used), ``status`` (``ok``/``unparseable``), ``error``,
``verdict`` (the judge's text, its last 2,000 characters), ``attempts`` and ``judge_s`` (seconds the
judge took). ``info["success"]`` stays the env's.

**Concurrency**: the judge is asked inside the episode's ``astep`` coroutine, so under the rollout
collector it runs while other episodes generate; an engine with continuous batching (vLLM, the hf
engine) batches judge requests with the policy's. The wrapper is an *async wrapper*
(:mod:`chatgym.envs.async_env`): the collector awaits its ``areset``/``astep``. Its sync
``reset``/``step`` run them on the wrapped ChatEnv's private loop (a judge bound to another event
loop, an engine's, works only through the async API).

An episode cut by a collector token budget never reaches the env's end, so it is not judged (the env
does not score it either).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from chatgym.envs import messages as M
from chatgym.envs.agents import Responder, ask
from chatgym.envs.async_env import async_core
from chatgym.envs.core import load_prompt
from chatgym.envs.judge.env import fill
from chatgym.envs.messages import Message

DEFAULT_TEMPLATE = "genrm_score.txt"
PLACEHOLDERS = ("question", "response", "conversation", "reference")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_REFERENCE_KEYS = ("reference", "answer", "answers", "solution")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")

# Shipped verdict formats: name -> (pattern, score_range, labels).
VERDICT_FORMATS: dict[str, tuple[str, tuple[float, float], dict[str, float]]] = {
    "score": (r"<score>\s*([-+]?\d+(?:\.\d+)?)\s*</score>", (0.0, 10.0), {}),
    "rating": (r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]", (1.0, 10.0), {}),  # MT-bench's [[r]]
    "ab": (r"\[\[\s*([AB])\s*\]\]", (0.0, 1.0), {"A": 1.0, "B": 0.0}),
}


def check_template(template: str) -> None:
    """Refuse a template that cannot make a judge prompt.

    Raises:
        ValueError: it uses none of ``{response}``/``{conversation}``, or a placeholder not in
            :data:`PLACEHOLDERS` (naming it).
    """
    names = set(_PLACEHOLDER.findall(template))
    unknown = sorted(names - set(PLACEHOLDERS))
    if unknown:
        raise ValueError(
            f"template placeholder {{{unknown[0]}}} is not one of "
            f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
        )
    if not names & {"response", "conversation"}:
        raise ValueError("template must contain {response} or {conversation}: the judge has nothing to judge")


@dataclass(frozen=True)
class VerdictParser:
    """Turns a judge's text into a score in [0, 1].

    Attributes:
        pattern: regex with one capture group (the verdict); the last match in the text counts.
        score_range: ``(lo, hi)``, lo < hi: a numeric verdict ``v`` in it scores ``(v - lo) / (hi - lo)``;
            outside it the verdict is invalid.
        labels: verdict text -> score in [0, 1]; when given, the captured text is looked up here
            (stripped, case-sensitive) instead of read as a number.

    Raises:
        ValueError: a pattern that does not compile or has no group, ``lo >= hi``, a label score
            outside [0, 1].
    """

    pattern: str = VERDICT_FORMATS["score"][0]
    score_range: tuple[float, float] = (0.0, 10.0)
    labels: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            compiled = re.compile(self.pattern, re.S)
        except re.error as exc:
            raise ValueError(f"pattern {self.pattern!r} is not a valid regex: {exc}") from None
        if compiled.groups < 1:
            raise ValueError(f"pattern {self.pattern!r} needs a capture group around the verdict")
        lo, hi = self.score_range
        if not lo < hi:
            raise ValueError(f"score_range must be (lo, hi) with lo < hi, got {tuple(self.score_range)}")
        for label, score in self.labels.items():
            if not 0.0 <= float(score) <= 1.0:
                raise ValueError(f"labels[{label!r}] must be in [0, 1], got {score}")
        object.__setattr__(self, "_regex", compiled)

    @classmethod
    def named(cls, name: str, **overrides: Any) -> VerdictParser:
        """A shipped format of :data:`VERDICT_FORMATS` (``score``, ``rating``, ``ab``), fields
        overridden by ``overrides`` (None values ignored).

        Raises:
            ValueError: unknown name.
        """
        if name not in VERDICT_FORMATS:
            raise ValueError(f"unknown verdict format {name!r}; choose one of {sorted(VERDICT_FORMATS)}")
        pattern, score_range, labels = VERDICT_FORMATS[name]
        values: dict[str, Any] = {"pattern": pattern, "score_range": score_range, "labels": labels}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def parse(self, text: str) -> tuple[float | None, str | None]:
        """``(score, None)`` with ``score`` in [0, 1], or ``(None, why)`` when the text has no valid verdict."""
        found = self._regex.findall(text)  # type: ignore[attr-defined]
        if not found:
            return None, f"no verdict matching {self.pattern!r} in the judge's text: {text[-200:]!r}"
        last = found[-1]
        raw = (last[0] if isinstance(last, tuple) else last).strip()
        if self.labels:
            if raw not in self.labels:
                return None, f"verdict {raw!r} is not one of {sorted(self.labels)}"
            return float(self.labels[raw]), None
        if not _NUMBER.fullmatch(raw):
            return None, f"verdict {raw!r} is not a number"
        value, (lo, hi) = float(raw), self.score_range
        if not lo <= value <= hi:
            return None, f"verdict {raw} is outside the score range [{lo:g}, {hi:g}]"
        return (value - lo) / (hi - lo), None


def _reference(task: Any) -> str:
    if not isinstance(task, Mapping):
        return "(none)"
    for key in _REFERENCE_KEYS:
        value = task.get(key)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None and str(value).strip():
            return str(value)
    return "(none)"


def _transcript(messages: list[Message]) -> str:
    blocks = []
    for m in messages:
        if m["role"] == "system":
            continue
        name = f"Tool ({m['name']})" if m["role"] == "tool" and m.get("name") else m["role"].capitalize()
        blocks.append(f"{name}: {m['content']}")
    return "\n\n".join(blocks)


class GenRMEnv(gym.Wrapper):
    """An env whose episodes are also scored by an LLM judge (see the module docstring).

    Args:
        env: the env to score (any Gymnasium env with chat-message observations; ChatEnvs are driven
            through their async API).
        judge: the :class:`~chatgym.envs.agents.Responder` that writes the verdict.
        template: the judge prompt's text (default: ``prompts/genrm_score.txt``).
        verdict: how the verdict is read (default: ``VerdictParser.named("score")``).
        unparseable_reward: the judge score used when no valid verdict came (before ``judge_weight``).
        env_weight, judge_weight: weights of the env's reward and of the judge score.
        judge_retries: extra judge samples when a reply has no valid verdict.

    Raises:
        ValueError: a bad template (see :func:`check_template`) or ``judge_retries < 0``.
        TypeError: ``judge`` has no ``respond`` method.
    """

    def __init__(
        self,
        env: gym.Env,
        judge: Responder,
        *,
        template: str | None = None,
        verdict: VerdictParser | None = None,
        unparseable_reward: float = 0.0,
        env_weight: float = 1.0,
        judge_weight: float = 1.0,
        judge_retries: int = 0,
    ):
        super().__init__(env)
        if not callable(getattr(judge, "respond", None)):
            raise TypeError(f"judge must have an async respond(messages) method, got {type(judge).__name__}")
        if judge_retries < 0:
            raise ValueError(f"judge_retries must be >= 0, got {judge_retries}")
        self.template = load_prompt(__package__, DEFAULT_TEMPLATE) if template is None else template
        check_template(self.template)
        self.judge = judge
        self.verdict = verdict or VerdictParser()
        self.unparseable_reward = float(unparseable_reward)
        self.env_weight = float(env_weight)
        self.judge_weight = float(judge_weight)
        self.judge_retries = judge_retries
        self._inner = async_core(env)
        # The env's own spec: gym.Wrapper.spec would deep-copy it (and its kwargs: a judge engine).
        self._cached_spec = env.spec
        self._history: list[Message] = []
        self._env_return = 0.0

    # ---- the judge ----------------------------------------------------------------------------

    def judge_prompt(self) -> str:
        """The judge's prompt for the episode so far (its last assistant turn is the response)."""
        first_user = next((m["content"] for m in self._history if m["role"] == "user"), "")
        last = next((m["content"] for m in reversed(self._history) if m["role"] == "assistant"), "")
        values = {
            "question": first_user,
            "response": last,
            "conversation": _transcript(self._history),
            "reference": _reference(getattr(self.env.unwrapped, "task", None)),
        }
        return fill(self.template, values)

    async def judge_episode(self) -> dict[str, Any]:
        """Ask the judge (with retries) about the episode; returns the ``info["genrm"]`` record."""
        t0 = time.perf_counter()
        view = [M.user(self.judge_prompt())]
        text, score, error, traces = "", None, None, []
        attempts = 0
        while attempts <= self.judge_retries:
            attempts += 1
            reply, trace = await ask(self.judge, view)
            text = reply["content"]
            score, error = self.verdict.parse(text)
            if trace is not None:
                traces.append({**trace, "score": score, "error": error})
            if score is not None:
                break
        record: dict[str, Any] = {
            "score": score,
            "reward": self.unparseable_reward if score is None else score,
            "status": "unparseable" if score is None else "ok",
            "error": error,
            "verdict": text[-2000:],
            "attempts": attempts,
            "judge_s": time.perf_counter() - t0,
        }
        if traces:
            record["traces"] = traces
        return record

    # ---- the Gymnasium API (async first) ------------------------------------------------------

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        if self._inner is not None:
            obs, info = await self._inner.areset(seed=seed, options=options)
        else:
            obs, info = await asyncio.to_thread(self.env.reset, seed=seed, options=options)
        self._history = [dict(m) for m in obs]  # type: ignore[misc]
        self._env_return = 0.0
        return obs, info

    async def astep(self, action: str | Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        if self._inner is not None:
            obs, reward, terminated, truncated, info = await self._inner.astep(action)
        else:
            obs, reward, terminated, truncated, info = await asyncio.to_thread(self.env.step, action)
        text = action if isinstance(action, str) else (action.get("content") or "")
        self._history.append(M.assistant(text))
        self._history.extend(dict(m) for m in obs)  # type: ignore[misc]
        self._env_return += float(reward)
        out = self.env_weight * float(reward)
        if not (terminated or truncated):
            return obs, out, terminated, truncated, info
        record = await self.judge_episode()
        info = dict(info)
        info["genrm"] = record
        info["reward_components"] = {
            **(info.get("reward_components") or {}),
            "env": self._env_return,
            "genrm": record["reward"],
        }
        return obs, out + self.judge_weight * record["reward"], terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._sync(self.areset(seed=seed, options=options))

    def step(self, action: str | Message):
        return self._sync(self.astep(action))

    def _sync(self, coro: Any) -> Any:
        run = getattr(self.env.unwrapped, "_run", None)  # a ChatEnv's private loop: its resources live there
        return run(coro) if run is not None else asyncio.run(coro)

    async def aclose(self) -> None:
        inner_close = getattr(self._inner, "aclose", None)
        if inner_close is not None:
            await inner_close()
        else:
            await asyncio.to_thread(self.env.close)

    @property
    def messages(self) -> list[Message]:
        return self.env.unwrapped.messages  # type: ignore[attr-defined]

    @property
    def tools(self) -> list[dict[str, Any]]:
        return getattr(self.env.unwrapped, "tools", [])

    @property
    def stop_strings(self) -> Any:
        return getattr(self.env.unwrapped, "stop_strings", None)
