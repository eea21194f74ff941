"""Per-turn estimators end to end: a scripted policy plays the real MathCalculator-v0 through the real
collector (3 samples of one task, 2/2/1 turns, two samples making the same calculator call so they
share an anchor state), then the real ``Learner`` prepares the batch and takes one CPU step with a
tiny random model. The advantages placed on each turn's tokens are the values computed by hand."""

from __future__ import annotations

import json

import pytest
import torch

import chatgym  # noqa: F401  (registers env ids)

IM_END = 2  # SmolLM2's <|im_end|>
SAMPLING_SEED = 7


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# Test task 0 asks "Calculate 26 - 28." (answer -2). Samples 0 and 1 make the same call, see the same
# result (one anchor state for their turn 1); sample 1 then answers wrong; sample 2 answers at once.
SCRIPTS = [
    [call("calculate", expression="26 - 28"), "<answer>-2</answer>"],  # rewards [0, 1]
    [call("calculate", expression="26 - 28"), "<answer>5</answer>"],  # rewards [0, 0]
    ["<answer>-2</answer>"],  # rewards [1]
]

# Hand values per (sample, turn). Returns G: gamma 0.5 -> [0.5, 1], [0, 0], [1]; gamma 1 -> [1, 1], [0, 0], [1].
HAND = {
    # Episode R = 1, 0, 1: mean 2/3, std sqrt(1/3): +-0.577350 / -1.154701 on every token.
    "grpo": ({"eps": 0.0}, [[0.577350, 0.577350], [-1.154701, -1.154701], [0.577350]]),
    # gamma 0.5: turn 0 {0.5, 0, 1}: mean 0.5, std 0.5 -> 0, -1, 1; turn 1 {1, 0} -> +-0.707107.
    "turn_grpo": ({"gamma": 0.5, "eps": 0.0}, [[0.0, 0.707107], [-1.0, -0.707107], [1.0]]),
    # A^E as grpo; step group "prompt" {0.5, 0, 1} -> 0, -1, 1; step group "after the call" {1, 0} -> +-0.707107.
    "gigpo": (
        {"gamma": 0.5, "omega": 1.0, "eps": 0.0},
        [[0.577350, 0.577350 + 0.707107], [-1.154701 - 1.0, -1.154701 - 0.707107], [0.577350 + 1.0]],
    ),
    # gamma 1, sample 2 padded with 0 at turn 1: turn 0 s0 1 - (0 + 1)/2, s1 0 - (1 + 1)/2, s2 1 - (1 + 0)/2;
    # turn 1 s0 1 - (0 + 0)/2, s1 0 - (1 + 0)/2.
    "turn_rloo": ({}, [[0.5, 1.0], [-1.0, -0.5], [0.5]]),
}


class PerSampleEngine:
    """Scripted engine: the reply of sample s at turn k is ``SCRIPTS[s][k]``, found from the request's
    sampling seed (the collector's ``request_seed(base, group, sample, turn)``)."""

    def __init__(self, tok):
        from chatgym.trainer.rollout.collector import request_seed

        self.tok = tok
        self.weight_version = 0
        self.by_seed = {request_seed(SAMPLING_SEED, 0, s, k): (s, k) for s in range(3) for k in range(4)}

    async def generate(self, prompt_ids, params):
        from chatgym.trainer.engines.base import Completion
        from chatgym.trainer.engines.replay import replay_logprob

        s, k = self.by_seed[params.seed]
        ids = [*self.tok.encode(SCRIPTS[s][k], add_special_tokens=False), IM_END][: params.max_tokens]
        return Completion(ids, [replay_logprob(i) for i in ids], "stop", "", stop_reason=IM_END)


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("reasoning_gym")
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except ModuleNotFoundError as exc:  # the model package is a set-up step (scripts/setup.sh)
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def trajs(tok):
    import asyncio

    from chatgym.trainer.rollout.collector import Collector, RolloutConfig

    collector = Collector(PerSampleEngine(tok), tok, RolloutConfig(max_tokens=64, episode_timeout_s=60.0))
    try:
        out = asyncio.run(
            collector.collect("MathCalculator-v0", [0], 3, env_kwargs={"split": "test"}, sampling_seed=SAMPLING_SEED)
        )
    finally:
        collector.close()
    assert [t.error for t in out] == [None] * 3
    assert [t.rewards for t in out] == [[0.0, 1.0], [0.0, 0.0], [1.0]]
    return out


def learner_for(tmp_path, advantage, kwargs):
    from train_helpers import TINY_LLAMA

    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.learner.learner import Learner

    cfg = load_config(
        None,
        [
            "model.random_init=true",
            "model.config_overrides=" + json.dumps(TINY_LLAMA),
            "engine.dtype=float32",
            "env.id=MathCalculator-v0",
            "train.group_size=3",
            "train.prompts_per_step=1",
            f"train.output_dir={tmp_path}",
            "optim.lr=1e-2",
            f"algo.advantage={advantage}",
            "algo.advantage_kwargs=" + json.dumps(kwargs),
        ],
    )
    return Learner(cfg, get_tokenizer("smollm2"))


@pytest.mark.parametrize("advantage", list(HAND))
def test_a_cpu_step_places_the_hand_computed_turn_advantages_on_tokens(tmp_path, trajs, advantage):
    kwargs, hand = HAND[advantage]
    learner = learner_for(tmp_path, advantage, kwargs)
    batch, prepared = learner.prepare(trajs)
    expected = torch.zeros_like(batch.advantages)
    for i, traj in enumerate(trajs):
        for k, record in enumerate(traj.info["turns"]):
            start = record["start"]
            expected[i, start : start + record["completion_tokens"]] = hand[i][k]
    assert not bool(((expected != 0) & ~batch.loss_mask.bool()).any())  # turns' tokens are generated ones
    torch.testing.assert_close(batch.advantages, expected, rtol=0, atol=2e-6)
    # GiGPO's step groups beyond turn 0: rows 0 and 1 both reach the same calculator result.
    anchors = {"batch/anchor/later_shared_frac": 1.0, "batch/anchor/later_group_size_mean": 2.0}
    assert {k: v for k, v in prepared.items() if k.startswith("batch/anchor/")} == (
        anchors if advantage == "gigpo" else {}
    )

    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}
    metrics = learner.train_on(trajs)
    assert learner.version == 1 and metrics["actor/optimizer_steps"] == 1
    assert torch.isfinite(torch.tensor([metrics["actor/pg_loss"], metrics["actor/grad_norm"]])).all()
    changed = sum(not torch.equal(before[n], p) for n, p in learner.policy.named_parameters())
    assert changed > 0


def test_the_anchor_states_of_the_batch(trajs):
    from chatgym.trainer.learner.turns import state_ids

    ids = state_ids(trajs, 2)
    # Turn 0: the shared prompt; turn 1 of samples 0 and 1: the same calculator result.
    assert ids[0, 0] == ids[1, 0] == ids[2, 0] and ids[0, 1] == ids[1, 1] != ids[0, 0]
    assert ids[2, 1] == -1
