"""MathPython-v0: Math-v0's tasks with a `python` tool on a stateful sandbox session (real LocalSandbox)."""

import asyncio
import json
import os

import gymnasium as gym
import pytest

import chatgym  # noqa: F401  (registers the env ids)

pytest.importorskip("reasoning_gym")

# One fixed task, given directly (reasoning-gym's basic_arithmetic row shape; its scorer reads
# `answer`): 41 * 265 = 10865 (41 * 265 = 41 * 200 + 41 * 65 = 8200 + 2665).
TASK = {
    "question": "Calculate 41 * 265.",
    "answer": "10865",
    "metadata": {"source_dataset": "basic_arithmetic", "expression": "41 * 265"},
}


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_session_keeps_state_across_turns_and_answer_is_scored():
    env = gym.make("MathPython-v0", split="test").unwrapped
    try:
        obs, info = env.reset(options={"task": TASK})
        assert [t["function"]["name"] for t in info["tools"]] == ["python"]
        assert obs[1] == {"role": "user", "content": "Calculate 41 * 265."}

        obs, reward, terminated, truncated, info = env.step(call("x = 41 * 265"))
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert obs[0]["role"] == "tool" and obs[0]["content"] == "status: ok (exit code 0)\n(no output)"
        assert info["tool_calls"] == 1 and info["tool_errors"] == 0 and info["python_status"] == "ok"

        # The second call sees the first call's variable: one interpreter for the episode.
        obs, *_ = env.step(call("print(x + 1)"))
        assert obs[0]["content"] == "status: ok (exit code 0)\nstdout:\n10866"

        _, reward, terminated, truncated, info = env.step("<answer>10865</answer>")
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info["success"] is True
        assert (info["python_calls"], info["python_ok"], info["python_errors"]) == (2, 2, 0)
        assert info["reward_components"] == {"correct": 1.0, "format": 1.0, "call_bonus": 0.0}
    finally:
        env.close()


def test_sandbox_error_is_an_observation_and_counted():
    env = gym.make("MathPython-v0", split="test").unwrapped
    try:
        env.reset(options={"task": TASK})
        obs, reward, terminated, _, info = env.step(call("1 / 0"))
        assert (reward, terminated) == (0.0, False)
        text = obs[0]["content"]
        assert text.startswith("status: error (exit code 1)\nstderr:\n") and "ZeroDivisionError" in text
        assert info["tool_errors"] == 1 and info["python_status"] == "error"
        # The interpreter survives an exception: the next call still runs in it.
        obs, *_ = env.step(call("y = 2\ny * 21"))
        assert obs[0]["content"] == "status: ok (exit code 0)\nstdout:\n42"
        _, reward, _, _, info = env.step("<answer>10866</answer>")
        assert reward == 0.0 and info["success"] is False
        assert (info["python_calls"], info["python_ok"], info["python_errors"]) == (2, 1, 1)
    finally:
        env.close()


def test_call_bonus_needs_an_ok_call_and_is_not_success():
    env = gym.make("MathPython-v0", split="test", call_bonus=0.25).unwrapped
    try:
        # No call: the bonus is 0; the answer alone is scored.
        env.reset(options={"task": TASK})
        _, reward, _, _, info = env.step("<answer>10865</answer>")
        assert reward == 1.0 and info["reward_components"]["call_bonus"] == 0.0

        # Only a failing call: still no bonus.
        env.reset(options={"task": TASK})
        env.step(call("undefined_name"))
        _, reward, _, _, info = env.step("<answer>1</answer>")
        assert reward == 0.0 and info["python_errors"] == 1

        # An ok call and a wrong answer: 0 + 0.25, and success stays False.
        env.reset(options={"task": TASK})
        env.step(call("print(41 * 265)"))
        _, reward, _, _, info = env.step("<answer>1</answer>")
        assert reward == 0.25 and info["success"] is False
        assert info["reward_components"] == {"correct": 0.0, "format": 1.0, "call_bonus": 0.25}

        # An ok call and the right answer: 1 + 0.25.
        env.reset(options={"task": TASK})
        env.step(call("print(41 * 265)"))
        _, reward, _, _, info = env.step("<answer>10865</answer>")
        assert reward == 1.25 and info["success"] is True
    finally:
        env.close()


def test_each_episode_gets_a_fresh_interpreter():
    env = gym.make("MathPython-v0", split="test").unwrapped
    try:
        env.reset(options={"task": TASK})
        env.step(call("secret = 7"))
        first = env._session
        env.reset(options={"task": TASK})
        assert first.closed and env._session is None and env.python_calls == 0
        obs, *_ = env.step(call("print(secret)"))
        assert obs[0]["content"].startswith("status: error") and "NameError" in obs[0]["content"]
    finally:
        env.close()
    assert env._session is None  # close() ends the episode's interpreter


def test_turn_limit_truncates_without_reward():
    env = gym.make("MathPython-v0", split="test", max_turns=2).unwrapped
    try:
        env.reset(options={"task": TASK})
        env.step(call("1"))
        _, reward, terminated, truncated, info = env.step(call("2"))
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert info["success"] is None
    finally:
        env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"run_timeout_s": 0}, "run_timeout_s must be > 0, got 0"),
        ({"memory_mb": 8}, "memory_mb must be an int >= 16"),
        ({"max_output_chars": 0}, "max_output_chars must be an int >= 1, got 0"),
        ({"call_bonus": -0.1}, "call_bonus must be >= 0, got -0.1"),
        ({"calculator": True}, "calculator=True is not supported"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gym.make("MathPython-v0", **kwargs)


def test_demo_opens_with_a_worked_episode_whose_tool_result_is_real():
    env = gym.make("MathPython-v0", split="test", demo=True).unwrapped
    try:
        obs, _ = env.reset(options={"task": TASK})
        assert [m["role"] for m in obs] == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert obs[1]["content"] == "Calculate 17 * 23." and obs[-1]["content"] == "Calculate 41 * 265."
        [demo_call] = obs[2]["tool_calls"]
        assert demo_call["function"] == {"name": "python", "arguments": '{"code": "print(17 * 23)"}'}
        assert obs[4]["content"] == "<answer>391</answer>"  # 17 * 23 = 391
        # The demo's tool result is what the env's own tool returns for that call.
        real, *_ = env.step(call("print(17 * 23)"))
        assert real[0]["content"] == obs[3]["content"] == "status: ok (exit code 0)\nstdout:\n391"
    finally:
        env.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="a private /tmp per session needs root (mount namespaces)")
async def test_two_episodes_in_flight_write_the_same_tmp_name():
    # Each episode's session has its own /tmp: both calls write /tmp/result.txt, hold it while the
    # other writes too, and read back their own (on a shared /tmp the second got PermissionError).
    code = "import time\nopen('/tmp/result.txt', 'w').write({!r})\ntime.sleep(0.5)\nprint(open('/tmp/result.txt').read())"
    envs = [gym.make("MathPython-v0", split="test").unwrapped for _ in range(2)]
    try:
        for env in envs:
            await env.areset(options={"task": TASK})
        steps = await asyncio.gather(
            *(env.astep(call(code.format(tag))) for env, tag in zip(envs, ("one", "two"), strict=True))
        )
        for (obs, _, _, _, info), tag in zip(steps, ("one", "two"), strict=True):
            assert obs[0]["content"] == f"status: ok (exit code 0)\nstdout:\n{tag}"
            assert (info["tool_calls"], info["tool_errors"], info["python_status"]) == (1, 0, "ok")
    finally:
        for env in envs:
            await env.aclose()
