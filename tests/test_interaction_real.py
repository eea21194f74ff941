"""UserSim-v0 and Judge-v0 with a real model on both sides (slow): SmolLM2 on in-process vLLM (CPU) is
the agent (through the collector) and, through ``EngineResponder``, the simulated user / the judge.

SmolLM2-135M is far too weak to solve a tau2 task or to judge reliably; these tests check that real
episodes run end to end without errors: the collector's trajectory is well formed, the other party's
replies are real model text, and a co-trained judge's own samples come back with token ids and
logprobs that line up.
"""

from __future__ import annotations

import importlib.util

import pytest

from chatgym.trainer.engines.base import SamplingParams
from chatgym.trainer.engines.responder import EngineResponder
from chatgym.trainer.rollout.collector import Collector, RolloutConfig

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (chatgym[vllm])"),
]


@pytest.fixture(scope="module")
def tok():
    from chatgym.trainer.chat.tokenizer import get_tokenizer

    return get_tokenizer("smollm2")


@pytest.fixture(scope="module")
def engine(tok):
    from chatgym.trainer.engines.vllm_inproc import VLLMEngine

    # The tau2 agent prompt (policy + 14-15 tool schemas) is ~4,800 SmolLM2 tokens.
    return VLLMEngine("smollm2", tok, dtype="float32", max_model_len=8192, enforce_eager=True, kv_cache_gib=1)


def _collector(engine, tok) -> Collector:
    cfg = RolloutConfig(
        temperature=0.0, max_model_len=8192, max_tokens=48, max_response_tokens=160, episode_timeout_s=900
    )
    return Collector(engine, tok, cfg)


async def test_usersim_episode_with_a_model_user(engine, tok):
    import chatgym  # noqa: F401  (registers UserSim-v0)

    user = EngineResponder(engine, tok, params=SamplingParams(max_tokens=40, temperature=0.0))
    col = _collector(engine, tok)
    try:
        trajs = await col.collect(
            "UserSim-v0", [0], env_kwargs={"domain": "retail", "split": "test", "user": user, "max_turns": 3}
        )
    finally:
        col.close()
    assert col.last_stats.failed == 0, [t.error for t in trajs]
    [traj] = trajs
    assert traj.terminated or traj.truncated
    roles = [m["role"] for m in traj.messages]
    assert roles[:3] == ["system", "assistant", "user"]
    assert traj.messages[2]["content"].strip()  # the model user's opening line
    assert sum(traj.loss_mask) == sum(r["completion_tokens"] for r in traj.info["turns"]) > 0
    print("usersim:", roles, traj.rewards, traj.info.get("reward_components"), traj.info.get("truncated_by"))


async def test_judge_episode_with_a_co_trained_model_judge(engine, tok):
    import chatgym  # noqa: F401  (registers Judge-v0)

    judge = EngineResponder(engine, tok, params=SamplingParams(max_tokens=64, temperature=0.0), trace=True)
    col = _collector(engine, tok)
    try:
        trajs = await col.collect(
            "Judge-v0",
            [0],
            env_kwargs={"split": "all", "judge": judge, "max_revisions": 1, "judge_retries": 1},
        )
    finally:
        col.close()
    assert col.last_stats.failed == 0, [t.error for t in trajs]
    [traj] = trajs
    assert traj.terminated or traj.truncated
    traces = traj.info["judge_traces"]
    assert traces, "the judge was asked at least once"
    for t in traces:
        assert len(t["token_ids"]) == len(t["logprobs"]) > 0 and t["prompt_ids"]
        assert (t["rating"] is None) == (t["error"] is not None)
    # A malformed judge reply ends the episode as a visible judge_error, never as a made-up score.
    assert traj.info["status"] in ("ok", "judge_error")
    if traj.info["status"] == "judge_error":
        assert traj.truncated and sum(traj.rewards) == 0.0
    print(
        "judge:", traj.info["status"], traj.info.get("ratings"), [t["rating"] for t in traces], traj.rewards
    )
