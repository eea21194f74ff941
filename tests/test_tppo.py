"""T-PPO (arXiv:2506.15050): extended GAE on hand-computed values, and the value-update mask."""

from __future__ import annotations

import pytest
import torch

from chatgym.trainer.algos import get_advantage_estimator, masked_whiten
from chatgym.trainer.algos.tppo import extended_gae, tppo_advantages, tppo_value_mask

# Row 0, finished: prompt, gen, gen, observation, gen; reward 1 on its last token.
# Row 1, unfinished (cut after 3 generated tokens; last column is padding), no reward yet.
MASK = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 1, 1, 0]], dtype=torch.bool)
REWARDS = torch.tensor([[0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0]], dtype=torch.float64)
# Values off the mask are junk on purpose: they must never be read.
VALUES = torch.tensor([[9.0, 0.5, 0.25, 9.0, 0.75], [9.0, 0.5, 0.25, 0.5, 9.0]], dtype=torch.float64)
CUT = torch.tensor([False, True])
BOOT = torch.tensor([123.0, 0.75], dtype=torch.float64)  # row 0's entry is not read (finished)


def test_egae_hand_values_gamma1_lambda_half():
    adv = extended_gae(REWARDS, MASK, values=VALUES, truncated=CUT, bootstrap_values=BOOT, gamma=1.0, lam=0.5)
    # Row 0 (plain GAE; time steps t1, t2, t4, nothing after t4):
    #   d4 = 1 - 0.75 = 0.25                     A4 = 0.25
    #   d2 = V4 - V2 = 0.5                        A2 = 0.5 + 0.5 * 0.25 = 0.625
    #   d1 = V2 - V1 = -0.25                      A1 = -0.25 + 0.5 * 0.625 = 0.0625
    # Row 1 (EGAE: V after the cut = bootstrap 0.75):
    #   d3 = 0 + 0.75 - 0.5 = 0.25                A3 = 0.25
    #   d2 = V3 - V2 = 0.25                       A2 = 0.25 + 0.5 * 0.25 = 0.375
    #   d1 = V2 - V1 = -0.25                      A1 = -0.25 + 0.5 * 0.375 = -0.0625
    expected = torch.tensor([[0, 0.0625, 0.625, 0, 0.25], [0, -0.0625, 0.375, 0.25, 0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)


def test_without_truncation_egae_is_gae():
    # Plain GAE on row 1 (it treats the cut as the end, V = 0 after it):
    #   d3 = 0 - 0.5 = -0.5, A3 = -0.5; d2 = 0.25, A2 = 0.25 - 0.25 = 0; d1 = -0.25, A1 = -0.25.
    adv = extended_gae(REWARDS, MASK, values=VALUES, gamma=1.0, lam=0.5)
    gae, _ = get_advantage_estimator("gae")(REWARDS, MASK, values=VALUES, gamma=1.0, lam=0.5, whiten=False)
    torch.testing.assert_close(adv, gae, rtol=0, atol=1e-12)
    torch.testing.assert_close(adv[1], torch.tensor([0, -0.25, 0.0, -0.5, 0], dtype=torch.float64))


def test_discounted_monte_carlo_returns_with_lambda_one():
    adv = extended_gae(REWARDS, MASK, values=VALUES, truncated=CUT, bootstrap_values=BOOT, gamma=0.5, lam=1.0)
    # gamma = 0.5, lam = 1: A_t + V_t is the discounted return. Row 0: 1 at t4, 0.5 at t2, 0.25 at t1.
    # Row 1: the bootstrap 0.75 discounted: 0.375 at t3, 0.1875 at t2, 0.09375 at t1.
    torch.testing.assert_close(
        (adv + VALUES)[MASK], torch.tensor([0.25, 0.5, 1.0, 0.09375, 0.1875, 0.375], dtype=torch.float64)
    )


def test_registered_estimator_policy_advantages_and_critic_targets():
    est = get_advantage_estimator("tppo")
    assert est is tppo_advantages
    adv, returns = est(
        REWARDS, MASK, values=VALUES, truncated=CUT, bootstrap_values=BOOT, gamma=1.0, lam=0.5, whiten=False
    )
    torch.testing.assert_close(adv[0], torch.tensor([0, 0.0625, 0.625, 0, 0.25], dtype=torch.float64))
    # critic_lam = 1, gamma = 1: the Monte-Carlo return, 1 on every token of the finished row and the
    # bootstrap 0.75 on the unfinished one (which the value update does not train on).
    torch.testing.assert_close(
        returns, torch.tensor([[0, 1, 1, 0, 1.0], [0, 0.75, 0.75, 0.75, 0]], dtype=torch.float64)
    )
    whitened, _ = est(REWARDS, MASK, values=VALUES, truncated=CUT, bootstrap_values=BOOT, gamma=1.0, lam=0.5)
    torch.testing.assert_close(whitened, masked_whiten(adv, MASK, 1e-8))


def test_value_mask_keeps_only_finished_rows():
    assert tppo_value_mask(MASK, CUT).tolist() == [[False, True, True, False, True], [False] * 5]
    assert tppo_value_mask(MASK, None).tolist() == MASK.tolist()


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="bootstrap_values"):
        extended_gae(REWARDS, MASK, values=VALUES, truncated=CUT)
    with pytest.raises(ValueError, match="finite on truncated rows"):
        extended_gae(
            REWARDS, MASK, values=VALUES, truncated=CUT, bootstrap_values=torch.tensor([0.0, float("nan")])
        )
    with pytest.raises(ValueError, match="values is required"):
        tppo_advantages(REWARDS, MASK, values=None)
    with pytest.raises(ValueError, match="lam must be in"):
        extended_gae(REWARDS, MASK, values=VALUES, lam=1.5)


# ------------------------------------------------------- through prepare_batch and update (learner)


def _tiny_critic():
    from transformers import AutoModelForTokenClassification, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        classifier_dropout=0.0,  # the head's default dropout (0.1) would make every value pass differ
    )
    return AutoModelForTokenClassification.from_config(config).float()


def _traj(ids, mask, finish, reward, sample):
    from chatgym.trainer.rollout.types import Trajectory

    return Trajectory(
        "X",
        0,
        0,
        sample,
        list(ids),
        list(mask),
        [-0.5 if m else 0.0 for m in mask],
        [0 if m else -1 for m in mask],
        reward=reward,
        rewards=[reward],
        finish_reasons=[finish],
    )


def test_prepare_batch_bootstraps_unfinished_rows_and_masks_them_out_of_the_value_loss():
    from chatgym.trainer.config.run import AlgoConfig
    from chatgym.trainer.learner.forward import ForwardPlan
    from chatgym.trainer.learner.prepare import prepare_batch
    from chatgym.trainer.learner.update import UpdateState, update

    critic = _tiny_critic()
    # Row 0 ends with EOS (reward 1); row 1 was cut by max_tokens ("length"): unfinished.
    trajs = [
        _traj([3, 4, 5, 6, 7], [0, 0, 1, 1, 1], "stop", 1.0, 0),
        _traj([3, 4, 8, 9, 10, 11], [0, 0, 1, 1, 1, 1], "length", 0.0, 1),
    ]
    algo = AlgoConfig(advantage="tppo", advantage_kwargs={"lam": 0.5, "whiten": False})
    plan = ForwardPlan(micro_batch_size=1)
    batch, _ = prepare_batch(
        trajs, algo, max_response_tokens=8, pad_id=0, policy=None, plan=plan, critic=critic
    )

    # Independent values: one forward per row; V(s_t) is the head on token t-1, V(s_l) on the last token.
    with torch.no_grad():
        full = [critic(input_ids=torch.tensor([t.token_ids])).logits[0, :, 0].double() for t in trajs]
    values = torch.zeros(2, 6, dtype=torch.float64)
    for i, v in enumerate(full):
        values[i, 1 : len(v)] = v[:-1]
    rewards = torch.zeros(2, 6, dtype=torch.float64)
    rewards[0, 4] = 1.0
    mask = batch.loss_mask
    expected = extended_gae(
        rewards,
        mask,
        values=values,
        truncated=torch.tensor([False, True]),
        bootstrap_values=torch.tensor([0.0, float(full[1][-1])], dtype=torch.float64),
        gamma=1.0,
        lam=0.5,
    )
    torch.testing.assert_close(batch.advantages.double(), expected, rtol=0, atol=1e-5)
    # Row 1's last advantage is the one-step bootstrap: V(s_l) - V(s_{l-1}) (no reward, gamma 1).
    torch.testing.assert_close(
        float(batch.advantages[1, 5]), float(full[1][5] - full[1][4]), rtol=0, atol=1e-5
    )
    assert batch.value_mask.tolist() == [[False, False, True, True, True, False], [False] * 6]

    # The update trains the value model on row 0 only, its loss a mean over row 0's 3 value tokens:
    # the critic's gradient equals that of the value loss written out by hand on row 0.
    from transformers import LlamaConfig, LlamaForCausalLM

    from chatgym.trainer.algos import clipped_value_loss
    from chatgym.trainer.learner.forward import forward_values

    torch.manual_seed(1)
    policy = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
    )
    critic = _tiny_critic()
    grads: dict[str, torch.Tensor] = {}
    for name, p in critic.named_parameters():
        p.register_hook(lambda g, n=name: grads.__setitem__(n, g.clone()))
    opts = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (policy, critic)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda _: 1.0) for o in opts]
    state = UpdateState(policy, opts[0], scheds[0], critic, opts[1], scheds[1])
    update(state, batch, algo, plan, max_grad_norm=None, generator=torch.Generator().manual_seed(0))

    by_hand = _tiny_critic()
    row = batch.select([0])
    vmask = row.value_mask
    out = clipped_value_loss(
        forward_values(by_hand, row), row.old_values, row.returns, vmask, clip=algo.value_clip
    )
    (algo.value_loss_coef * (out.loss * vmask).sum() / vmask.sum()).backward()
    compared = 0
    for name, p in by_hand.named_parameters():
        if p.grad is not None and p.grad.abs().sum() > 0:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-7)
            compared += 1
    assert compared >= 5  # embeddings, attention, MLP, norms, the value head
