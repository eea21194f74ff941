"""The collector with real engines on SmolLM2 (slow): transformers and in-process vLLM (CPU).

Each trajectory is checked against independent computations:
* its decoded ids equal the chat template's rendering of its messages (the stream is well formed);
* every generated token's logprob equals a teacher-forced forward pass of the HF model (float32) over
  the whole trajectory, and — greedy — each generated id is that pass's argmax wherever the top two
  logits are not a near tie: the ids are what the model sampled, not a re-encoding of its text.
"""

from __future__ import annotations

import importlib.util

import pytest
from rollout_helpers import AddEnv

from chatgym.trainer.chat.delta import ChatRenderer
from chatgym.trainer.rollout.collector import Collector, RolloutConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tok():
    from chatgym.trainer.chat.tokenizer import get_tokenizer

    return get_tokenizer("smollm2")


@pytest.fixture(scope="module")
def hf_model():
    from chatgym.trainer.models.packaged import load_model

    return load_model("smollm2", dtype="float32")


def teacher_forced(model, ids):
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def check_trajectory(traj, tok, tools, model, logprob_atol: float, greedy: bool) -> None:
    n = len(traj.token_ids)
    assert len(traj.loss_mask) == len(traj.engine_logprobs) == n
    spans = [(r["start"], r["start"] + r["completion_tokens"]) for r in traj.info["turns"]]
    expected_mask = [0] * n
    for a, b in spans:
        expected_mask[a:b] = [1] * (b - a)
    assert traj.loss_mask == expected_mask
    assert all(lp == 0.0 for lp, m in zip(traj.engine_logprobs, traj.loss_mask, strict=True) if not m)

    # Well-formed stream: decoded ids == the template's rendering of the messages. After the last
    # completion the template would close the turn ("\n" after <|im_end|>, or <|im_end|>\n when cut).
    text = tok.decode(traj.token_ids, skip_special_tokens=False)
    renderer = ChatRenderer(tok)
    last = traj.info["turns"][-1]
    if "observation_tokens" in last:  # ended on an observation (a budget ran out before the next turn)
        assert text == renderer.render(traj.messages, tools, add_generation_prompt=True)
    else:
        tail = "\n" if last["finish_reason"] == "stop" else "<|im_end|>\n"
        assert text + tail == renderer.render(traj.messages, tools)

    lp = teacher_forced(model, traj.token_ids)
    top2 = lp.topk(2, dim=-1)
    for t in range(1, n):
        if not traj.loss_mask[t]:
            continue
        ref = float(lp[t - 1, traj.token_ids[t]])
        assert abs(traj.engine_logprobs[t] - ref) <= logprob_atol, (t, traj.engine_logprobs[t], ref)
        margin = float(top2.values[t - 1, 0] - top2.values[t - 1, 1])
        if greedy and margin > 1e-2:
            assert traj.token_ids[t] == int(top2.indices[t - 1, 0]), t


async def test_transformers_engine_tool_episodes(tok, hf_model):
    from chatgym.trainer.engines.hf import TransformersEngine

    engine = TransformersEngine(hf_model, tok, max_batch_size=8)
    cfg = RolloutConfig(temperature=0.0, max_tokens=40, max_response_tokens=100, episode_timeout_s=300)
    col = Collector(engine, tok, cfg)
    try:
        trajs = await col.collect(AddEnv, [0, 1], group_size=2)
    finally:
        await engine.close()
        col.close()
    assert col.last_stats.failed == 0, [t.error for t in trajs]
    tools = AddEnv().tools
    for traj in trajs:
        check_trajectory(traj, tok, tools, hf_model, logprob_atol=1e-3, greedy=True)
    # Greedy: the samples of a group are the same episode.
    assert trajs[0].token_ids == trajs[1].token_ids and trajs[2].token_ids == trajs[3].token_ids


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM not installed (pip install 'chatgym[vllm]')"
)
async def test_vllm_cpu_code_sandbox_episode(tok, hf_model):
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers CodeSandbox-v0)
    from chatgym.trainer.engines.vllm_inproc import VLLMEngine

    engine = VLLMEngine(
        "smollm2", tok, dtype="float32", max_model_len=2048, enforce_eager=True, kv_cache_gib=1
    )
    cfg = RolloutConfig(
        temperature=0.0, max_model_len=2048, max_tokens=64, max_response_tokens=128, episode_timeout_s=600
    )
    col = Collector(engine, tok, cfg)
    try:
        trajs = await col.collect("CodeSandbox-v0", [0, 1], group_size=2)
    finally:
        await engine.close()
        col.close()
    assert col.last_stats.failed == 0, [t.error for t in trajs]
    env = gym.make("CodeSandbox-v0")
    tools = env.unwrapped.tools
    env.close()
    for traj in trajs:
        assert traj.env_id == "CodeSandbox-v0" and traj.num_turns >= 1
        assert traj.terminated or traj.truncated
        # vLLM's CPU kernels (float32) vs the HF forward pass: same model, different kernels.
        check_trajectory(traj, tok, tools, hf_model, logprob_atol=2e-2, greedy=True)
