"""The ChatEnv contract, on a small env defined here, and check_env over every registered env id."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs import ChatEnv, StepOutcome
from chatgym.envs import messages as M
from chatgym.envs.registration import ENV_SPECS

ROOT = Path(__file__).resolve().parents[1]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


TASKS = [{"task_id": f"t{i}", "a": i, "b": 10 * i} for i in range(5)]


class SumEnv(ChatEnv):
    """Five tasks "a + b"; an `add` tool; a final answer equal to a + b earns 1."""

    def __init__(self, **kwargs):
        kwargs.setdefault("tools", [add])
        super().__init__(**kwargs)
        self.closed = 0

    def load_tasks(self, split):
        return TASKS if split == "test" else []

    def initial_messages(self, task):
        return [M.system("Add the numbers. Tool: add."), M.user(f"What is {task['a']} + {task['b']}?")]

    async def score(self, turn):
        right = turn.message["content"].strip() == str(self.task["a"] + self.task["b"])
        return StepOutcome(
            reward=1.0 if right else 0.0, terminated=True, info={"reward_components": {"exact": right}}
        )

    async def aclose(self):
        self.closed += 1


ADD_3_30 = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 30}}</tool_call>'


@pytest.fixture
def env():
    e = SumEnv()
    yield e
    e.close()


def test_observations_are_only_the_new_messages(env):
    obs, info = env.reset(options={"task_index": 3})
    assert obs == [
        {"role": "system", "content": "Add the numbers. Tool: add."},
        {"role": "user", "content": "What is 3 + 30?"},
    ]
    assert info == {"task_id": "t3", "task_index": 3, "tools": env.tools}
    assert env.tools[0]["function"]["name"] == "add"

    obs, reward, terminated, truncated, info = env.step(ADD_3_30)
    assert obs == [{"role": "tool", "content": "33", "tool_call_id": "call_0", "name": "add"}]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert (info["turn"], info["tool_calls"], info["tool_errors"]) == (1, 1, 0)

    obs, reward, terminated, truncated, info = env.step("33")
    assert obs == []
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["reward_components"] == {"exact": True}

    # The full history lives on the env, with the assistant turns as parsed.
    assert env.messages == [
        {"role": "system", "content": "Add the numbers. Tool: add."},
        {"role": "user", "content": "What is 3 + 30?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 3, "b": 30}'},
                }
            ],
        },
        {"role": "tool", "content": "33", "tool_call_id": "call_0", "name": "add"},
        {"role": "assistant", "content": "33"},
    ]


def test_returned_messages_are_copies(env):
    obs, _ = env.reset(options={"task_index": 0})
    obs[0]["content"] = "changed"
    assert env.messages[0]["content"] == "Add the numbers. Tool: add."


def test_task_selection_by_index_row_and_seed():
    env, other = SumEnv(), SumEnv()
    try:
        assert env.reset(options={"task_index": 4})[1]["task_id"] == "t4"
        _, info = env.reset(options={"task": {"task_id": "mine", "a": 7, "b": 8}})
        assert (info["task_id"], info["task_index"], env.messages[1]["content"]) == (
            "mine",
            None,
            "What is 7 + 8?",
        )
        with pytest.raises(IndexError, match="task_index 5 out of range for split 'test' \\(5 tasks\\)"):
            env.reset(options={"task_index": 5})
        for seed in range(8):
            # Gymnasium seeds np_random with PCG64(SeedSequence(seed)); the env draws integers(5).
            expected = int(np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed))).integers(5))
            assert env.reset(seed=seed)[1]["task_index"] == expected
            assert other.reset(seed=seed)[1]["task_index"] == expected
        assert len({env.reset(seed=s)[1]["task_index"] for s in range(20)}) > 1
    finally:
        env.close()
        other.close()


def test_empty_split_is_a_clear_error():
    env = SumEnv(split="train")
    try:
        with pytest.raises(ValueError, match="SumEnv: split 'train' has no tasks"):
            env.reset(seed=0)
    finally:
        env.close()


def test_truncation_at_max_turns():
    env = SumEnv(max_turns=2)
    try:
        env.reset(options={"task_index": 3})
        assert env.step(ADD_3_30)[2:4] == (False, False)
        _, _, terminated, truncated, info = env.step(ADD_3_30)
        assert (terminated, truncated, info["turn"]) == (False, True, 2)
        # A final answer on the last turn terminates; it is not also truncated.
        env.reset(options={"task_index": 3})
        env.step(ADD_3_30)
        assert env.step("33")[1:4] == (1.0, True, False)
    finally:
        env.close()
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        SumEnv(max_turns=0)


ACTIONS = [ADD_3_30, '<tool_call>{"name": "add", "arguments": {"a": "3"}}</tool_call>', "33"]


def test_sync_and_async_apis_give_the_same_results():
    sync_env, async_env = SumEnv(), SumEnv()
    try:
        sync_trace = [sync_env.reset(seed=11)] + [sync_env.step(a) for a in ACTIONS]

        async def run():
            return [await async_env.areset(seed=11)] + [await async_env.astep(a) for a in ACTIONS]

        async_trace = asyncio.run(run())
        assert sync_trace == async_trace
        assert sync_env.messages == async_env.messages
        # The bad call (a string for an int, b missing) came back as an error message, not a raise.
        assert async_trace[2][0][0]["content"] == (
            "Error: add: invalid arguments: 'b' is a required property; a: '3' is not of type 'integer'"
        )
    finally:
        sync_env.close()
        async_env.close()


async def test_sync_api_works_inside_a_running_event_loop(env):
    # As in Jupyter: a loop is running in this thread, and the user calls the plain Gymnasium API.
    obs, _ = env.reset(options={"task_index": 1})
    assert obs[1]["content"] == "What is 1 + 10?"
    obs, *_ = env.step('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 10}}</tool_call>')
    assert obs[0]["content"] == "11"
    assert env.step("11")[1:3] == (1.0, True)


def check_env_warnings(env: gym.Env) -> list[str]:
    """Run Gymnasium's full check_env (render modes included) and return its warnings.

    The one about ``metadata["render_fps"]`` is dropped: it concerns frame pacing of "human"
    rendering, and a chat transcript rendered as text has no frame rate.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=False)
    return [str(w.message) for w in caught if "render_fps" not in str(w.message)]


def test_check_env_passes_without_warnings():
    # Made through gym.make so check_env can also re-create it in each render mode from its spec.
    if "chatgym-test/Sum-v0" not in gym.registry:
        gym.register(id="chatgym-test/Sum-v0", entry_point=SumEnv, disable_env_checker=True)
    env = gym.make("chatgym-test/Sum-v0").unwrapped
    try:
        assert check_env_warnings(env) == []
    finally:
        env.close()


@pytest.mark.parametrize(
    "action",
    [42, None, b"bytes", ["list"], {"role": "user", "content": "hi"}, {"role": "assistant", "content": 3}],
)
def test_malformed_action_type_raises_type_error(env, action):
    env.reset(seed=0)
    with pytest.raises(TypeError, match="action must be a str or an assistant Message, got"):
        env.step(action)


def test_assistant_message_actions_are_accepted(env):
    env.reset(options={"task_index": 2})
    obs, *_ = env.step({"role": "assistant", "content": ADD_3_30.replace("3, ", "2, ").replace("30", "20")})
    assert obs[0]["content"] == "22"
    assert env.step({"role": "assistant", "content": "22"})[1] == 1.0


def test_step_before_reset_is_a_clear_error(env):
    with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
        env.step("hi")


def test_close_with_and_without_reset():
    fresh = SumEnv()
    fresh.close()
    assert fresh.closed == 1
    used = SumEnv()
    used.reset(seed=0)
    used.step(ADD_3_30)
    used.close()
    used.close()  # closing twice is harmless
    assert used.closed == 2
    assert used._loop is None


def test_render_ansi():
    env = SumEnv(render_mode="ansi")
    try:
        env.reset(options={"task_index": 0})
        assert env.render() == "[system] Add the numbers. Tool: add.\n[user] What is 0 + 0?"
    finally:
        env.close()
    with pytest.raises(ValueError, match="render_mode must be None or 'ansi', got 'human'"):
        SumEnv(render_mode="human")


# ---- every registered env ------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", sorted(ENV_SPECS))
def test_every_registered_env_passes_check_env(env_id):
    assert env_id in gym.registry
    env = gym.make(env_id).unwrapped
    try:
        assert isinstance(env, ChatEnv)
        assert check_env_warnings(env) == []
    finally:
        env.close()



_IMAGE_ENVS = {"VisualGrid-v0", "ChartQA-v0"}  # they read options["image_size"] too


@pytest.mark.parametrize("env_id", sorted(ENV_SPECS))
def test_every_registered_env_refuses_an_unknown_reset_option(env_id):
    # Regression (fresh-user walk): reset(options={"tsk": 1}) was accepted and drew a random task.
    env = gym.make(env_id)
    try:
        with pytest.raises(ValueError) as err:
            env.reset(options={"tsk": 1})
        accepted = "'image_size', 'task', 'task_index'" if env_id in _IMAGE_ENVS else "'task', 'task_index'"
        assert str(err.value) == (
            f"{type(env.unwrapped).__name__}: unknown reset option 'tsk' (did you mean 'task'?); "
            f"the options it reads: {accepted}"
        )
        # Regression (second walk): the visual envs read options["image_size"] first, so a list was an
        # AttributeError there; every env says what options must be.
        with pytest.raises(TypeError) as err:
            env.reset(options=[("task_index", 0)])
        assert str(err.value) == f"{type(env.unwrapped).__name__}: options must be a dict, got list"
        assert env.reset(options={"task_index": 0})[1]["task_index"] == 0  # the known keys still work
        # Regression (fresh-user walk): after that first reset raised, Gymnasium's PassiveEnvChecker made
        # every step a TypeError ('cannot unpack non-iterable NoneType'); the built-in envs go without it.
        obs, reward, terminated, truncated, info = env.step("I do not know.")
        assert isinstance(obs, list) and isinstance(reward, float) and isinstance(info, dict)
        assert isinstance(terminated, bool) and isinstance(truncated, bool)
    finally:
        env.close()


def test_task_index_is_an_int_and_task_and_task_index_are_not_both_given():
    # Regression (fresh-user walk): task_index "3" played task 3, 1.5 and True task 1; with both keys
    # the task row won without a word.
    import numpy as np

    env = SumEnv()
    try:
        for bad in ("3", 1.5, True):
            with pytest.raises(TypeError) as err:
                env.reset(options={"task_index": bad})
            assert str(err.value) == f"SumEnv: options['task_index'] must be an int, got {bad!r}"
        assert env.reset(options={"task_index": np.int64(1)})[1]["task_index"] == 1  # NumPy's ints are ints
        with pytest.raises(ValueError) as err:
            env.reset(options={"task_index": 0, "task": {"a": 1, "b": 2}})
        assert str(err.value) == "SumEnv: give options['task'] or options['task_index'], not both"
    finally:
        env.close()


def test_reset_options_are_a_dict_of_known_keys():
    env = SumEnv()
    try:
        with pytest.raises(ValueError) as err:
            env.reset(options={"task_index": 0, "seed": 3})  # the seed is reset's own argument
        assert str(err.value) == "SumEnv: unknown reset option 'seed'; the options it reads: 'task', 'task_index'"
        with pytest.raises(TypeError) as err:
            env.reset(options=[("task_index", 0)])
        assert str(err.value) == "SumEnv: options must be a dict, got list"
    finally:
        env.close()

# ---- packaging -----------------------------------------------------------------------------------


def _declared_packages() -> tuple[list[str], dict[str, str]]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return config["packages"], config["package-dir"]


def test_every_package_folder_is_listed_in_pyproject():
    packages, package_dir = _declared_packages()
    found = set()
    for top in package_dir.values():
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            root_pkg = next(k for k, v in package_dir.items() if v == top)
            found.add(".".join([root_pkg, *rel.parts]))
    assert {"chatgym.envs", "chatgym.sandboxes", "chatgym.retrievers", "chatgym.trainer"} <= found
    assert sorted(found - set(packages)) == [], "add these to [tool.setuptools] packages in pyproject.toml"


def test_every_listed_package_exists():
    packages, package_dir = _declared_packages()
    for pkg in packages:
        root = max((k for k in package_dir if pkg == k or pkg.startswith(k + ".")), key=len)
        folder = ROOT / package_dir[root] / Path(*pkg[len(root) + 1 :].split(".") if pkg != root else ())
        assert (folder / "__init__.py").is_file(), (
            f"{pkg} is listed in pyproject but {folder} has no __init__.py"
        )


def test_openai_message_with_null_content_and_tool_calls_is_accepted():
    # Regression: OpenAI-compatible servers send "content": null beside tool_calls; step must not raise.
    env = SumEnv()
    env.reset(options={"task_index": 0})
    action = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}],
    }
    obs, reward, terminated, truncated, _ = env.step(action)
    assert obs == [{"role": "tool", "content": "5", "tool_call_id": "c1", "name": "add"}]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.messages[-2]["content"] == ""
    env.close()


def test_step_after_the_episode_ended_raises():
    # Regression: a finished episode accepted more steps and scored the task again (reward counted twice).
    env = SumEnv()
    env.reset(options={"task_index": 0})
    *_, terminated, truncated, _ = env.step("0")
    assert terminated or truncated
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("0")
    env.reset(options={"task_index": 0})  # a new episode steps again
    env.step("0")
    env.close()


def test_malformed_server_call_is_answered_by_its_own_id():
    # Regression: a server-structured call with bad JSON got a tool message "call_error_0" that matched
    # no call of the assistant turn (strict chat APIs reject that history on the next request).
    env = SumEnv()
    env.reset(options={"task_index": 0})
    bad = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": '}}
    good = {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    obs, *_ = env.step({"role": "assistant", "content": None, "tool_calls": [bad, good]})
    # One tool message per call, in the calls' order (the error first: it was the first call).
    assert [m["tool_call_id"] for m in obs] == ["c1", "c2"]
    assert obs[0]["content"].startswith("Error: could not parse tool call: tool call 1: arguments are not valid JSON")
    assert obs[1]["content"] == "5"
    assistant = env.messages[-3]
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]  # the server's order
    assert assistant["tool_calls"][0] == bad  # kept as sent, so the error above answers a real call
    env.close()


def test_text_parsed_malformed_call_is_recorded_and_answered_by_its_id():
    # The history records the malformed call as written (no JSON, so no readable name) under the id
    # its error answers; it used to record no call while the error answered "call_error_0".
    env = SumEnv()
    env.reset(options={"task_index": 0})
    obs, *_ = env.step('<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>')
    assert [m["tool_call_id"] for m in obs] == ["call_0"]
    assert env.messages[-2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "invalid", "arguments": '{"name": "add", "arguments": {"a": 1,'}}
        ],
    }
    env.close()


def test_a_task_that_is_no_row_is_refused_naming_the_option():
    # Regression (fresh-user walk): reset(options={"task": "what is 1+1"}) was dict()'s "dictionary
    # update sequence element #0 has length 1; 2 is required".
    env = gym.make("Math-v0")
    with pytest.raises(TypeError) as err:
        env.reset(options={"task": "what is 1+1"})
    assert str(err.value) == ("MathEnv: options['task'] must be a task row (a dict of the env's fields), got str: "
                              "'what is 1+1'")


def test_load_prompt_reads_a_file_once_and_strips_it():
    # Envs are made per episode; the prompt text must come from the file once, not per episode.
    from importlib import resources

    from chatgym.envs.core import load_prompt

    text = resources.files("chatgym.envs.math").joinpath("prompts", "math_system.txt").read_text("utf-8")
    load_prompt.cache_clear()
    assert load_prompt("chatgym.envs.math", "math_system.txt") == text.strip() != ""
    assert load_prompt("chatgym.envs.math", "math_system.txt") == text.strip()
    assert (load_prompt.cache_info().misses, load_prompt.cache_info().hits) == (1, 1)
    for _ in range(2):  # a missing file is not remembered: it raises every time
        with pytest.raises(FileNotFoundError):
            load_prompt("chatgym.envs.math", "no_such_prompt.txt")
