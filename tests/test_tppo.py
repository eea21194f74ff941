"""T-PPO (arXiv:2506.15050): extended GAE on hand-computed values, and the value-update mask."""

from __future__ import annotations

import pytest
import torch

from chatgym.trainer.learner.algos import get_advantage_estimator, masked_whiten
from chatgym.trainer.learner.algos.tppo import extended_gae, tppo_advantages, tppo_value_mask

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
