"""The train/inference mismatch metrics and the rollout corrections, against hand-computed values.

Every expected number below is worked out by hand in the comment beside it (ρ = exp(old − engine)).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from chatgym.trainer.algos.correction import rollout_correction
from chatgym.trainer.algos.mismatch import mismatch_summary, mismatch_terms
from chatgym.trainer.algos.policy_loss import truncated_is_weights
from chatgym.trainer.config.run import ConfigError, load_config

LN2 = 0.6931471805599453


def _mismatch_batch():
    """Row 0: r = learner − engine = (ln 2, −ln 2) and a pad whose values are inf; row 1: r = 0.1 on its
    one generated token (after a prompt token)."""
    engine = torch.tensor([[-2.0, -1.0, 0.0], [0.0, -3.0, 0.0]])
    learner = torch.tensor([[-2.0 + LN2, -1.0 - LN2, float("inf")], [5.0, -2.9, 0.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]], dtype=torch.bool)
    return learner, engine, mask


def test_mismatch_terms_and_summary_hand_values():
    learner, engine, mask = _mismatch_batch()
    t = mismatch_terms(learner, engine, mask)
    # |r|: ln 2, ln 2, 0.1 on the masked tokens, 0 elsewhere (the inf pad is never read).
    torch.testing.assert_close(t.abs_diff, torch.tensor([[0.693147, 0.693147, 0.0], [0.0, 0.1, 0.0]]), atol=1e-5, rtol=0)
    # k3 = e^r − 1 − r: 2 − 1 − ln 2 = 0.306853; 0.5 − 1 + ln 2 = 0.193147; e^0.1 − 1.1 = 0.005171.
    torch.testing.assert_close(t.k3, torch.tensor([[0.306853, 0.193147, 0.0], [0.0, 0.005171, 0.0]]), atol=1e-5, rtol=0)
    # Σ_t r per row: ln 2 − ln 2 = 0; 0.1.
    torch.testing.assert_close(t.seq_log_ratio, torch.tensor([0.0, 0.1]), atol=1e-5, rtol=0)
    s = mismatch_summary(learner, engine, mask)
    assert s["tokens"] == 3
    assert s["mean_abs"] == pytest.approx(0.495431, abs=1e-5)  # (2 ln 2 + 0.1) / 3
    assert s["max_abs"] == pytest.approx(0.693147, abs=1e-5)  # ln 2
    assert s["k3_kl"] == pytest.approx(0.168390, abs=1e-5)  # (0.306853 + 0.193147 + 0.005171) / 3
    assert s["seq_abs_log_ratio"] == pytest.approx(0.05, abs=1e-6)  # (|0| + |0.1|) / 2


def test_mismatch_summary_of_an_empty_mask_is_zero():
    learner, engine, mask = _mismatch_batch()
    s = mismatch_summary(learner, engine, torch.zeros_like(mask))
    assert s == {"mean_abs": 0.0, "max_abs": 0.0, "k3_kl": 0.0, "seq_abs_log_ratio": 0.0, "tokens": 0}


def _ratio_batch():
    """ρ per row: row 0 (3, 0.6) and a pad; row 1 (0.25, 1, 4/3); row 2 prompt only (no masked token).

    Row 0: Π = 1.8, geometric mean sqrt(1.8) = 1.341641. Row 1: Π = 1/3, geometric (1/3)^(1/3) = 0.693361.
    """
    rho = torch.tensor([[3.0, 0.6, 1.0], [0.25, 1.0, 4.0 / 3.0], [1.0, 1.0, 1.0]])
    engine = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -0.7, -1.5], [0.0, 0.0, 0.0]])
    old = engine + torch.log(rho)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    return old, engine, mask


def _close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-5, rtol=0)


def test_token_tis_hand_values_and_equal_to_truncated_is_weights():
    old, engine, mask = _ratio_batch()
    out = rollout_correction(old, engine, mask, mode="token_tis", cap=2.0)
    _close(out.weights, [[2.0, 0.6, 0.0], [0.25, 1.0, 1.333333], [0.0, 0.0, 0.0]])  # min(ρ, 2)
    assert out.clipped.tolist() == [[True, False, False], [False, False, False], [False, False, False]]
    assert out.seq_clipped is None
    # Today's weights, bit for bit (the default keeps every run's numbers).
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 7, generator=gen), torch.randn(4, 7, generator=gen)
    m = torch.rand(4, 7, generator=gen) > 0.3
    assert torch.equal(
        rollout_correction(a, b, m, mode="token_tis", cap=1.5).weights, truncated_is_weights(a, b, m, cap=1.5)
    )


def test_seq_tis_hand_values():
    old, engine, mask = _ratio_batch()
    out = rollout_correction(old, engine, mask, mode="seq_tis", cap=2.0)
    # Π ρ on every masked token: 1.8 (under the cap), 1/3.
    _close(out.weights, [[1.8, 1.8, 0.0], [0.333333, 0.333333, 0.333333], [0.0, 0.0, 0.0]])
    assert not out.clipped.any()
    assert out.seq_clipped.tolist() == [False, False, False]
    out = rollout_correction(old, engine, mask, mode="seq_tis", cap=1.5)
    _close(out.weights, [[1.5, 1.5, 0.0], [0.333333, 0.333333, 0.333333], [0.0, 0.0, 0.0]])  # 1.8 -> 1.5
    assert out.clipped.tolist() == [[True, True, False], [False, False, False], [False, False, False]]
    assert out.seq_clipped.tolist() == [True, False, False]


def test_token_mask_hand_values():
    old, engine, mask = _ratio_batch()
    out = rollout_correction(old, engine, mask, mode="token_mask", cap=2.0, band=(0.5, 2.0))
    # ρ = 3 and ρ = 0.25 leave [0.5, 2]: weight 0; the rest min(ρ, 2).
    _close(out.weights, [[0.0, 0.6, 0.0], [0.0, 1.0, 1.333333], [0.0, 0.0, 0.0]])
    assert out.clipped.tolist() == [[True, False, False], [True, False, False], [False, False, False]]
    out = rollout_correction(old, engine, mask, mode="token_mask", cap=None, band=(0.5, 2.0))
    _close(out.weights, [[0.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # kept tokens weigh 1
    assert out.clipped.tolist() == [[True, False, False], [True, False, False], [False, False, False]]


def test_seq_mask_hand_values():
    old, engine, mask = _ratio_batch()
    out = rollout_correction(old, engine, mask, mode="seq_mask", cap=2.0, band=(0.5, 2.0))
    # Row 0: Π = 1.8 in the band, tokens min(ρ, 2) = (2, 0.6), the first truncated. Row 1: Π = 1/3 < 0.5,
    # dropped whole.
    _close(out.weights, [[2.0, 0.6, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert out.clipped.tolist() == [[True, False, False], [True, True, True], [False, False, False]]
    assert out.seq_clipped.tolist() == [False, True, False]


def test_geo_mask_hand_values():
    old, engine, mask = _ratio_batch()
    out = rollout_correction(old, engine, mask, mode="geo_mask", cap=2.0, band=(0.5, 2.0))
    # Geometric means 1.341641 and 0.693361 are both in [0.5, 2]: nothing dropped, tokens min(ρ, 2).
    _close(out.weights, [[2.0, 0.6, 0.0], [0.25, 1.0, 1.333333], [0.0, 0.0, 0.0]])
    assert out.seq_clipped.tolist() == [False, False, False]
    out = rollout_correction(old, engine, mask, mode="geo_mask", cap=None, band=(0.6, 1.25))
    # 1.341641 > 1.25: row 0 dropped; 0.693361 in [0.6, 1.25]: row 1 kept with weight 1.
    _close(out.weights, [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert out.clipped.tolist() == [[True, True, False], [False, False, False], [False, False, False]]
    assert out.seq_clipped.tolist() == [True, False, False]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "bogus"}, "unknown rollout correction 'bogus'"),
        ({"mode": "seq_tis", "cap": None}, "'seq_tis' needs a cap"),
        ({"mode": "seq_mask", "band": (1.2, 2.0)}, "0 < lo <= 1 <= hi"),
        ({"mode": "token_tis", "cap": 0.0}, "cap must be > 0"),
    ],
)
def test_bad_correction_arguments_are_refused(kwargs, message):
    old, engine, mask = _ratio_batch()
    with pytest.raises(ValueError, match=message):
        rollout_correction(old, engine, mask, **kwargs)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.rollout_correction=seq"], "algo.rollout_correction: unknown 'seq'"),
        (["algo.rollout_correction=seq_tis", "algo.tis_cap=null"], "algo.rollout_correction: 'seq_tis'"),
        (["algo.rollout_mask_band=[0.5,0.9]"], "algo.rollout_mask_band must be"),
        (["algo.rollout_mask_band=[0,2]"], "algo.rollout_mask_band must be"),
    ],
)
def test_bad_correction_fields_fail_at_config_load_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_correction_fields_load():
    config = load_config(None, ["algo.rollout_correction=geo_mask", "algo.rollout_mask_band=[0.9,1.1]"])
    assert config.algo.rollout_correction == "geo_mask"
    assert config.algo.rollout_mask_band == (0.9, 1.1)
    assert load_config(None).algo.rollout_correction == "token_tis"  # the default: today's TIS


# ------------------------------------------------------------------------------ the update's metrics




def _update(model, algo, **plan):
    from test_packing import group_batch_with_engine_logprobs
    from test_trainer import _sgd_models

    from chatgym.trainer.learner.forward import ForwardPlan
    from chatgym.trainer.learner.update import update

    return update(
        _sgd_models(copy.deepcopy(model), 0.1),
        group_batch_with_engine_logprobs(model),
        algo,
        ForwardPlan(micro_batch_size=3, device=torch.device("cpu"), **plan),
        max_grad_norm=None,
        generator=torch.Generator().manual_seed(0),
    )


@pytest.mark.parametrize("precompute", [False, True])
def test_update_reports_the_mismatch_with_and_without_the_old_logprob_pass(tiny_model, precompute):
    from chatgym.trainer.config.run import AlgoConfig

    # The engine's logprobs are the model's own + 0.1, so r = learner − engine = −0.1 on every one of
    # the 23 generated tokens (rows of 5, 2, 4, 3, 6, 3). With two mini-batches the prepared
    # old-logprob pass is the learner's side; with one step it is the update's own forward.
    algo = AlgoConfig(tis_cap=2.0, mini_batches=2 if precompute else 1)
    m = _update_precomputed(tiny_model, algo) if precompute else _update(tiny_model, algo)
    assert m["rollout/mismatch/mean_abs"] == pytest.approx(0.1, abs=1e-5)
    assert m["rollout/mismatch/max_abs"] == pytest.approx(0.1, abs=1e-5)
    assert m["rollout/mismatch/k3_kl"] == pytest.approx(math.exp(-0.1) - 0.9, abs=1e-6)  # 0.0048374
    if not precompute:  # one optimizer step: the update's forward is at the sampling weights too.
        # Regression: this was exp(0.1) − 1.1 = 0.0051709, k3 with the ratio upside down (no KL estimate).
        assert m["actor/engine_kl"] == pytest.approx(math.exp(-0.1) - 0.9, abs=1e-6)
    assert m["rollout/mismatch/seq_abs_log_ratio"] == pytest.approx(0.1 * 23 / 6, abs=1e-5)  # 0.383333
    assert m["rollout/mismatch/clip_frac"] == 0.0  # ρ = e^−0.1 < 2
    assert "rollout/mismatch/seq_clip_frac" not in m


def _update_precomputed(model, algo):
    from test_packing import group_batch_with_engine_logprobs
    from test_trainer import _sgd_models

    from chatgym.trainer.learner.forward import ForwardPlan, batch_logprobs
    from chatgym.trainer.learner.update import update

    plan = ForwardPlan(micro_batch_size=3, device=torch.device("cpu"))
    batch = group_batch_with_engine_logprobs(model)
    batch.old_logprobs = batch_logprobs(model, batch, plan)
    return update(
        _sgd_models(copy.deepcopy(model), 0.1),
        batch,
        algo,
        plan,
        max_grad_norm=None,
        generator=torch.Generator().manual_seed(0),
    )


def test_update_seq_mask_drops_the_sequences_outside_the_band(tiny_model):
    from chatgym.trainer.config.run import AlgoConfig

    # Π ρ = e^(−0.1 n) per row: n = 5 -> 0.607, 2 -> 0.819, 4 -> 0.670, 3 -> 0.741, 6 -> 0.549, 3 -> 0.741.
    # Band [0.7, 1.5] drops the rows of 5, 4 and 6 tokens: 15 of 23 tokens, 3 of 6 sequences.
    algo = AlgoConfig(tis_cap=2.0, rollout_correction="seq_mask", rollout_mask_band=(0.7, 1.5))
    m = _update(tiny_model, algo)
    assert m["rollout/mismatch/clip_frac"] == pytest.approx(15 / 23, abs=1e-6)
    assert m["rollout/mismatch/seq_clip_frac"] == pytest.approx(0.5, abs=1e-6)
    # The kept 8 tokens weigh e^−0.1 each, the dropped 15 weigh 0: mean 8 e^−0.1 / 23 = 0.314806.
    assert m["actor/tis_weight"] == pytest.approx(8 * math.exp(-0.1) / 23, abs=1e-5)


def test_update_without_a_correction_still_reports_the_mismatch(tiny_model):
    from chatgym.trainer.config.run import AlgoConfig

    m = _update(tiny_model, AlgoConfig(tis_cap=None))
    assert m["rollout/mismatch/mean_abs"] == pytest.approx(0.1, abs=1e-5)
    assert "rollout/mismatch/clip_frac" not in m and "actor/tis_weight" not in m
