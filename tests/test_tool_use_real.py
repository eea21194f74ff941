"""Slow: ToolUse-v0 episodes with SmolLM2 on vLLM (CPU) as the agent, through the collector."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import pytest

from chatgym.trainer.rollout.collector import Collector, RolloutConfig

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (chatgym[vllm])"),
    pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None, reason="needs bfcl-eval"),
]


async def test_vllm_agent_on_single_and_multi_turn_bfcl():
    import chatgym  # noqa: F401  (registers ToolUse-v0)
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines.vllm_inproc import VLLMEngine

    tok = get_tokenizer("smollm2")
    # A multi-turn entry's prompt (system + ~30 tool schemas of two backends) is ~5,000 SmolLM2 tokens.
    engine = VLLMEngine("smollm2", tok, dtype="float32", max_model_len=8192, enforce_eager=True, kv_cache_gib=1)
    cfg = RolloutConfig(
        temperature=0.0, max_model_len=8192, max_tokens=64, max_response_tokens=256, episode_timeout_s=900
    )
    col = Collector(engine, tok, cfg)
    try:
        single = await col.collect("ToolUse-v0", [0, 1], env_kwargs={"category": "simple"})
        assert col.last_stats.failed == 0, [t.error for t in single]
        multi = await col.collect(
            lambda: gym.make("ToolUse-v0", category="multi_turn_base", max_steps_per_turn=2), [0]
        )
        assert col.last_stats.failed == 0, [t.error for t in multi]
    finally:
        await engine.close()
        col.close()
    for traj in [*single, *multi]:
        assert traj.error is None
        assert traj.terminated or traj.truncated
        assert traj.num_turns >= 1 and len(traj.token_ids) > 0
        assert traj.reward in (0.0, 1.0)
    print("rewards", [t.reward for t in single], [t.reward for t in multi], "turns", [t.num_turns for t in multi])
