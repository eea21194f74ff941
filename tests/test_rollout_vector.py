"""Gymnasium's own vector API on chatgym envs: ``gym.make_vec`` in sync and async mode.

The collector is the fast path (episodes never wait for each other); these check that users of the
standard API still get working vector envs: observations are tuples of message lists, rewards and
flags numpy arrays, autoreset as Gymnasium defines it (NEXT_STEP).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from rollout_helpers import TASKS, AddEnv, tool_call_text

import chatgym  # noqa: F401  (registers CodeSandbox-v0)

ENV_ID = "chatgym-test/AddVec-v0"


@pytest.fixture(scope="module", autouse=True)
def registered():
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=AddEnv, disable_env_checker=True)


@pytest.mark.parametrize(
    ("mode", "vector_kwargs"), [("sync", {}), ("async", {"shared_memory": False})], ids=["sync", "async"]
)
def test_make_vec_runs_chat_envs(mode, vector_kwargs):
    envs = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode=mode, vector_kwargs=vector_kwargs)
    try:
        obs, info = envs.reset(options={"task_index": 0})
        assert isinstance(obs, tuple) and len(obs) == 2
        assert obs[0] == [
            {"role": "system", "content": "You add numbers with the add tool."},
            {"role": "user", "content": TASKS[0]["question"]},
        ]
        assert list(info["task_id"]) == ["add-0", "add-0"]
        # env 0 calls the tool, env 1 answers 9 (correct: reward 1, terminated).
        obs, rew, term, trunc, info = envs.step((tool_call_text("add", a=2, b=3), "9"))
        assert obs[0] == [{"role": "tool", "content": "5", "tool_call_id": "call_0", "name": "add"}]
        assert obs[1] == []
        np.testing.assert_array_equal(rew, [0.0, 1.0])
        np.testing.assert_array_equal(term, [False, True])
        np.testing.assert_array_equal(trunc, [False, False])
        # NEXT_STEP autoreset: env 1's action is ignored and it starts a new episode.
        obs, rew, term, trunc, info = envs.step(("The answer is 9.", "ignored"))
        np.testing.assert_array_equal(rew, [1.0, 0.0])
        np.testing.assert_array_equal(term, [True, False])
        assert obs[1][0]["role"] == "system" and obs[1][1]["role"] == "user"
    finally:
        envs.close()


def test_make_vec_async_with_shared_memory_explains_the_fix():
    with pytest.raises(ValueError, match="shared_memory=False"):
        gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="async")


def test_make_vec_on_registered_code_sandbox_env():
    envs = gym.make_vec("CodeSandbox-v0", num_envs=2, vectorization_mode="sync")
    try:
        obs, _ = envs.reset(seed=0)
        assert len(obs) == 2
        for messages in obs:
            assert [m["role"] for m in messages][-1] == "user"
            assert envs.single_observation_space.contains(messages)
    finally:
        envs.close()
