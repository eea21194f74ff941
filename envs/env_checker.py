"""``check_chat_env(env)``: does an env keep the ChatEnv contract? Modelled on Gymnasium's
``gymnasium.utils.env_checker``: Gymnasium's own ``check_env`` first, then one small ``check_*``
function per chatgym rule, each failing with a :class:`ChatEnvCheckError` that names the rule, says
what was seen and how to fix the env.

The rules (the contract is in ``docs/architecture.md`` and :mod:`chatgym.envs.core`):

* ``reset``: ``reset()`` returns ``(list[Message], dict)``; ``env.messages`` is that opening.
* ``messages``: every message is an OpenAI chat dict: role system/user/assistant/tool, ``str``
  content, ``tool_calls`` only on assistant messages and each ``{"id", "type": "function",
  "function": {"name", "arguments": str}}``, a ``tool_call_id`` on (and only on) tool messages;
  JSON-serialisable.
* ``step``: ``step`` returns ``(obs, float, bool, bool, dict)``.
* ``new_messages``: ``obs`` holds only the new messages: ``env.messages`` grows by the assistant turn
  plus exactly ``obs``.
* ``success``: ``info["success"]`` is on every step, ``True``/``False``/``None``; ``None`` before the
  end; on the step that terminates a task that defines success (the reference episode's last step
  states a bool) it is a bool on every episode of that task.
* ``tool_messages``: a turn's calls are kept in ``env.messages`` as sent, a malformed one too (as
  written, under its own id), and answered by one ``tool`` message per call, in call order, each
  with its call's id. A step that ends the episode may answer
  with none (the env scored the calls as the answer, as BFCL's AST categories do).
* ``stop_strings``: ``env.stop_strings``, where defined, is a list/tuple of non-empty ``str``.
* ``reference_action``: where the env has a scripted reference policy, playing it reaches the top
  reward (``top_reward``, 1.0 by default) and, where success is defined, ``success=True``.
* ``malformed_action``: bad tool-call JSON, an unknown tool or a broken text call becomes an
  observation; ``step`` never raises on it.

The env is driven through what is passed (``gym.make``'s wrappers included); its attributes
(``messages``, ``tools``, ``parser``, ``stop_strings``, ``reference_action``) are read from the
object or, when a wrapper does not forward them, from ``env.unwrapped``. Every episode starts with
``reset(seed=seed)``. The env is not closed.
"""

from __future__ import annotations

import copy
import json
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from chatgym.envs.messages import is_pil_image, message_errors
from chatgym.envs.parsers import parse_openai_message

__all__ = [
    "ChatEnvCheckError",
    "Step",
    "check_chat_env",
    "check_gymnasium",
    "check_malformed_actions",
    "check_message",
    "check_new_messages",
    "check_reference_action",
    "check_reset",
    "check_step_result",
    "check_stop_strings",
    "check_success_decided",
    "check_success_stated",
    "check_tool_call_order",
    "check_tool_messages",
]

UNKNOWN_TOOL = "chatgym_check_no_such_tool"
BAD_JSON = "{not json"
MAX_REFERENCE_STEPS = 200  # a bound on a reference episode, for an env that never ends one
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NO_RAISE_FIX = (
    "turn a bad call or a malformed turn into an observation (an error `tool` message answering the "
    "call, or a hint for the model), never an exception out of step"
)


class ChatEnvCheckError(AssertionError):
    """An env broke a rule of the ChatEnv contract.

    Attributes:
        rule: the rule's name (``reset``, ``messages``, ``step``, ``new_messages``, ``success``,
            ``tool_messages``, ``stop_strings``, ``reference_action``, ``malformed_action``,
            ``gymnasium``).

    The message is ``"<rule>: <what was seen> Fix: <how to fix the env>"``.
    """

    def __init__(self, rule: str, problem: str, fix: str):
        self.rule = rule
        super().__init__(f"{rule}: {problem} Fix: {fix}")


@dataclass
class Step:
    """One step the checker drove: where (a label), the action, and what ``step`` returned."""

    where: str
    action: Any
    obs: list[dict[str, Any]]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


# ---- reading the env through its wrappers ------------------------------------------------------


def _attr(env: Any, name: str, default: Any = None) -> Any:
    # Gymnasium 1.x wrappers do not forward attributes; a wrapper that defines one (GenRMEnv's
    # ``messages``) is asked first.
    if hasattr(env, name):
        return getattr(env, name)
    return getattr(getattr(env, "unwrapped", env), name, default)


def _history(env: Any) -> list[dict[str, Any]]:
    messages = _attr(env, "messages")
    if not isinstance(messages, list):
        raise ChatEnvCheckError(
            "reset",
            f"env.messages is {type(messages).__name__}, not a list of messages.",
            "keep the full history in a list attribute `messages` (ChatEnv does).",
        )
    return copy.deepcopy(messages)


def _tool_names(env: Any) -> list[str]:
    return [t["function"]["name"] for t in _attr(env, "tools", None) or []]


# ---- Gymnasium's checker -----------------------------------------------------------------------


@contextmanager
def _gymnasium_warnings(stage: str) -> Iterator[None]:
    """Gymnasium's checkers only warn about some broken rules (an observation outside the space, data
    shared between calls); under ``check_chat_env`` those warnings fail the check. Other warnings pass
    through unchanged."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    problems = []
    for w in caught:
        text = _ANSI.sub("", str(w.message))
        if "gymnasium" not in Path(w.filename).parts:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        elif "render_fps" not in text:
            # render_fps paces "human" rendering; a chat transcript rendered as text has no frame rate.
            problems.append(text)
    if problems:
        raise ChatEnvCheckError(
            "gymnasium",
            f"Gymnasium warned during {stage}: {' | '.join(problems)}",
            "make the env satisfy the Gymnasium API rule the warning names.",
        )


def check_gymnasium(env: gym.Env) -> None:
    """Gymnasium's ``check_env`` on ``env.unwrapped`` (render modes and ``close`` included when the env
    has a spec); its failures and warnings become :class:`ChatEnvCheckError` (rule ``gymnasium``)."""
    from gymnasium.utils.env_checker import check_env
    from gymnasium.utils.passive_env_checker import env_render_passive_checker

    base = env.unwrapped
    with _gymnasium_warnings("check_env"):
        try:
            # Without a spec check_env cannot re-make the env in each render mode (it warns instead):
            # the env's own render mode is checked here then.
            check_env(base, skip_render_check=base.spec is None)
            if base.spec is None and base.render_mode is not None:
                env_render_passive_checker(base)
        except ChatEnvCheckError:
            raise
        except Exception as exc:
            raise ChatEnvCheckError(
                "gymnasium",
                f"Gymnasium's check_env failed: {type(exc).__name__}: {exc}",
                "make the env satisfy the Gymnasium API rule the error names.",
            ) from exc


# ---- one message, one reset, one step ------------------------------------------------------------


def _image_as_json(value: Any) -> str:
    # An image part's PIL image is the one non-JSON value a message may hold: the rollout side stores
    # it once and writes its sha256 in its place.
    if is_pil_image(value):
        return "<image>"
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def check_message(msg: Any, where: str) -> None:
    """``msg`` is a well-formed, JSON-serialisable OpenAI chat message (rule ``messages``); the PIL
    image of an ``image`` content part is the one value allowed that JSON cannot hold."""
    errors = list(message_errors(msg))
    if not errors:
        role = msg["role"]
        calls = msg.get("tool_calls")
        if calls is not None and role != "assistant":
            errors.append(f"a {role} message has tool_calls (only assistant messages call tools)")
        for call in calls if isinstance(calls, list) else []:
            fn = call.get("function") if isinstance(call, dict) else None
            if not (isinstance(call.get("id"), str) and call["id"]):
                errors.append(f"tool call {call!r:.200} has no str id")
            if call.get("type") != "function":
                errors.append(f"tool call {call!r:.200} has type {call.get('type')!r}, not 'function'")
            if isinstance(fn, dict) and not isinstance(fn.get("arguments"), str):
                errors.append(f"tool call {call!r:.200} has arguments that are not JSON text (a str)")
        if role == "tool" and not (isinstance(msg.get("tool_call_id"), str) and msg["tool_call_id"]):
            errors.append("a tool message has no tool_call_id")
        if role != "tool" and "tool_call_id" in msg:
            errors.append(f"a {role} message has a tool_call_id (only tool messages answer calls)")
    if not errors:
        try:
            json.dumps(msg, allow_nan=False, default=_image_as_json)
        except (TypeError, ValueError) as exc:
            errors.append(f"not JSON-serialisable ({exc})")
    if errors:
        raise ChatEnvCheckError(
            "messages",
            f"{where}: message {msg!r:.200} is not a chat message: {'; '.join(errors)}.",
            "build messages with chatgym.envs.messages (system, user, assistant, tool, make_tool_call): "
            "plain dicts of str, the OpenAI chat format.",
        )


def check_reset(env: gym.Env, *, seed: int = 0) -> list[dict[str, Any]]:
    """``reset(seed=seed)`` returns ``(list[Message], dict)`` of well-formed messages and
    ``env.messages`` equals that opening (rules ``reset``, ``messages``). Returns the observation."""
    result = env.reset(seed=seed)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ChatEnvCheckError(
            "reset",
            f"reset() returned {type(result).__name__} {result!r:.200}, not a pair (obs, info).",
            "return (list of opening messages, info dict) from reset.",
        )
    obs, info = result
    if not isinstance(obs, list):
        raise ChatEnvCheckError(
            "reset",
            f"reset() returned an observation of type {type(obs).__name__}, not a list of messages.",
            "return the opening messages (system prompt, user task) as a list.",
        )
    if not isinstance(info, dict):
        raise ChatEnvCheckError(
            "reset", f"reset() returned info of type {type(info).__name__}, not a dict.", "return a dict."
        )
    for i, m in enumerate(obs):
        check_message(m, f"reset() observation message {i}")
    if _history(env) != obs:
        raise ChatEnvCheckError(
            "reset",
            f"after reset() env.messages holds {len(_history(env))} messages that differ from the "
            f"{len(obs)} opening messages reset() returned.",
            "set env.messages to the opening messages and return copies of them.",
        )
    return obs


def check_step_result(result: Any, where: str) -> None:
    """``step`` returned ``(list, real reward, bool, bool, dict)`` (rule ``step``)."""
    if not (isinstance(result, tuple) and len(result) == 5):
        raise ChatEnvCheckError(
            "step",
            f"{where}: step returned {type(result).__name__} {result!r:.200}, not a 5-tuple.",
            "return (obs, reward, terminated, truncated, info).",
        )
    obs, reward, terminated, truncated, info = result
    problems = []
    if not isinstance(obs, list):
        problems.append(f"obs is {type(obs).__name__}, not a list of messages")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        problems.append(f"reward is {type(reward).__name__}, not a float")
    for name, value in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(value, bool):
            problems.append(f"{name} is {type(value).__name__}, not a bool")
    if not isinstance(info, dict):
        problems.append(f"info is {type(info).__name__}, not a dict")
    if problems:
        raise ChatEnvCheckError(
            "step",
            f"{where}: {'; '.join(problems)}.",
            "return (list[Message], float, bool, bool, dict) from step.",
        )


def check_new_messages(before: list[Any], obs: list[Any], after: list[Any], where: str) -> None:
    """``obs`` holds only the new messages: ``after == before + [assistant turn] + obs``, where
    ``before``/``after`` are ``env.messages`` around the step (rule ``new_messages``)."""
    n = len(before)
    if before and obs[:n] == before:
        raise ChatEnvCheckError(
            "new_messages",
            f"{where}: step returned {len(obs)} messages that start with the {n} messages already in "
            "env.messages (the history).",
            "return only the new messages (tool results, a user's or judge's reply); env.messages "
            "keeps the history and the caller appends the observation to its own.",
        )
    if after[:n] != before:
        raise ChatEnvCheckError(
            "new_messages",
            f"{where}: step changed messages that were already in env.messages.",
            "only append to env.messages: the assistant turn, then the observation.",
        )
    if len(after) != n + 1 + len(obs) or after[n + 1 :] != obs or after[n].get("role") != "assistant":
        raise ChatEnvCheckError(
            "new_messages",
            f"{where}: env.messages grew from {n} to {len(after)} messages; expected {n} + 1 (the "
            f"assistant turn) + {len(obs)} (the returned observation), in that order.",
            "append the assistant turn, then exactly the messages step returns.",
        )


def check_success_stated(step: Step) -> None:
    """``info["success"]`` is on the step, ``True``/``False``/``None``, and ``None`` on a step that
    neither terminates nor truncates (rule ``success``)."""
    where = step.where
    if "success" not in step.info:
        raise ChatEnvCheckError(
            "success",
            f"{where}: info has no 'success' key.",
            "state info['success'] on every step: True/False on the step that decides a task with a "
            "defined success, None otherwise (ChatEnv.astep fills None when the env says nothing).",
        )
    value = step.info["success"]
    if value is not None and not isinstance(value, bool):
        raise ChatEnvCheckError(
            "success",
            f"{where}: info['success'] is {value!r} ({type(value).__name__}), not True, False or None.",
            "use a Python bool (bool(x), not a number or numpy bool) or None.",
        )
    if value is not None and not (step.terminated or step.truncated):
        raise ChatEnvCheckError(
            "success",
            f"{where}: info['success'] is {value} on a step that does not end the episode.",
            "leave info['success'] None before the end; state it on the step that decides the task.",
        )


def check_success_decided(steps: list[Step]) -> None:
    """Across the episodes the checker drove on one task: when one terminating step states a bool,
    every terminating step does (the task defines success; rule ``success``)."""
    ends = [s for s in steps if s.terminated]
    decided = [s for s in ends if s.info.get("success") is not None]
    if not decided:
        return
    for s in ends:
        if s.info.get("success") is None:
            raise ChatEnvCheckError(
                "success",
                f"{s.where}: info['success'] is None on a step that terminates a task whose success is "
                f"defined ({decided[0].where} stated {decided[0].info['success']}).",
                "state True/False on every terminating step of a task with a defined success (a "
                "wrong or unreadable answer is False, not None).",
            )


def _expected_call_ids(env: gym.Env, action: Any, history: list[Any]) -> list[str] | None:
    """The call ids the turn's tool messages must answer, in order: one per call attempt, malformed
    ones included (``ParsedAction.all_calls``: the server's id where neither ``history`` nor an
    earlier call of the turn holds it, else ``call_<n>``, ``n`` counting the attempts ``history``
    recorded before the turn, stepping around the ids it used); None where the env has no parser the
    checker can ask about a text turn."""
    if isinstance(action, dict) and action.get("tool_calls"):
        return [c["id"] for c in parse_openai_message(action).numbered_after(history).all_calls()]
    if isinstance(action, str):
        text = action
    elif isinstance(action, dict):
        text = action.get("content") or ""
    else:
        return None
    parser = _attr(env, "parser")
    if not callable(getattr(parser, "parse", None)):
        return None
    parsed = parser.parse(text)
    if hasattr(parsed, "numbered_after"):
        parsed = parsed.numbered_after(history)
    return [c["id"] for c in parsed.all_calls()] if hasattr(parsed, "all_calls") else None


def check_tool_messages(expected: list[str], recorded: dict[str, Any], step: Step) -> None:
    """The assistant turn in ``env.messages`` (``recorded``) keeps the calls ``expected`` (ids in
    order), and ``step.obs`` answers them with one ``tool`` message each, in call order; a step that
    ends the episode may answer none (rule ``tool_messages``)."""
    where = step.where
    recorded_ids = [c.get("id") for c in recorded.get("tool_calls") or []]
    if recorded_ids != expected:
        raise ChatEnvCheckError(
            "tool_messages",
            f"{where}: the assistant turn in env.messages has call ids {recorded_ids}; the turn made "
            f"the calls {expected}.",
            "keep the turn's calls in the history as sent (ids and order), so each tool message "
            "answers a call of that turn.",
        )
    answered = [m.get("tool_call_id") for m in step.obs if m.get("role") == "tool"]
    if answered == expected or (not answered and step.terminated):
        return
    if sorted(answered) == sorted(expected):
        problem = f"the tool messages answer the calls {answered}, out of call order {expected}."
    elif len(answered) != len(expected):
        problem = f"{len(answered)} tool message(s) {answered} for {len(expected)} call(s) {expected}."
    else:
        problem = f"the tool messages carry tool_call_ids {answered}; the calls' ids are {expected}."
    raise ChatEnvCheckError(
        "tool_messages",
        f"{where}: {problem}",
        "answer every call with one tool message (errors included), in the order the calls were "
        "made, each with tool_call_id = its call's id (ChatEnv.run_tools does).",
    )


def _step(env: gym.Env, action: Any, where: str, raise_rule: str, raise_fix: str) -> Step:
    """One ``step`` with the per-step rules (``step``, ``messages``, ``new_messages``, ``success``,
    ``tool_messages``); an exception out of ``step`` fails ``raise_rule``."""
    before = _history(env)
    expected = _expected_call_ids(env, action, before)
    try:
        result = env.step(copy.deepcopy(action))
    except Exception as exc:
        raise ChatEnvCheckError(
            raise_rule, f"{where}: step raised {type(exc).__name__}: {exc}", raise_fix
        ) from exc
    check_step_result(result, where)
    obs, reward, terminated, truncated, info = result
    for i, m in enumerate(obs):
        check_message(m, f"{where}: observation message {i}")
    after = _history(env)
    check_new_messages(before, obs, after, where)
    step = Step(where, action, obs, float(reward), terminated, truncated, info)
    check_success_stated(step)
    if expected is not None:
        check_tool_messages(expected, after[len(before)], step)
    return step


# ---- the rules that drive episodes ---------------------------------------------------------------


def check_stop_strings(env: gym.Env) -> None:
    """``env.stop_strings``, where defined, is a list or tuple of non-empty ``str`` (rule
    ``stop_strings``)."""
    stops = _attr(env, "stop_strings")
    if stops is None:
        return
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise ChatEnvCheckError(
            "stop_strings",
            f"env.stop_strings is {stops!r:.200}, not a list or tuple of non-empty strings.",
            "set stop_strings to a list of the non-empty texts that end a turn (e.g. "
            "['</search>', '</answer>']), an empty list, or leave it undefined.",
        )


def check_reference_action(env: gym.Env, *, seed: int = 0, top_reward: float = 1.0) -> list[Step]:
    """Where the env has a scripted reference policy (``reference_action()``, called once per step),
    its episode ends by termination with return ``>= top_reward`` and, where the env states success,
    ``success=True`` (rule ``reference_action``). Returns the steps (none when the env has no
    reference for the task: ``NotImplementedError``)."""
    reference = _attr(env, "reference_action")
    if not callable(reference):
        return []
    check_reset(env, seed=seed)
    fix = "make reference_action() return the correct next turn (the env's best behaviour)."
    steps: list[Step] = []
    while not steps or not (steps[-1].terminated or steps[-1].truncated):
        if len(steps) >= MAX_REFERENCE_STEPS:
            raise ChatEnvCheckError(
                "reference_action",
                f"the reference episode did not end in {len(steps)} step(s).",
                "end the episode: terminate when the task is decided, truncate at max_turns.",
            )
        try:
            action = reference()
        except NotImplementedError:
            if not steps:
                return []  # no reference for this task (e.g. a question without a reference answer)
            raise ChatEnvCheckError(
                "reference_action",
                f"reference_action() raised NotImplementedError at step {len(steps) + 1}, after giving "
                "the episode's earlier steps.",
                fix,
            ) from None
        if not env.action_space.contains(action):
            raise ChatEnvCheckError(
                "reference_action",
                f"reference_action() returned {action!r:.200}, not a str or an assistant message.",
                fix,
            )
        where = f"reference episode, step {len(steps) + 1}"
        steps.append(_step(env, action, where, "reference_action", fix))
    total = sum(s.reward for s in steps)
    last = steps[-1]
    if not last.terminated:
        raise ChatEnvCheckError(
            "reference_action",
            f"the reference episode was truncated after {len(steps)} step(s) (return {total:g}).",
            fix,
        )
    if total < top_reward - 1e-9:
        raise ChatEnvCheckError(
            "reference_action",
            f"the reference episode's return is {total:g} after {len(steps)} step(s), below the top "
            f"reward {top_reward:g}.",
            fix + " If the env's best return is not 1.0, pass top_reward= to check_chat_env.",
        )
    if last.info.get("success") is False:
        raise ChatEnvCheckError(
            "reference_action", "the reference episode ended with info['success'] False.", fix
        )
    return steps


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _text_calls(parser_name: str, calls: list[tuple[str, str]]) -> str | None:
    """``[(name, arguments JSON)]`` written in a text format, or None for a format without one."""
    if parser_name == "hermes":
        return "\n".join(f'<tool_call>{{"name": {json.dumps(n)}, "arguments": {a}}}</tool_call>' for n, a in calls)
    if parser_name == "json":
        return "[" + ", ".join(f'{{"name": {json.dumps(n)}, "parameters": {a}}}' for n, a in calls) + "]"
    if parser_name == "pythonic" and all(n.isidentifier() and a == "{}" for n, a in calls):
        return "[" + ", ".join(f"{n}()" for n, _ in calls) + "]"
    return None


def check_tool_call_order(env: gym.Env, *, seed: int = 0) -> list[Step]:
    """When ``env.tools`` is non-empty: an assistant message with three calls (the first tool, the
    same with bad JSON, the last tool), and the same two valid calls written in the env's parser's
    text format, are each answered by one tool message per call, in call order, with matching ids
    (rule ``tool_messages``). The calls carry empty arguments, so most tools answer with an error
    about them. Returns the steps."""
    fix = _NO_RAISE_FIX
    steps: list[Step] = []
    check_reset(env, seed=seed)
    names = _tool_names(env)
    if not names:
        return steps
    first, last = names[0], names[-1]
    action = {
        "role": "assistant",
        "content": "",
        "tool_calls": [_call("chk_0", first, "{}"), _call("chk_1", first, BAD_JSON), _call("chk_2", last, "{}")],
    }
    steps.append(_step(env, action, "tool-call turn (structured calls)", "malformed_action", fix))
    text = _text_calls(getattr(_attr(env, "parser"), "name", ""), [(first, "{}"), (last, "{}")])
    if text is not None:
        check_reset(env, seed=seed)
        steps.append(_step(env, text, "tool-call turn (calls in the parser's text format)", "malformed_action", fix))
    return steps


def check_malformed_actions(env: gym.Env, *, seed: int = 0) -> list[Step]:
    """Bad tool-call JSON and an unknown tool (as an assistant message's calls and, where the env's
    parser has a text format, as text; only when ``env.tools`` is non-empty) and a broken text call
    become observations: ``step`` does not raise, and an episode that goes on shows the model
    something (rule ``malformed_action``). Returns the steps."""
    check_reset(env, seed=seed)
    names = _tool_names(env)
    parser_name = getattr(_attr(env, "parser"), "name", "")
    actions: list[tuple[str, Any]] = []
    if names:
        for label, name, args in (("bad tool-call JSON", names[0], BAD_JSON), ("an unknown tool", UNKNOWN_TOOL, "{}")):
            actions.append((label, {"role": "assistant", "content": "", "tool_calls": [_call("chk_bad", name, args)]}))
            text = _text_calls(parser_name, [(name, args)])
            if text is not None:
                actions.append((f"{label}, as text", text))
    actions.append(("a broken text call", '<tool_call>{"name": [}</tool_call> ]]) {{'))
    steps = []
    for i, (label, action) in enumerate(actions):
        if i:
            check_reset(env, seed=seed)
        step = _step(env, action, f"malformed action ({label})", "malformed_action", _NO_RAISE_FIX)
        if not (step.obs or step.terminated or step.truncated):
            raise ChatEnvCheckError(
                "malformed_action",
                f"{step.where}: the episode goes on but step returned no observation.",
                "answer a malformed turn with a message the model can read (a tool error or a hint).",
            )
        steps.append(step)
    return steps


def check_chat_env(env: gym.Env, *, seed: int = 0, skip_gymnasium: bool = False, top_reward: float = 1.0) -> None:
    """Check that ``env`` keeps the ChatEnv contract (the rules in the module docstring).

    Args:
        env: a ChatEnv, or one wrapped (``gym.make``'s wrappers, an async wrapper such as GenRMEnv).
        seed: every episode the checker drives starts with ``reset(seed=seed)``.
        skip_gymnasium: do not run Gymnasium's ``check_env`` first.
        top_reward: the return the scripted reference policy must reach (chatgym's envs: 1.0).

    Raises:
        ChatEnvCheckError: the first rule broken (``.rule`` names it); an ``AssertionError``.
    """
    if not skip_gymnasium:
        check_gymnasium(env)
    with _gymnasium_warnings("check_chat_env's episodes"):  # gym.make's PassiveEnvChecker
        check_stop_strings(env)
        steps = check_reference_action(env, seed=seed, top_reward=top_reward)
        steps += check_tool_call_order(env, seed=seed)
        steps += check_malformed_actions(env, seed=seed)
        check_success_decided(steps)
