"""The rollout source seam: a request's subset samples exactly as inside the full request, and every
generated token carries the weight version that sampled it."""

from __future__ import annotations

import pytest
from rollout_helpers import ASSISTANT_HEADER, AddEnv, tool_call_text

from chatgym.trainer.engines.replay import ReplayEngine, turn_script
from chatgym.trainer.rollout.collector import Collector, RolloutConfig, request_seed
from chatgym.trainer.rollout.source import LocalRollout, RolloutRequest


@pytest.fixture(scope="module")
def tok():
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))


IM_END = 2


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


class SeedRecorder(ReplayEngine):
    """Replays the script and records each call's sampling seed; bumps its weight version after each
    call when ``bump`` (a learner updating between turns)."""

    def __init__(self, *args, bump=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.seeds: list[int | None] = []
        self.bump = bump

    async def generate(self, prompt_ids, params):
        self.seeds.append(params.seed)
        out = await super().generate(prompt_ids, params)
        if self.bump:
            self.weight_version += 1
        return out

    def update_weights(self, weights):
        list(weights)  # a scripted policy: nothing to load


def rollout(tok, turns_text, **kw):
    turns = [[*enc(tok, t), IM_END] for t in turns_text]
    engine = SeedRecorder(turn_script(turns, enc(tok, ASSISTANT_HEADER)), tok, **kw)
    collector = Collector(engine, tok, RolloutConfig(episode_timeout_s=30.0))
    return LocalRollout(engine, collector), engine


async def test_turn_tokens_carry_the_version_that_sampled_them(tok):
    source, engine = rollout(
        tok, [tool_call_text("add", a=2, b=3), tool_call_text("add", a=5, b=4), "9"], bump=True
    )
    source.set_weights([], version=7)  # the engine starts this run at version 7
    assert engine.weight_version == 7 and source.weight_version == 7
    [traj] = await source.collect(RolloutRequest(AddEnv, (0,)))
    assert traj.error is None and traj.num_turns == 3
    # Turn k was sampled at version 7 + k (the engine bumps after each call); -1 off the loss mask.
    expected = [-1] * len(traj.token_ids)
    for k, turn in enumerate(traj.info["turns"]):
        expected[turn["start"] : turn["start"] + turn["completion_tokens"]] = [7 + k] * turn[
            "completion_tokens"
        ]
    assert traj.weight_versions == expected
    assert [v >= 0 for v in traj.weight_versions] == [m == 1 for m in traj.loss_mask]


async def test_a_subset_of_groups_samples_as_inside_the_full_request(tok):
    request = RolloutRequest(AddEnv, (0, 1, 2), group_size=2, reset_seed=5, sampling_seed=123)
    full_source, full_engine = rollout(tok, ["9"])
    full = await full_source.collect(request)
    part_source, part_engine = rollout(tok, ["9"])
    part = await part_source.collect(
        RolloutRequest(AddEnv, (0, 1, 2), 2, reset_seed=5, sampling_seed=123, groups=(2, 0))
    )
    assert [(t.group_id, t.sample_index) for t in part] == [(0, 0), (0, 1), (2, 0), (2, 1)]
    assert RolloutRequest(AddEnv, (0, 1, 2), 2, groups=(2, 0)).episodes() == [(2, 0), (2, 1), (0, 0), (0, 1)]
    by_key = {(t.group_id, t.sample_index): t for t in full}
    for t in part:
        assert t.token_ids == by_key[(t.group_id, t.sample_index)].token_ids
        assert t.task_id == by_key[(t.group_id, t.sample_index)].task_id
    # One turn each: the seed of (g, s) is request_seed(123, g, s, 0), whoever ran it.
    assert sorted(full_engine.seeds) == sorted(
        request_seed(123, g, s, 0) for g in range(3) for s in range(2)
    )
    assert sorted(part_engine.seeds) == sorted(request_seed(123, g, s, 0) for g in (0, 2) for s in range(2))
