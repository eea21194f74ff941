"""check_chat_env: passes on every registered env id; each rule fails, with its message, on a small
env defined here that breaks it."""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import pytest

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs import ChatEnv, ChatEnvCheckError, StepOutcome, check_chat_env
from chatgym.envs import messages as M
from chatgym.envs.parsers import ParsedAction
from chatgym.envs.registration import ENV_SPECS


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


REFERENCE_CALL = M.assistant("", [M.make_tool_call("add", {"a": 2, "b": 3}, "call_ref")])


class AddEnv(ChatEnv):
    """One task, "2 + 3?"; an ``add`` tool; the answer "5" earns 1 and success True. The reference
    calls ``add`` and then answers."""

    def __init__(self, **kwargs):
        kwargs.setdefault("tools", [add])
        super().__init__(**kwargs)

    def load_tasks(self, split):
        return [{"task_id": "t0"}]

    def initial_messages(self, task):
        return [M.system("Add with the add tool."), M.user("2 + 3?")]

    async def score(self, turn):
        right = turn.message["content"].strip() == "5"
        return StepOutcome(reward=float(right), terminated=True, info={"success": right})

    def reference_action(self):
        return REFERENCE_CALL if self.turn == 0 and self.tool_map else "5"


def _fails(env, **kwargs) -> ChatEnvCheckError:
    try:
        with pytest.raises(ChatEnvCheckError) as caught:
            check_chat_env(env, **kwargs)
    finally:
        env.close()
    return caught.value


# ---- every registered env ------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", sorted(ENV_SPECS))
def test_every_registered_env_passes(env_id):
    # Made as the other env tests make them: gym.make with the id's defaults (offline: the scripted
    # user, the rule-based judge, BM25 over the packaged corpus, the local sandbox), wrappers included.
    env = gym.make(env_id)
    try:
        assert isinstance(env.unwrapped, ChatEnv)
        check_chat_env(env)
    finally:
        env.close()


def test_a_correct_env_passes_directly_and_through_gym_make():
    env = AddEnv()
    try:
        check_chat_env(env)
    finally:
        env.close()
    if "chatgym-test/CheckerAdd-v0" not in gym.registry:
        gym.register(id="chatgym-test/CheckerAdd-v0", entry_point=AddEnv)
    made = gym.make("chatgym-test/CheckerAdd-v0")
    try:
        assert type(made.env).__name__ == "PassiveEnvChecker"  # Gymnasium's checker is on
        check_chat_env(made)
    finally:
        made.close()


def test_the_error_is_an_assertion_error_naming_its_rule():
    env = AddEnv()
    env.stop_strings = [""]
    err = _fails(env)
    assert isinstance(err, AssertionError) and err.rule == "stop_strings"


# ---- new_messages ----------------------------------------------------------------------------------


class ReturnsHistoryEnv(AddEnv):
    async def astep(self, action):
        _, *rest = await super().astep(action)
        return [dict(m) for m in self.messages], *rest


def test_step_returning_the_history_fails():
    # Reference step 1: the history is system, user, the assistant's add call, its tool result (4);
    # 2 of them were in env.messages before the step.
    assert str(_fails(ReturnsHistoryEnv())) == (
        "new_messages: reference episode, step 1: step returned 4 messages that start with the 2 "
        "messages already in env.messages (the history). Fix: return only the new messages (tool "
        "results, a user's or judge's reply); env.messages keeps the history and the caller appends "
        "the observation to its own."
    )


class ForgetsObservationEnv(AddEnv):
    async def astep(self, action):
        result = await super().astep(action)
        if result[0]:
            del self.messages[-len(result[0]) :]
        return result


def test_history_that_does_not_hold_the_observation_fails():
    assert str(_fails(ForgetsObservationEnv())) == (
        "new_messages: reference episode, step 1: env.messages grew from 2 to 3 messages; expected "
        "2 + 1 (the assistant turn) + 1 (the returned observation), in that order. Fix: append the "
        "assistant turn, then exactly the messages step returns."
    )


# ---- success ---------------------------------------------------------------------------------------


class NoSuccessEnv(AddEnv):
    async def astep(self, action):
        obs, reward, terminated, truncated, info = await super().astep(action)
        info.pop("success")
        return obs, reward, terminated, truncated, info


SUCCESS_FIX = (
    "state info['success'] on every step: True/False on the step that decides a task with a defined "
    "success, None otherwise (ChatEnv.astep fills None when the env says nothing)."
)


def test_missing_success_fails():
    err = _fails(NoSuccessEnv())
    assert str(err) == f"success: reference episode, step 1: info has no 'success' key. Fix: {SUCCESS_FIX}"


class _NoCalls:
    name = "none"

    def parse(self, text):
        return ParsedAction(text, [], [])


class SuccessOnlyWhenRightEnv(AddEnv):
    """No tools, no tool calls read: every turn is an answer; success is stated only when right."""

    def __init__(self, **kwargs):
        super().__init__(tools=[], parser=_NoCalls(), **kwargs)

    async def score(self, turn):
        out = await super().score(turn)
        if not out.info["success"]:
            del out.info["success"]
        return out


def test_success_none_on_a_terminating_wrong_answer_fails():
    # The reference's answer stated True; the broken text call is a wrong final answer and says None.
    assert str(_fails(SuccessOnlyWhenRightEnv())) == (
        "success: malformed action (a broken text call): info['success'] is None on a step that "
        "terminates a task whose success is defined (reference episode, step 1 stated True). Fix: "
        "state True/False on every terminating step of a task with a defined success (a wrong or "
        "unreadable answer is False, not None)."
    )


class SuccessBeforeTheEndEnv(AddEnv):
    async def react(self, turn):
        out = await super().react(turn)
        out.info.setdefault("success", False)
        return out


def test_success_stated_before_the_end_fails():
    assert str(_fails(SuccessBeforeTheEndEnv())) == (
        "success: reference episode, step 1: info['success'] is False on a step that does not end the "
        "episode. Fix: leave info['success'] None before the end; state it on the step that decides "
        "the task."
    )


class NumericSuccessEnv(AddEnv):
    async def score(self, turn):
        out = await super().score(turn)
        out.info["success"] = int(out.info["success"])
        return out


def test_success_that_is_not_a_bool_fails():
    assert str(_fails(NumericSuccessEnv())) == (
        "success: reference episode, step 2: info['success'] is 1 (int), not True, False or None. "
        "Fix: use a Python bool (bool(x), not a number or numpy bool) or None."
    )


# ---- tool_messages ---------------------------------------------------------------------------------

TOOL_FIX = (
    "answer every call with one tool message (errors included), in the order the calls were made, "
    "each with tool_call_id = its call's id (ChatEnv.run_tools does)."
)


class ReversedToolMessagesEnv(AddEnv):
    async def react(self, turn):
        out = await super().react(turn)
        out.messages.reverse()
        return out


class RenamedToolMessagesEnv(AddEnv):
    async def react(self, turn):
        out = await super().react(turn)
        for i, m in enumerate(out.messages):
            m["tool_call_id"] = f"id_{i}"
        return out


class FirstToolMessageOnlyEnv(AddEnv):
    async def react(self, turn):
        out = await super().react(turn)
        del out.messages[1:]
        return out


class DropsCallsFromHistoryEnv(AddEnv):
    def _to_turn(self, action):
        turn = super()._to_turn(action)
        turn.message.pop("tool_calls", None)
        return turn


@pytest.mark.parametrize(
    ("env_cls", "problem", "fix"),
    [
        (
            # One call in the reference (nothing to reverse); the checker's turn makes three.
            ReversedToolMessagesEnv,
            "tool-call turn (structured calls): the tool messages answer the calls ['chk_2', 'chk_1', "
            "'chk_0'], out of call order ['chk_0', 'chk_1', 'chk_2'].",
            TOOL_FIX,
        ),
        (
            RenamedToolMessagesEnv,
            "reference episode, step 1: the tool messages carry tool_call_ids ['id_0']; the calls' ids "
            "are ['call_ref'].",
            TOOL_FIX,
        ),
        (
            FirstToolMessageOnlyEnv,
            "tool-call turn (structured calls): 1 tool message(s) ['chk_0'] for 3 call(s) ['chk_0', "
            "'chk_1', 'chk_2'].",
            TOOL_FIX,
        ),
        (
            DropsCallsFromHistoryEnv,
            "reference episode, step 1: the assistant turn in env.messages has call ids []; the turn "
            "made the calls ['call_ref'].",
            "keep the turn's calls in the history as sent (ids and order), so each tool message answers "
            "a call of that turn.",
        ),
    ],
)
def test_tool_messages_out_of_order_or_with_wrong_ids_fail(env_cls, problem, fix):
    err = _fails(env_cls())
    assert (err.rule, str(err)) == ("tool_messages", f"tool_messages: {problem} Fix: {fix}")


# ---- stop_strings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stops", "shown"),
    [(["</answer>", 3], "['</answer>', 3]"), (["</answer>", ""], "['</answer>', '']"), ("</answer>", "'</answer>'")],
)
def test_stop_strings_that_are_not_a_list_of_non_empty_str_fail(stops, shown):
    env = AddEnv()
    env.stop_strings = stops
    assert str(_fails(env)) == (
        f"stop_strings: env.stop_strings is {shown}, not a list or tuple of non-empty strings. Fix: set "
        "stop_strings to a list of the non-empty texts that end a turn (e.g. ['</search>', '</answer>']), "
        "an empty list, or leave it undefined."
    )


def test_stop_strings_that_are_a_list_or_tuple_of_str_pass():
    for stops in (["</answer>"], ("</search>", "</answer>"), []):
        env = AddEnv()
        env.stop_strings = stops
        try:
            check_chat_env(env, skip_gymnasium=True)
        finally:
            env.close()


# ---- reference_action ------------------------------------------------------------------------------

REFERENCE_FIX = "make reference_action() return the correct next turn (the env's best behaviour)."


class WrongReferenceEnv(AddEnv):
    def reference_action(self):
        return REFERENCE_CALL if self.turn == 0 else "4"


class EndlessReferenceEnv(AddEnv):
    def reference_action(self):
        return REFERENCE_CALL


def test_reference_below_the_top_reward_fails():
    assert str(_fails(WrongReferenceEnv())) == (
        "reference_action: the reference episode's return is 0 after 2 step(s), below the top reward 1. "
        f"Fix: {REFERENCE_FIX} If the env's best return is not 1.0, pass top_reward= to check_chat_env."
    )


def test_reference_that_never_answers_fails_at_max_turns():
    assert str(_fails(EndlessReferenceEnv(max_turns=3))) == (
        f"reference_action: the reference episode was truncated after 3 step(s) (return 0). Fix: {REFERENCE_FIX}"
    )


def test_top_reward_is_the_callers():
    assert str(_fails(AddEnv(), top_reward=2.0)) == (
        "reference_action: the reference episode's return is 1 after 2 step(s), below the top reward 2. "
        f"Fix: {REFERENCE_FIX} If the env's best return is not 1.0, pass top_reward= to check_chat_env."
    )


def test_an_env_without_a_reference_policy_is_not_asked_for_one():
    class NoReference(AddEnv):
        def reference_action(self):
            raise NotImplementedError

    env = NoReference()
    try:
        check_chat_env(env)
    finally:
        env.close()


# ---- malformed_action ------------------------------------------------------------------------------

NO_RAISE_FIX = (
    "turn a bad call or a malformed turn into an observation (an error `tool` message answering the "
    "call, or a hint for the model), never an exception out of step"
)


class RaisesOnUnknownToolEnv(AddEnv):
    async def react(self, turn):
        for call in turn.parsed.calls:
            if call["function"]["name"] not in self.tool_map:
                raise KeyError(call["function"]["name"])
        return await super().react(turn)


class RaisesOnBadJsonEnv(AddEnv):
    async def react(self, turn):
        if turn.parsed.errors:
            raise ValueError(turn.parsed.errors[0])
        return await super().react(turn)


def test_raising_on_an_unknown_tool_fails():
    assert str(_fails(RaisesOnUnknownToolEnv())) == (
        "malformed_action: malformed action (an unknown tool): step raised KeyError: "
        f"'chatgym_check_no_such_tool' Fix: {NO_RAISE_FIX}"
    )


def test_raising_on_bad_tool_call_json_fails():
    # The checker's tool-call turn holds a call with bad JSON between two good ones.
    assert str(_fails(RaisesOnBadJsonEnv())) == (
        "malformed_action: tool-call turn (structured calls): step raised ValueError: tool call 2: "
        "arguments are not valid JSON (Expecting property name enclosed in double quotes): '{not json' "
        f"Fix: {NO_RAISE_FIX}"
    )


class SilentOnMalformedTextEnv(AddEnv):
    """Ignores a text turn whose calls are all malformed: no observation, the episode goes on."""

    async def react(self, turn):
        parsed = turn.parsed
        if parsed.errors and not parsed.calls and not any(parsed.error_ids):
            return StepOutcome()
        return await super().react(turn)


def test_a_malformed_text_call_left_unanswered_fails():
    # The structured bad-JSON call is answered; the same call written as hermes text is recorded in
    # the history (as written, id call_0) but answered by nothing: a chat API rejects that history.
    assert str(_fails(SilentOnMalformedTextEnv())) == (
        "tool_messages: malformed action (bad tool-call JSON, as text): 0 tool message(s) [] for 1 "
        "call(s) ['call_0']. Fix: answer every call with one tool message (errors included), in the "
        "order the calls were made, each with tool_call_id = its call's id (ChatEnv.run_tools does)."
    )


class SilentOnProseEnv(AddEnv):
    """Llama JSON calls; a turn with no call that is not the answer gets no observation and goes on."""

    def __init__(self, **kwargs):
        super().__init__(parser="json", **kwargs)

    async def react(self, turn):
        parsed = turn.parsed
        if not parsed.calls and not parsed.errors and parsed.content != "5":
            return StepOutcome()
        return await super().react(turn)


def test_a_malformed_turn_answered_by_nothing_fails():
    # The hermes-looking broken call is prose to the json parser (no call to answer): the episode
    # goes on without an observation.
    assert str(_fails(SilentOnProseEnv())) == (
        "malformed_action: malformed action (a broken text call): the episode goes on but step "
        "returned no observation. Fix: answer a malformed turn with a message the model can read (a tool "
        "error or a hint)."
    )


class MalformedTextAnsweredByIdEnv(AddEnv):
    """Answers a malformed text call with the old id ``call_error_<i>``, a call the turn does not have."""

    async def react(self, turn):
        out = await super().react(turn)
        for m, (kind, i) in zip(out.messages, turn.parsed.in_order(), strict=False):
            if kind == "error" and not turn.parsed.error_ids:  # a text turn: no server ids
                m["tool_call_id"] = f"call_error_{i}"
        return out


def test_a_malformed_text_call_answered_under_another_id_fails():
    assert str(_fails(MalformedTextAnsweredByIdEnv())) == (
        "tool_messages: malformed action (bad tool-call JSON, as text): the tool messages carry "
        "tool_call_ids ['call_error_0']; the calls' ids are ['call_0']. Fix: answer every call with one "
        "tool message (errors included), in the order the calls were made, each with tool_call_id = "
        "its call's id (ChatEnv.run_tools does)."
    )


# ---- messages, reset, step -------------------------------------------------------------------------

MESSAGES_FIX = (
    "build messages with chatgym.envs.messages (system, user, assistant, tool, make_tool_call): plain "
    "dicts of str, the OpenAI chat format."
)


class ToolMessageWithoutIdEnv(AddEnv):
    async def react(self, turn):
        out = await super().react(turn)
        for m in out.messages:
            del m["tool_call_id"]
        return out


class NotJsonEnv(AddEnv):
    def initial_messages(self, task):
        return [*super().initial_messages(task), {"role": "user", "content": "hi", "meta": {1, 2}}]


def test_a_tool_message_without_its_call_id_fails():
    # Gymnasium's space accepts it (the id is optional in message_errors); the chat rule does not.
    assert str(_fails(ToolMessageWithoutIdEnv())) == (
        "messages: reference episode, step 1: observation message 0: message {'role': 'tool', "
        "'content': '5', 'name': 'add'} is not a chat message: a tool message has no tool_call_id. "
        f"Fix: {MESSAGES_FIX}"
    )


def test_a_message_that_is_not_json_fails():
    assert str(_fails(NotJsonEnv())) == (
        "messages: reset() observation message 2: message {'role': 'user', 'content': 'hi', 'meta': "
        "{1, 2}} is not a chat message: not JSON-serialisable (Object of type set is not JSON "
        f"serializable). Fix: {MESSAGES_FIX}"
    )


class BadRoleEnv(AddEnv):
    def initial_messages(self, task):
        return [M.system("Add."), {"role": "robot", "content": "2 + 3?"}]


def test_a_bad_opening_message_fails_gymnasium_first_and_the_chat_rule_without_it():
    assert str(_fails(BadRoleEnv())) == (
        "gymnasium: Gymnasium's check_env failed: AssertionError: The first element returned by "
        "`env.reset()` is not within the observation space. Fix: make the env satisfy the Gymnasium "
        "API rule the error names."
    )
    assert str(_fails(BadRoleEnv(), skip_gymnasium=True)) == (
        "messages: reset() observation message 1: message {'role': 'robot', 'content': '2 + 3?'} is "
        "not a chat message: role must be one of ['assistant', 'system', 'tool', 'user'], got 'robot'. "
        f"Fix: {MESSAGES_FIX}"
    )


class BadStepObservationEnv(AddEnv):
    async def react(self, turn):
        out = await super().react(turn)
        out.messages.append({"role": "robot", "content": "beep"})
        return out


def test_a_gymnasium_warning_fails_the_check():
    # Gymnasium's passive checker only warns about an observation outside the space.
    assert str(_fails(BadStepObservationEnv())) == (
        "gymnasium: Gymnasium warned during check_env: WARN: The obs returned by the `step()` method "
        "is not within the observation space. Fix: make the env satisfy the Gymnasium API rule the "
        "warning names."
    )


class OpeningNotInHistoryEnv(AddEnv):
    async def areset(self, *, seed=None, options=None):
        obs, info = await super().areset(seed=seed, options=options)
        return obs[1:], info


def test_reset_whose_observation_is_not_the_history_fails():
    assert str(_fails(OpeningNotInHistoryEnv())) == (
        "reset: after reset() env.messages holds 2 messages that differ from the 1 opening messages "
        "reset() returned. Fix: set env.messages to the opening messages and return copies of them."
    )


class StringRewardEnv(AddEnv):
    async def astep(self, action):
        obs, reward, terminated, truncated, info = await super().astep(action)
        return obs, str(reward), terminated, truncated, info


def test_a_step_result_of_the_wrong_types_fails():
    assert str(_fails(StringRewardEnv(), skip_gymnasium=True)) == (
        "step: reference episode, step 1: reward is str, not a float. Fix: return (list[Message], "
        "float, bool, bool, dict) from step."
    )


class SharedInfoEnv(AddEnv):
    """Returns the same dict inside every info (users keep infos: one change would alter them all)."""

    shared: ClassVar[dict] = {"note": "shared"}

    async def areset(self, *, seed=None, options=None):
        obs, info = await super().areset(seed=seed, options=options)
        return obs, {**info, "meta": self.shared}

    async def astep(self, action):
        *head, info = await super().astep(action)
        return *head, {**info, "meta": self.shared}


def test_a_warning_of_gym_makes_passive_checker_fails_the_check():
    # No chat rule reads info["meta"]; the PassiveEnvChecker that gym.make adds compares the first
    # reset with the first step, then the first step with the second, and warns for each.
    if "chatgym-test/CheckerSharedInfo-v0" not in gym.registry:
        gym.register(id="chatgym-test/CheckerSharedInfo-v0", entry_point=SharedInfoEnv)
    shared = (
        "share an object, therefore, modifying one will modify the other. Environments should return new "
        "info data on every call as users commonly keep the data returned to them."
    )
    assert str(_fails(gym.make("chatgym-test/CheckerSharedInfo-v0"), skip_gymnasium=True)) == (
        "gymnasium: Gymnasium warned during check_chat_env's episodes: WARN: The infos returned by "
        f"`reset` and the following `step` {shared} | WARN: The infos returned by `step` and the "
        f"following `step` {shared} Fix: make the env satisfy the Gymnasium API rule the warning names."
    )
