"""Hand-computed checks of chatgym.trainer.algos (derivations in the comments)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from chatgym.trainer.algos import (
    ADVANTAGE_ESTIMATORS,
    aggregate_loss,
    apply_kl_penalty,
    clipped_surrogate,
    clipped_value_loss,
    entropy_from_logits,
    get_advantage_estimator,
    get_kl_estimator,
    get_policy_loss,
    mask_truncated,
    missing_eos_penalty,
    overlong_reward_penalty,
    place_rewards,
    register_advantage_estimator,
    truncated_is_weights,
)

D = torch.float64
SQRT3_2 = math.sqrt(3) / 2


def t(x, dtype=D):
    return torch.tensor(x, dtype=dtype)


def outcome(scores, length=1):
    """(B, T) token rewards with each score on the last position, and an all-ones mask."""
    mask = torch.ones(len(scores), length, dtype=torch.bool)
    return place_rewards(t(scores), mask), mask


# ---------------------------------------------------------------------------------------- advantages


def test_place_rewards_last_generated_token_or_last_position():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 1, 0]])
    out = place_rewards(t([1.0, 2.0, 3.0]), mask)
    assert torch.equal(out, t([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 3.0, 0.0]]))


def test_grpo_two_correct_two_wrong():
    # mean 0.5; unbiased std = sqrt((4 * 0.25) / 3) = sqrt(1/3); A = ±0.5 / sqrt(1/3) = ±sqrt(3)/2.
    rewards, mask = outcome([1.0, 0.0, 0.0, 1.0], length=2)
    adv, ret = get_advantage_estimator("grpo")(
        rewards, mask, group_ids=torch.zeros(4, dtype=torch.long), eps=0.0
    )
    expected = t([SQRT3_2, -SQRT3_2, -SQRT3_2, SQRT3_2])
    torch.testing.assert_close(adv, expected[:, None].expand(4, 2), rtol=0, atol=1e-15)
    assert torch.equal(ret, t([1.0, 0.0, 0.0, 1.0])[:, None].expand(4, 2))
    # With the default eps = 1e-6: 0.5 / (sqrt(1/3) + 1e-6).
    adv, _ = get_advantage_estimator("grpo")(rewards, mask, group_ids=torch.zeros(4, dtype=torch.long))
    assert adv[0, 0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-6), abs=1e-15)


def test_grpo_interleaved_groups_constant_group_and_group_of_one():
    # group 7: [1, 0] -> mean 0.5, std sqrt(0.5) -> ±0.5/sqrt(0.5) = ±sqrt(0.5)
    # group 3: [0.1, 0.1, 0.1] -> all equal -> exactly 0 (0.1*3/3 != 0.1 in floats, so this needs the guard)
    # group 9: one sample -> 0 (documented: no baseline)
    rewards, mask = outcome([1.0, 0.1, 0.0, 0.1, 0.1, 5.0])
    groups = torch.tensor([7, 3, 7, 3, 3, 9])
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"):
        adv, _ = get_advantage_estimator(name)(rewards, mask, group_ids=groups)
        assert torch.isfinite(adv).all()
        assert torch.equal(adv[[1, 3, 4, 5], 0], torch.zeros(4, dtype=D)), name
    adv, _ = get_advantage_estimator("grpo")(rewards, mask, group_ids=groups, eps=0.0)
    torch.testing.assert_close(adv[[0, 2], 0], t([math.sqrt(0.5), -math.sqrt(0.5)]), rtol=0, atol=1e-15)


def test_grpo_masked_row_counts_in_baseline_but_gets_no_advantage():
    # Row 0 was filtered (mask all 0) but its reward 1 still enters the group: mean 0.5, std sqrt(0.5),
    # so row 1 (reward 0) gets -0.5/sqrt(0.5) = -sqrt(0.5) on its two generated tokens.
    mask = torch.tensor([[0, 0, 0], [1, 1, 0]])
    rewards = place_rewards(t([1.0, 0.0]), mask)
    adv, _ = get_advantage_estimator("grpo")(rewards, mask, group_ids=torch.tensor([0, 0]), eps=0.0)
    expected = t([[0.0, 0.0, 0.0], [-math.sqrt(0.5), -math.sqrt(0.5), 0.0]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-15)


def test_dr_grpo_no_std():
    # mean 0.5 -> A = r - 0.5
    rewards, mask = outcome([1.0, 0.0, 0.0, 1.0])
    adv, _ = get_advantage_estimator("dr_grpo")(rewards, mask, group_ids=torch.zeros(4, dtype=torch.long))
    assert torch.equal(adv[:, 0], t([0.5, -0.5, -0.5, 0.5]))


def test_rloo_leave_one_out():
    # [1, 0, 0, 1]: baseline of sample 0 = (0 + 0 + 1)/3 -> 1 - 1/3 = 2/3; of sample 1 = 2/3 -> -2/3.
    rewards, mask = outcome([1.0, 0.0, 0.0, 1.0])
    adv, _ = get_advantage_estimator("rloo")(rewards, mask, group_ids=torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(adv[:, 0], t([2 / 3, -2 / 3, -2 / 3, 2 / 3]), rtol=0, atol=1e-15)
    # [1, 0, 0]: sample 0's remainder [0, 0] has zero variance -> baseline 0 -> 1;
    # samples 1, 2: baseline (1 + 0)/2 = 0.5 -> -0.5.
    rewards, mask = outcome([1.0, 0.0, 0.0])
    adv, _ = get_advantage_estimator("rloo")(rewards, mask, group_ids=torch.zeros(3, dtype=torch.long))
    assert torch.equal(adv[:, 0], t([1.0, -0.5, -0.5]))


def test_reinforce_plus_plus_batch_whitening():
    # Row 0: 2 tokens, reward 1 on the last -> returns (gamma 1) [1, 1]; row 1: 1 token, reward 0 -> [0].
    # Tokens [1, 1, 0]: mean 2/3, unbiased var ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3.
    # A = (1 - 2/3)/sqrt(1/3) = sqrt(1/3); (0 - 2/3)/sqrt(1/3) = -2 sqrt(1/3).
    mask = torch.tensor([[1, 1], [1, 0]])
    rewards = place_rewards(t([1.0, 0.0]), mask)
    adv, ret = get_advantage_estimator("reinforce_plus_plus")(rewards, mask, eps=0.0)
    s = math.sqrt(1 / 3)
    torch.testing.assert_close(adv, t([[s, s], [-2 * s, 0.0]]), rtol=0, atol=1e-15)
    assert torch.equal(ret, t([[1.0, 1.0], [0.0, 0.0]]))
    # gamma 0.5: row 0's first token sees 0 + 0.5 * 1 = 0.5.
    _, ret = get_advantage_estimator("reinforce_plus_plus")(rewards, mask, gamma=0.5)
    assert torch.equal(ret, t([[0.5, 1.0], [0.0, 0.0]]))


def test_reinforce_plus_plus_reward_on_observation_token_credits_earlier_action():
    # Tokens: gen, obs (reward 2 arrives here), gen (reward 1). gamma 0.5:
    # G_2 = 1; G_0 = (0 + 2) + 0.5 * G_2 = 2.5 (observation token skipped as a time step).
    mask = torch.tensor([[1, 0, 1]])
    _, ret = get_advantage_estimator("reinforce_plus_plus")(t([[0.0, 2.0, 1.0]]), mask, gamma=0.5)
    assert torch.equal(ret, t([[2.5, 0.0, 1.0]]))


def test_reinforce_plus_plus_baseline():
    # group 0 [1, 0] -> centred [0.5, -0.5]; group 1 [1, 1] -> constant -> [0, 0].
    # Tokens [0.5, -0.5, 0, 0]: mean 0, unbiased var 0.5/3 = 1/6 -> ±0.5*sqrt(6).
    rewards, mask = outcome([1.0, 0.0, 1.0, 1.0])
    adv, _ = get_advantage_estimator("reinforce_plus_plus_baseline")(
        rewards, mask, group_ids=torch.tensor([0, 0, 1, 1]), eps=0.0
    )
    h = 0.5 * math.sqrt(6)
    torch.testing.assert_close(adv[:, 0], t([h, -h, 0.0, 0.0]), rtol=0, atol=1e-15)


def test_gae_by_hand():
    # gamma 0.9, lam 0.8 (gamma*lam = 0.72), rewards [0, 0, 1], V [0.5, 0.6, 0.7], V after the end = 0:
    # t=2: delta = 1 - 0.7 = 0.3;               A2 = 0.3
    # t=1: delta = 0.9*0.7 - 0.6 = 0.03;        A1 = 0.03 + 0.72*0.3   = 0.246
    # t=0: delta = 0.9*0.6 - 0.5 = 0.04;        A0 = 0.04 + 0.72*0.246 = 0.21712
    # returns = A + V = [0.71712, 0.846, 1.0]
    rewards, values, mask = t([[0.0, 0.0, 1.0]]), t([[0.5, 0.6, 0.7]]), torch.ones(1, 3)
    adv, ret = get_advantage_estimator("gae")(rewards, mask, values=values, gamma=0.9, lam=0.8, whiten=False)
    torch.testing.assert_close(adv, t([[0.21712, 0.246, 0.3]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(ret, t([[0.71712, 0.846, 1.0]]), rtol=0, atol=1e-15)
    # whiten: independent computation with torch.std (unbiased).
    white, ret2 = get_advantage_estimator("gae")(rewards, mask, values=values, gamma=0.9, lam=0.8, eps=0.0)
    raw = t([0.21712, 0.246, 0.3])
    torch.testing.assert_close(white[0], (raw - raw.mean()) / raw.std(), rtol=0, atol=1e-12)
    assert torch.equal(ret2, ret)  # returns are not whitened


def test_gae_skips_observation_tokens():
    # mask [1, 0, 1]: the middle token is a tool result (its value is garbage, even inf, and unread).
    # t=2: A2 = 1 - 0.7 = 0.3; t=0 bootstraps from V_2: delta = 0.9*0.7 - 0.5 = 0.13; A0 = 0.13 + 0.72*0.3 = 0.346.
    mask = torch.tensor([[1, 0, 1]])
    values = t([[0.5, float("inf"), 0.7]])
    adv, ret = get_advantage_estimator("gae")(
        t([[0.0, 0.0, 1.0]]), mask, values=values, gamma=0.9, lam=0.8, whiten=False
    )
    torch.testing.assert_close(adv, t([[0.346, 0.0, 0.3]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(ret, t([[0.846, 0.0, 1.0]]), rtol=0, atol=1e-15)
    # A reward of 0.5 on the observation token is credited to token 0: delta0 = 0.5 + 0.63 - 0.5 = 0.63 -> A0 = 0.846.
    adv, _ = get_advantage_estimator("gae")(
        t([[0.0, 0.5, 1.0]]), mask, values=values, gamma=0.9, lam=0.8, whiten=False
    )
    torch.testing.assert_close(adv, t([[0.846, 0.0, 0.3]]), rtol=0, atol=1e-15)


def test_gae_lambda_one_gamma_one_is_monte_carlo_minus_value():
    # lam = gamma = 1: A_t = (sum of future rewards) - V_t, an independent closed form.
    rewards, values = t([[0.2, -0.1, 0.7, 0.4]]), t([[0.3, 0.1, -0.2, 0.9]])
    adv, _ = get_advantage_estimator("gae")(
        rewards, torch.ones(1, 4), values=values, gamma=1.0, lam=1.0, whiten=False
    )
    mc = rewards.flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(adv, mc - values, rtol=0, atol=1e-15)


# ------------------------------------------------------------------------------------- policy losses


def _ratio_case(ratio: float, advantages: list[float]):
    old = torch.full((1, len(advantages)), math.log(0.1), dtype=D)
    logp = (old + math.log(ratio)).requires_grad_(True)
    return logp, old, t([advantages]), torch.ones(1, len(advantages))


def test_dual_clip_exact_values():
    # ratio 5, eps 0.2, c 3: A=+2 -> min(10, 1.2*2) = 2.4 (no lower bound for A >= 0);
    # A=-2 -> min(-10, -2.4) = -10, then max(-10, 3*(-2)) = -6.0. Loss = -objective.
    logp, old, adv, mask = _ratio_case(5.0, [2.0, -2.0])
    out = get_policy_loss("dual_clip")(logp, old, adv, mask, eps=0.2, c=3.0)
    assert out.objective.tolist() == [[2.4, -6.0]]
    assert out.loss.tolist() == [[-2.4, 6.0]]
    assert out.clipped.tolist() == [[True, False]]
    assert out.dual_clipped.tolist() == [[False, True]]
    out.objective.sum().backward()
    assert logp.grad.tolist() == [[0.0, 0.0]]  # both bounds cut the gradient


def test_ppo_clip_values_and_gradient():
    # ratio 0.5: A=+2 -> min(1.0, 0.8*2=1.6) = 1.0 (unclipped, d/dlogp = r*A = 1.0);
    #            A=-2 -> min(-1.0, -1.6) = -1.6 (clipped, no gradient).
    logp, old, adv, mask = _ratio_case(0.5, [2.0, -2.0])
    out = get_policy_loss("ppo_clip")(logp, old, adv, mask, eps=0.2)
    torch.testing.assert_close(out.objective, t([[1.0, -1.6]]), rtol=0, atol=1e-15)
    assert out.clipped.tolist() == [[False, True]]
    out.objective.sum().backward()
    torch.testing.assert_close(logp.grad, t([[1.0, 0.0]]), rtol=0, atol=1e-15)
    # Without dual clip, A=-2 at ratio 5 is unbounded: min(-10, -2.4) = -10.
    logp, old, adv, mask = _ratio_case(5.0, [-2.0])
    out = get_policy_loss("ppo_clip")(logp, old, adv, mask)
    torch.testing.assert_close(out.objective, t([[-10.0]]), rtol=1e-14, atol=0)


def test_clip_higher_separate_bounds():
    # ratio 1.25, A = 1: PPO (eps 0.2) gives min(1.25, 1.2) = 1.2 (clipped);
    # clip-higher (eps_high 0.28) gives min(1.25, 1.25) = 1.25 (not clipped).
    # ratio 0.7, A = -1: both use eps_low 0.2 -> min(-0.7, -0.8) = -0.8.
    logp = torch.log(t([[1.25, 0.7]]))
    old = torch.zeros(1, 2, dtype=D)
    adv, mask = t([[1.0, -1.0]]), torch.ones(1, 2)
    ppo = get_policy_loss("ppo_clip")(logp, old, adv, mask)
    hi = get_policy_loss("clip_higher")(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(ppo.objective, t([[1.2, -0.8]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(hi.objective, t([[1.25, -0.8]]), rtol=0, atol=1e-15)
    assert ppo.clipped.tolist() == [[True, True]] and hi.clipped.tolist() == [[False, True]]


def test_policy_loss_masked_positions_and_is_weights():
    # Masked position holds -inf logprobs: objective 0, gradient 0, nothing NaN.
    # Unmasked: ratio 1, A = 3, IS weight 0.5 -> objective 1.5, gradient r*A*w = 1.5.
    logp = t([[0.0, float("-inf")]]).requires_grad_(True)
    old = t([[0.0, float("-inf")]])
    out = clipped_surrogate(logp, old, t([[3.0, 3.0]]), torch.tensor([[1, 0]]), is_weights=t([[0.5, 7.0]]))
    assert out.objective.tolist() == [[1.5, 0.0]]
    out.objective.sum().backward()
    assert logp.grad.tolist() == [[1.5, 0.0]]


def test_truncated_is_weights():
    # exp(log .5 - log .25) = 2 -> min(2, 1.5) = 1.5; exp(log .25 - log .5) = 0.5; masked -> 0.
    old = torch.log(t([[0.5, 0.25, 0.5]])).requires_grad_(True)
    engine = torch.log(t([[0.25, 0.5, 0.1]]))
    w = truncated_is_weights(old, engine, torch.tensor([[1, 1, 0]]), cap=1.5)
    torch.testing.assert_close(w, t([[1.5, 0.5, 0.0]]), rtol=0, atol=1e-15)
    assert not w.requires_grad


# ------------------------------------------------------------------------------------ KL and entropy


def test_kl_estimators_by_hand():
    # p = 0.5, p_ref = 0.25 -> log_r = log(p_ref/p) = -ln 2.
    # k1 = ln 2; k2 = (ln 2)^2 / 2; k3 = (0.5 - 1) + ln 2.
    logp, ref = torch.log(t([0.5])), torch.log(t([0.25]))
    ln2 = math.log(2)
    assert get_kl_estimator("k1")(logp, ref).item() == pytest.approx(ln2, abs=1e-15)
    assert get_kl_estimator("k2")(logp, ref).item() == pytest.approx(ln2**2 / 2, abs=1e-15)
    assert get_kl_estimator("k3")(logp, ref).item() == pytest.approx(ln2 - 0.5, abs=1e-15)


def test_k1_k3_unbiased_monte_carlo():
    # Independent check: E_{x~p}[k1] = E[k3] = KL(p || q) exactly; 200k samples -> error ~ 3e-3.
    p, q = t([0.6, 0.3, 0.1]), t([0.2, 0.5, 0.3])
    kl = (p * (p / q).log()).sum().item()
    x = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    logp, logq = p.log()[x], q.log()[x]
    assert get_kl_estimator("k1")(logp, logq).mean().item() == pytest.approx(kl, abs=0.01)
    assert get_kl_estimator("k3")(logp, logq).mean().item() == pytest.approx(kl, abs=0.01)
    assert (get_kl_estimator("k3")(logp, logq) >= 0).all()


def test_apply_kl_penalty_in_reward():
    # k1 = ln 2 on both generated tokens, coef 0.1: rewards [0, 1] -> [-0.1 ln 2, 1 - 0.1 ln 2];
    # the masked third token keeps its reward.
    logp, ref = torch.log(t([[0.5, 0.5, 0.5]])), torch.log(t([[0.25, 0.25, 0.25]]))
    rewards, kl = apply_kl_penalty(t([[0.0, 1.0, 2.0]]), logp, ref, torch.tensor([[1, 1, 0]]), coef=0.1)
    ln2 = math.log(2)
    torch.testing.assert_close(rewards, t([[-0.1 * ln2, 1 - 0.1 * ln2, 2.0]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(kl, t([[ln2, ln2, 0.0]]), rtol=0, atol=1e-15)


def test_entropy_with_neg_inf_logits():
    inf = float("inf")
    logits = t(
        [
            [0.0, -inf, -inf],
            [0.0, 0.0, -inf],
            [0.0, 0.0, 0.0],
            [-inf, -inf, -inf],
            [inf, 0.0, 1.0],
            [inf, inf, 0.0],
        ]
    )
    logits.requires_grad_(True)
    h = entropy_from_logits(logits)
    # [0, -inf] -> one live token -> 0; [0, 0, -inf] -> ln 2; uniform over 3 -> ln 3;
    # all -inf -> 0 (documented); one +inf -> 0; two +inf -> ln 2.
    torch.testing.assert_close(
        h, t([0.0, math.log(2), math.log(3), 0.0, 0.0, math.log(2)]), rtol=0, atol=1e-15
    )
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_matches_categorical():
    logits = torch.randn(4, 5, 50, generator=torch.Generator().manual_seed(0), dtype=D) * 3
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), expected, rtol=0, atol=1e-12)
    # bf16 is upcast: finite and close to the float32 value of the same (rounded) logits.
    bf = logits.to(torch.bfloat16)
    h = entropy_from_logits(bf)
    assert h.dtype == torch.float32
    torch.testing.assert_close(
        h, torch.distributions.Categorical(logits=bf.float()).entropy(), rtol=0, atol=1e-5
    )


# ------------------------------------------------------------------------------- aggregation / value


LOSS = t([[1.0, 2.0, 3.0], [4.0, float("nan"), float("inf")], [9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, (1 + 2 + 3 + 4) / 4),  # 2.5
        ("seq-mean-token-sum", {}, (6 + 4) / 2),  # 5.0 (row 2 has no tokens: not a sequence)
        ("seq-mean-token-mean", {}, (6 / 3 + 4 / 1) / 2),  # 3.0
        ("seq-mean-token-sum-norm", {"norm_constant": 4}, (6 / 4 + 4 / 4) / 2),  # 1.25
    ],
)
def test_aggregate_loss_modes(mode, kwargs, expected):
    assert aggregate_loss(LOSS, MASK, mode, **kwargs).item() == expected


def test_aggregate_loss_global_counts_make_micro_batches_add_up():
    # Whole batch token-mean = 2.5; split by rows with num_tokens=4 each micro-batch gives 6/4 and 4/4.
    parts = [aggregate_loss(LOSS[i : i + 1], MASK[i : i + 1], "token-mean", num_tokens=4) for i in range(3)]
    assert sum(p.item() for p in parts) == 2.5
    parts = [
        aggregate_loss(LOSS[i : i + 1], MASK[i : i + 1], "seq-mean-token-mean", num_sequences=2)
        for i in range(3)
    ]
    assert sum(p.item() for p in parts) == 3.0


def test_aggregate_loss_empty_mask_is_zero_and_errors_name_fields():
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        assert aggregate_loss(LOSS, torch.zeros(3, 3), mode).item() == 0.0
    with pytest.raises(ValueError, match=r"unknown loss aggregation mode 'mean'.*token-mean"):
        aggregate_loss(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match="norm_constant"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match=r"mask must have shape \(3, 3\)"):
        aggregate_loss(LOSS, MASK[:2], "token-mean")


def test_clipped_value_loss_by_hand():
    # tok 0: V 1.0, V_old 0.5, R 0: V_clip 0.7; max(1.0, 0.49) = 1.0 -> 0.5, clip inactive.
    # tok 1: V 0.9, V_old 0.5, R 1: V_clip 0.7; max(0.01, 0.09) = 0.09 -> 0.045, clip active.
    # tok 2: masked (inf inputs) -> 0.
    v = t([[1.0, 0.9, float("inf")]]).requires_grad_(True)
    out = clipped_value_loss(
        v, t([[0.5, 0.5, 0.0]]), t([[0.0, 1.0, float("nan")]]), torch.tensor([[1, 1, 0]]), clip=0.2
    )
    torch.testing.assert_close(out.loss, t([[0.5, 0.045, 0.0]]), rtol=0, atol=1e-15)
    assert out.clipped.tolist() == [[False, True, False]]
    out.loss.sum().backward()
    # d/dV of 0.5 (V - R)^2 = V - R = 1.0 for tok 0; the clipped term is constant in V at tok 1 -> 0.
    torch.testing.assert_close(v.grad, t([[1.0, 0.0, 0.0]]), rtol=0, atol=1e-15)
    unclipped = clipped_value_loss(t([[0.9]]), t([[0.5]]), t([[1.0]]), torch.ones(1, 1), clip=None)
    torch.testing.assert_close(unclipped.loss, t([[0.005]]), rtol=0, atol=1e-15)


# ------------------------------------------------------------------------------------------ overlong


def test_overlong_reward_penalty_piecewise():
    # L_max 20, L_cache 4 -> ramp starts after 16: 10, 16 -> 0; 17 -> -1/4; 18 -> -2/4; 20 -> -1; 21 -> -1.
    p = overlong_reward_penalty(torch.tensor([10, 16, 17, 18, 20, 21]), max_length=20, buffer_length=4)
    assert p.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    p = overlong_reward_penalty(torch.tensor([18]), max_length=20, buffer_length=4, penalty_factor=0.5)
    assert p.tolist() == [-0.25]
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_reward_penalty(torch.tensor([1]), max_length=20, buffer_length=30)


def test_mask_truncated_and_missing_eos_penalty():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert mask_truncated(mask, torch.tensor([False, True])).tolist() == [[1, 1, 0], [0, 0, 0]]
    assert mask_truncated(mask.bool(), torch.tensor([True, False])).tolist() == [[False] * 3, [True] * 3]
    assert missing_eos_penalty(t([1.0, 1.0]), torch.tensor([True, False]), penalty=0.5).tolist() == [0.5, 1.0]


# ----------------------------------------------------------------------------- robustness and errors


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize(
    "mask",
    [torch.zeros(4, 3), torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]]), torch.ones(4, 3)],
    ids=["empty", "some-rows-masked", "full"],
)
def test_advantages_never_nan(name, mask):
    rewards = place_rewards(t([1.0, 1.0, 1.0, 0.0]), mask)
    values = t([[float("inf")] * 3] * 4) if not mask.any() else torch.zeros(4, 3, dtype=D)
    estimator = get_advantage_estimator(name)
    turns = {}
    if "turn_ids" in inspect.signature(estimator).parameters:  # per-turn: one turn per row, one state
        turns = {"turn_ids": torch.zeros(4, 3, dtype=torch.long), "turn_counts": torch.ones(4, dtype=torch.long)}
        turns["state_ids"] = torch.zeros(4, 1, dtype=torch.long)
        turns = {k: v for k, v in turns.items() if k in inspect.signature(estimator).parameters}
    adv, ret = estimator(rewards, mask, group_ids=torch.tensor([0, 0, 1, 2]), values=values, **turns)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.equal(adv[~mask.bool()], torch.zeros(int((~mask.bool()).sum()), dtype=D))


@pytest.mark.parametrize("name", ["ppo_clip", "clip_higher", "dual_clip"])
def test_policy_losses_never_nan_with_adversarial_logprobs(name):
    inf = float("inf")
    logp = t([[-inf, 0.0, -50.0], [inf, -inf, 0.0]]).requires_grad_(True)
    old = t([[-inf, -inf, 0.0], [0.0, -inf, 60.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1]])
    out = get_policy_loss(name)(logp, old, t([[1.0, -1.0, 2.0], [1.0, 1.0, -3.0]]), mask)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        loss = aggregate_loss(out.loss, mask, mode)
        assert torch.isfinite(loss)
    aggregate_loss(out.loss, mask).backward()
    assert torch.isfinite(logp.grad).all() and torch.isfinite(out.objective).all()
    empty = get_policy_loss(name)(logp.detach(), old, torch.zeros(2, 3, dtype=D), torch.zeros(2, 3))
    assert aggregate_loss(empty.loss, torch.zeros(2, 3)).item() == 0.0


def test_kl_never_nan_with_impossible_tokens():
    inf = float("inf")
    logp, ref = t([[0.0, -inf, -1.0]]), t([[-inf, -inf, 0.0]])
    for name in ("k1", "k2", "k3"):
        assert torch.isfinite(get_kl_estimator(name)(logp, ref)).all(), name


def test_errors_name_the_field():
    rewards, mask = outcome([1.0, 0.0])
    with pytest.raises(ValueError, match=r"group_ids must have shape \(2,\)"):
        get_advantage_estimator("grpo")(rewards, mask, group_ids=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="group_ids is required"):
        get_advantage_estimator("rloo")(rewards, mask, group_ids=None)
    with pytest.raises(ValueError, match="values is required"):
        get_advantage_estimator("gae")(rewards, mask, values=None)
    with pytest.raises(ValueError, match="token_rewards must be finite"):
        get_advantage_estimator("grpo")(
            t([[float("nan")], [0.0]]), mask, group_ids=torch.zeros(2, dtype=torch.long)
        )
    with pytest.raises(ValueError, match=r"mask must have shape \(2, 1\)"):
        get_advantage_estimator("reinforce_plus_plus")(rewards, torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'.*grpo"):
        get_advantage_estimator("ppo")
    with pytest.raises(ValueError, match="eps_low"):
        get_policy_loss("clip_higher")(t([[0.0]]), t([[0.0]]), t([[1.0]]), torch.ones(1, 1), eps_low=1.5)
    with pytest.raises(ValueError, match=r"^dual_clip must be > 1 and finite \(or None\), got 0\.5$"):
        clipped_surrogate(t([[0.0]]), t([[0.0]]), t([[1.0]]), torch.ones(1, 1), dual_clip=0.5)
    # A non-finite bound, called directly (not through the config): each named as the loss takes it.
    with pytest.raises(ValueError, match=r"^dual_clip must be > 1 and finite \(or None\), got inf$"):
        clipped_surrogate(t([[0.0]]), t([[0.0]]), t([[1.0]]), torch.ones(1, 1), dual_clip=float("inf"))
    with pytest.raises(ValueError, match=r"^eps_high must be >= 0 and finite, got inf$"):
        get_policy_loss("clip_higher")(t([[0.0]]), t([[0.0]]), t([[1.0]]), torch.ones(1, 1), eps_high=float("inf"))
    with pytest.raises(ValueError, match=r"^c must be > 1 and finite \(or None\), got inf$"):
        get_policy_loss("dual_clip")(t([[0.0]]), t([[0.0]]), t([[1.0]]), torch.ones(1, 1), c=float("inf"))
    with pytest.raises(ValueError, match=r"^eps must be in \[0, 1\), got inf$"):
        get_policy_loss("ppo_clip")(t([[0.0]]), t([[0.0]]), t([[1.0]]), torch.ones(1, 1), eps=float("inf"))
    with pytest.raises(ValueError, match=r"advantages must have shape \(1, 1\)"):
        get_policy_loss("ppo_clip")(t([[0.0]]), t([[0.0]]), t([1.0]), torch.ones(1, 1))


def test_register_custom_estimator_and_duplicate_name():
    @register_advantage_estimator("test_constant_one")
    def constant_one(token_rewards, mask, *, group_ids=None, values=None):
        return torch.ones_like(token_rewards), token_rewards

    try:
        assert get_advantage_estimator("test_constant_one") is constant_one
        with pytest.raises(ValueError, match="already registered"):
            register_advantage_estimator("grpo")(constant_one)
    finally:
        del ADVANTAGE_ESTIMATORS["test_constant_one"]
