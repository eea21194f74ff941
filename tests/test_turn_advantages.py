"""Per-turn advantage estimators (``turn_grpo``, ``gigpo``, ``turn_rloo``): hand-computed values on
small groups (unequal turn counts, zero-variance groups, repeated anchor states), their input checks
and config validation, and the batch's turn structure (``chatgym.trainer.learner.turns``)."""

from __future__ import annotations

import pytest
import torch

from chatgym.trainer.algos import get_advantage_estimator, grpo_advantages
from chatgym.trainer.config.loader import ConfigError
from chatgym.trainer.config.run import AlgoConfig, load_config


def layout(rows):
    """Token tensors for rows of per-turn rewards: a prompt token, then per turn two generated tokens
    (the turn's reward on the second) and one observation token (none after the last turn).

    Returns ``(token_rewards, mask, turn_ids, turn_counts, spans)``; ``spans[i][k]`` are the two
    generated positions of turn k of row i."""
    lengths = [1 + 3 * len(r) - (1 if r else 0) for r in rows]
    width = max(lengths)
    rewards = torch.zeros(len(rows), width, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    ids = torch.full((len(rows), width), -1, dtype=torch.long)
    spans = []
    for i, turns in enumerate(rows):
        ids[i, : lengths[i]] = 0
        row_spans = []
        for k, r in enumerate(turns):
            p = 1 + 3 * k
            mask[i, p : p + 2] = 1
            rewards[i, p + 1] = r
            ids[i, p : min(p + 3, lengths[i])] = k
            row_spans.append((p, p + 1))
        spans.append(row_spans)
    return rewards, mask, ids, torch.tensor([len(r) for r in rows]), spans


def per_turn(adv, spans):
    """The value on each turn's generated tokens (asserting both tokens of a turn carry the same one)."""
    out = []
    for i, row in enumerate(spans):
        values = []
        for a, b in row:
            assert float(adv[i, a]) == float(adv[i, b])
            values.append(float(adv[i, a]))
        out.append(values)
    return out


def approx(rows, rel=1e-6):
    return [pytest.approx(r, rel=rel, abs=1e-9) for r in rows]


def run(name, rows, group_ids, **kw):
    rewards, mask, ids, counts, spans = layout(rows)
    out = get_advantage_estimator(name)(
        rewards, mask, group_ids=torch.tensor(group_ids), turn_ids=ids, turn_counts=counts, **kw
    )
    # Nothing leaks onto prompt, observation or padding tokens.
    assert bool((out.advantages[mask == 0] == 0).all()) and bool((out.returns[mask == 0] == 0).all())
    return per_turn(out.advantages, spans), per_turn(out.returns, spans)


# ---- turn_grpo -----------------------------------------------------------------------------------


def test_turn_grpo_hand_values_unequal_turn_counts_and_a_zero_variance_group():
    # gamma 0.5: a [0, 1] -> G [0.5, 1]; b [1] -> G [1]; c [0, 0, 1] -> G [0.25, 0.5, 1].
    # Turn 0's set {0.5, 1, 0.25}: mean 7/12, std sqrt(7/48) = 0.381881 -> -0.218218, 1.091089, -0.872872.
    # Turn 1: a and c only (b ended): {1, 0.5}, mean 0.75, std 0.353553 -> +0.707107, -0.707107.
    # Turn 2: c alone -> 0. Group 2 (d [0, 1], e [1], gamma 0.5: G [0.5, 1] and [1]) is the docstring example.
    # Group 3: f and g both [1, 0]: every set constant -> exactly 0.
    rows = [[0, 1], [1], [0, 0, 1], [0, 1], [1], [1, 0], [1, 0]]
    adv, ret = run("turn_grpo", rows, [0, 0, 0, 1, 1, 2, 2], gamma=0.5, eps=0.0)
    assert adv[:5] == approx(
        [[-0.218218, 0.707107], [1.091089], [-0.872872, -0.707107, 0.0], [-0.707107, 0.0], [0.707107]]
    )
    assert adv[5:] == [[0.0, 0.0], [0.0, 0.0]]
    assert ret[:3] == [[0.5, 1.0], [1.0], [0.25, 0.5, 1.0]]


def test_turn_grpo_without_std_and_gamma_one_is_grpo_at_turn_zero():
    rows = [[0, 1], [0], [0, 0, 1]]  # outcome rewards 1, 0, 1
    adv, _ = run("turn_grpo", rows, [0, 0, 0], norm_by_std=False)
    # Turn 0: {1, 0, 1}, mean 2/3. Turn 1: {1, 1} constant -> 0. Turn 2: alone -> 0.
    assert adv == approx([[1 / 3, 0.0], [-2 / 3], [1 / 3, 0.0, 0.0]])
    rewards, mask, ids, counts, spans = layout(rows)
    grpo = grpo_advantages(rewards, mask, group_ids=torch.tensor([0, 0, 0]), eps=1e-6).advantages
    turn = get_advantage_estimator("turn_grpo")(
        rewards, mask, group_ids=torch.tensor([0, 0, 0]), turn_ids=ids, turn_counts=counts
    ).advantages
    assert [r[0] for r in per_turn(turn, spans)] == [r[0] for r in per_turn(grpo, spans)]


# ---- turn_rloo -----------------------------------------------------------------------------------


def test_turn_rloo_hand_values_pads_finished_samples_with_zero():
    # gamma 1: a [0, 1] -> G [1, 1]; b [0] -> G [0] (0 at turn 1); c [2, 0] -> G [2, 0].
    # Turn 0: a 1 - (0 + 2)/2 = 0, b 0 - (1 + 2)/2 = -1.5, c 2 - (1 + 0)/2 = 1.5.
    # Turn 1: a 1 - (0 + 0)/2 = 1, c 0 - (0 + 1)/2 = -0.5.
    # Group 2: d [1] -> [1], e [0, 1] -> [1, 1]: turn 0 {1, 1} constant -> 0; turn 1: e 1 - 0 = 1
    # (d ended: its return there is 0, it is not dropped as turn_grpo would).
    # Group 3: f and g both [1, 0]: constant at every index -> 0.
    rows = [[0, 1], [0], [2, 0], [1], [0, 1], [1, 0], [1, 0]]
    adv, ret = run("turn_rloo", rows, [0, 0, 0, 1, 1, 2, 2])
    assert adv == [[0.0, 1.0], [-1.5], [1.5, -0.5], [0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert ret[:3] == [[1.0, 1.0], [0.0], [2.0, 0.0]]


def test_turn_rloo_discounted_and_group_of_one():
    # gamma 0.5: a [0, 1] -> G [0.5, 1]; b [1, 1] -> G [1.5, 1]. Turn 0: a 0.5 - 1.5 = -1, b +1;
    # turn 1: a 1 - 1 = 0 (constant), b 0. A group of one (c) has no baseline: 0.
    adv, _ = run("turn_rloo", [[0, 1], [1, 1], [3, 4]], [0, 0, 1], gamma=0.5)
    assert adv == [[-1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]


# ---- gigpo ---------------------------------------------------------------------------------------


def test_gigpo_hand_values_with_anchor_states_revisits_and_a_zero_variance_group():
    # Group 0 (gamma 0.5, omega 1): a [0, 1] states [S, X]; b [0, 0] states [S, X]; c [1] state [S].
    #   Episode R = 1, 0, 1: mean 2/3, std sqrt(1/3) -> A^E 0.577350, -1.154701, 0.577350.
    #   Step returns a [0.5, 1], b [0, 0], c [1]. Group S {0.5, 0, 1}: mean 0.5, std 0.5 -> 0, -1, 1.
    #   Group X {1, 0}: mean 0.5, std 0.707107 -> 0.707107, -0.707107.
    #   A = A^E + A^S: a [0.577350, 1.284457], b [-2.154701, -1.861807], c [1.577350].
    # Group 1: d [0, 0, 1] states [P, Q, P] (P revisited at turn 2), e [0, 0] states [P, Q].
    #   Episode R = 1, 0 -> A^E 0.707107, -0.707107. Step returns d [0.25, 0.5, 1], e [0, 0].
    #   Group P {0.25 (d0), 1 (d2), 0 (e0)}: mean 5/12, std sqrt(39)/12 -> -2/sqrt(39) = -0.320256,
    #   7/sqrt(39) = 1.120897, -5/sqrt(39) = -0.800641. Group Q {0.5, 0} -> 0.707107, -0.707107.
    # Group 2: f, g [1] in the same state: everything constant -> 0.
    S, X, P, Q, F = 10, 11, 20, 21, 30
    rows = [[0, 1], [0, 0], [1], [0, 0, 1], [0, 0], [1], [1]]
    states = torch.tensor(
        [[S, X, -1], [S, X, -1], [S, -1, -1], [P, Q, P], [P, Q, -1], [F, -1, -1], [F, -1, -1]]
    )
    adv, ret = run("gigpo", rows, [0, 0, 0, 1, 1, 2, 2], state_ids=states, gamma=0.5, omega=1.0, eps=0.0)
    assert adv == approx(
        [
            [0.577350, 1.284457],
            [-2.154701, -1.861807],
            [1.577350],
            [0.707107 - 0.320256, 0.707107 + 0.707107, 0.707107 + 1.120897],
            [-0.707107 - 0.800641, -0.707107 - 0.707107],
            [0.0],
            [0.0],
        ],
        rel=2e-6,
    )
    assert ret[3] == [0.25, 0.5, 1.0]


def test_gigpo_mean_norm_and_omega():
    S, X = 1, 2
    rows = [[0, 1], [0, 0], [1]]
    states = torch.tensor([[S, X], [S, X], [S, -1]])
    # F_norm = 1: A^E = R - 2/3 = [1/3, -2/3, 1/3]; S group {0.5, 0, 1} - 0.5; X group {1, 0} - 0.5.
    adv, _ = run("gigpo", rows, [0, 0, 0], state_ids=states, gamma=0.5, norm_by_std=False)
    assert adv == approx([[1 / 3, 1 / 3 + 0.5], [-2 / 3 - 0.5, -2 / 3 - 0.5], [1 / 3 + 0.5]])
    # omega 0: the episode advantage alone, on every turn (GRPO's value).
    adv, _ = run("gigpo", rows, [0, 0, 0], state_ids=states, omega=0.0)
    rewards, mask, *_ = layout(rows)
    grpo = grpo_advantages(rewards, mask, group_ids=torch.tensor([0, 0, 0]))
    g = [float(grpo.advantages[i, 2]) for i in range(3)]
    assert adv == approx([[g[0], g[0]], [g[1], g[1]], [g[2]]])


def test_gigpo_states_are_compared_within_a_group_only():
    # Both groups use state id 5 at turn 0, but they are different tasks: two separate step groups.
    rows = [[1], [0], [1], [1]]
    states = torch.tensor([[5], [5], [5], [5]])
    adv, _ = run("gigpo", rows, [0, 0, 1, 1], state_ids=states, gamma=1.0, eps=0.0)
    # Group 0: A^E +-0.707107 and A^S +-0.707107; group 1 constant: 0.
    assert adv == approx([[1.414214], [-1.414214], [0.0], [0.0]])


# ---- input checks and config ---------------------------------------------------------------------


def test_turn_inputs_are_checked_with_clear_errors():
    rewards, mask, ids, counts, _ = layout([[0, 1], [1]])
    est = get_advantage_estimator("turn_grpo")
    groups = torch.tensor([0, 0])
    with pytest.raises(ValueError, match="turn_ids is required"):
        est(rewards, mask, group_ids=groups, turn_ids=None, turn_counts=counts)
    bad = ids.clone()
    bad[1, 1] = 1  # row 1 has one turn
    with pytest.raises(ValueError, match="below the row's turn_counts"):
        est(rewards, mask, group_ids=groups, turn_ids=bad, turn_counts=counts)
    padded = rewards.clone()
    padded[1, -1] = 1.0  # row 1's padding
    with pytest.raises(ValueError, match="must be 0 where turn_ids is -1"):
        est(padded, mask, group_ids=groups, turn_ids=ids, turn_counts=counts)
    with pytest.raises(TypeError, match="turn_counts must be an integer"):
        est(rewards, mask, group_ids=groups, turn_ids=ids, turn_counts=counts.float())
    with pytest.raises(ValueError, match="gamma must be in"):
        est(rewards, mask, group_ids=groups, turn_ids=ids, turn_counts=counts, gamma=1.5)
    gigpo = get_advantage_estimator("gigpo")
    with pytest.raises(ValueError, match=r"state_ids must be >= 0"):
        gigpo(
            rewards,
            mask,
            group_ids=groups,
            turn_ids=ids,
            turn_counts=counts,
            state_ids=torch.tensor([[0, -1], [0, -1]]),
        )
    with pytest.raises(ValueError, match=r"state_ids must have shape \(B, >= 2\)"):
        gigpo(
            rewards,
            mask,
            group_ids=groups,
            turn_ids=ids,
            turn_counts=counts,
            state_ids=torch.tensor([[0], [0]]),
        )


def test_config_selects_and_validates_turn_estimators_by_field_name():
    cfg = load_config(None, ["algo.advantage=gigpo", "algo.advantage_kwargs={gamma: 0.9, omega: 0.5}"])
    assert cfg.algo.advantage == "gigpo" and cfg.algo.advantage_kwargs == {"gamma": 0.9, "omega": 0.5}
    with pytest.raises(
        ConfigError, match=r"algo.advantage_kwargs.gamma must be a number in \[0, 1\], got 1.5"
    ):
        load_config(None, ["algo.advantage=turn_grpo", "algo.advantage_kwargs={gamma: 1.5}"])
    with pytest.raises(ConfigError, match=r"algo.advantage_kwargs.omega must be a finite number >= 0"):
        load_config(None, ["algo.advantage=gigpo", "algo.advantage_kwargs={omega: -1}"])
    # An infinite weight gave +-inf advantages (fresh-user check); norm_by_std: 3 was taken as true.
    with pytest.raises(ConfigError, match=r"algo.advantage_kwargs.omega must be a finite number >= 0, got inf"):
        load_config(None, ["algo.advantage=gigpo", "algo.advantage_kwargs={omega: .inf}"])
    with pytest.raises(ConfigError, match=r"algo.advantage_kwargs.norm_by_std must be true or false, got 3"):
        load_config(None, ["algo.advantage=gigpo", "algo.advantage_kwargs={norm_by_std: 3}"])
    with pytest.raises(
        ConfigError, match="unknown key 'omega' for turn_rloo_advantages; allowed: \\['gamma'\\]"
    ):
        load_config(None, ["algo.advantage=turn_rloo", "algo.advantage_kwargs={omega: 1}"])
    with pytest.raises(ConfigError, match="unknown key 'state_ids'"):  # the trainer's input, not a parameter
        load_config(None, ["algo.advantage=gigpo", "algo.advantage_kwargs={state_ids: 1}"])
    with pytest.raises(ConfigError, match=r"train\.group_size must be >= 2 with algo\.advantage 'turn_rloo'"):
        load_config(None, ["algo.advantage=turn_rloo", "train.group_size=1"])
    AlgoConfig(advantage="turn_rloo", advantage_kwargs={"gamma": 1})


# ---- the batch's turn structure (learner.turns) ---------------------------------------------------


def _traj(ids, mask, rewards, **kw):
    from chatgym.trainer.rollout.types import Trajectory

    return Trajectory("X", "t", 0, 0, list(ids), list(mask), [0.0] * len(ids), [0] * len(ids), rewards=rewards, **kw)


def test_turn_ids_from_turn_records_and_the_loss_mask_fallback():
    from chatgym.trainer.learner.batch import collate
    from chatgym.trainer.learner.turns import turn_ids, turn_starts

    # Prompt [0, 2), turn 0 sampled [2, 4) + observation [4, 6), turn 1 sampled [6, 8).
    mask = [0, 0, 1, 1, 0, 0, 1, 1]
    recorded = _traj(range(8), mask, [0.0, 1.0], info={"turns": [{"start": 2}, {"start": 6}]})
    bare = _traj(range(5), [0, 1, 0, 1, 1], [0.0, 1.0])  # no records: the mask's runs start at 1 and 3
    assert turn_starts(recorded) == [2, 6] and turn_starts(bare) == [1, 3]
    # A turn that sampled nothing leaves no run: the records are the only source of its start.
    empty = _traj(range(4), [0, 0, 1, 1], [0.0, 1.0], info={"turns": [{"start": 2}, {"start": 4}]})
    assert turn_starts(empty) == [2, 4]
    with pytest.raises(ValueError, match=r"task 't', group 0, sample 0.*2 turn rewards, no turn records, 1 generated runs"):
        turn_starts(_traj(range(4), [0, 0, 1, 1], [0.0, 1.0]))
    batch = collate([recorded, bare, empty], 0)
    ids, counts = turn_ids([recorded, bare, empty], batch)
    assert ids.tolist() == [
        [0, 0, 0, 0, 0, 0, 1, 1],
        [0, 0, 0, 1, 1, -1, -1, -1],
        [0, 0, 0, 0, -1, -1, -1, -1],  # turn 1 owns no position; its reward would sit on turn 0's
    ]
    assert counts.tolist() == [2, 2, 2]


def test_state_keys_env_key_else_the_observation_before_the_turn():
    from chatgym.trainer.learner.turns import state_ids, state_keys

    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "6"},
        {"role": "assistant", "content": "call 2"},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "answer"},
    ]
    plain = _traj([], [], [0.0, 0.0, 1.0], messages=messages)
    assert state_keys(plain) == [
        'obs:[{"content": "Q", "role": "user"}]',
        'obs:[{"content": "6", "role": "tool"}]',
        'obs:[{"content": "7", "role": "tool"}]',
    ]
    # The env named its state after step 1 only (step 0 named none): turn 2 takes it, turn 1 keeps its observation.
    named = _traj([], [], [0.0, 0.0, 1.0], messages=messages, info={"state_keys": [None, "db=v2"]})
    assert state_keys(named)[1:] == ['obs:[{"content": "6", "role": "tool"}]', "env:db=v2"]
    # Keys given for every step need no messages; turn 0 is the group's common start.
    assert state_keys(_traj([], [], [0.0, 1.0], info={"state_keys": ["a", "b"]})) == ["start", "env:a"]
    with pytest.raises(ValueError, match="GiGPO needs the observation before each turn: 2 turns but 0"):
        state_keys(_traj([], [], [0.0, 1.0]))
    assert state_ids([plain, named], 3).tolist() == [[0, 1, 2], [0, 1, 3]]


def test_record_step_keeps_the_envs_state_key_per_step():
    from chatgym.trainer.rollout.episode import EpisodeFailure, record_step

    traj = _traj([], [], [])
    record_step(traj, [], 0.0, {})
    assert "state_keys" not in traj.info  # an env that names no state leaves nothing behind
    record_step(traj, [], 0.0, {"state_key": "s1"})
    record_step(traj, [], 0.0, {})
    record_step(traj, [], 1.0, {"state_key": "s3"})
    assert traj.info["state_keys"] == [None, "s1", None, "s3"] and "state_key" not in traj.info
    with pytest.raises(EpisodeFailure, match="info\\['state_key'\\] must be a string, got dict") as err:
        record_step(traj, [], 0.0, {"state_key": {"a": 1}})
    assert err.value.kind == "env_error" and traj.rewards == [0.0, 0.0, 0.0, 1.0]


def test_anchor_stats_count_the_later_turns_step_groups_by_hand():
    from chatgym.trainer.learner.turns import anchor_stats

    # Group 0: three samples share turn 0's state; turns 1 of rows 0 and 1 share state 1, row 0's
    # turn 2 (state 2) and row 2's turn 1 (state 3) are alone. Group 1 (row 3): state 1 again, but in
    # another group (alone), and state 4 revisited at turns 0 and 2 (a step group of two visits).
    states = torch.tensor([[0, 1, 2], [0, 1, -1], [0, 3, -1], [4, 1, 4]])
    counts = torch.tensor([3, 2, 2, 3])
    groups = torch.tensor([0, 0, 0, 1])
    # Later turns' step-group sizes: row 0 -> 2, 1; row 1 -> 2; row 2 -> 1; row 3 -> 1, 2.
    assert anchor_stats(states, counts, groups) == {
        "batch/anchor/later_shared_frac": 3 / 6,
        "batch/anchor/later_group_size_mean": 9 / 6,
    }
    assert anchor_stats(states[:, :1], torch.ones(4, dtype=torch.long), groups) == {}


def test_gigpo_on_one_turn_episodes_is_grpo_times_one_plus_omega():
    # Turn 0's step group is the episode group (the shared opening): A^S = A^E. Rewards [1, 0, 1, 0]:
    # mean 0.5, unbiased std sqrt(1/3), so GRPO gives +-0.5 / sqrt(1/3) = +-sqrt(3) / 2 (eps 1e-6 aside).
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(4, 2)
    inputs = dict(
        group_ids=torch.zeros(4, dtype=torch.long),
        turn_ids=torch.zeros(4, 2, dtype=torch.long),
        turn_counts=torch.ones(4, dtype=torch.long),
        state_ids=torch.zeros(4, 1, dtype=torch.long),
    )
    grpo = (3**0.5 / 2 * torch.tensor([1.0, -1.0, 1.0, -1.0])).unsqueeze(1).expand(4, 2)
    torch.testing.assert_close(grpo_advantages(rewards, mask, group_ids=inputs["group_ids"]).advantages, grpo, atol=1e-5, rtol=0)
    for omega in (1.0, 0.5):
        out = get_advantage_estimator("gigpo")(rewards, mask, omega=omega, **inputs)
        torch.testing.assert_close(out.advantages, (1 + omega) * grpo, atol=1e-5, rtol=0)
