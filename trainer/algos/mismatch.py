"""The train/inference mismatch: how far the engine's logprobs of its sampled tokens are from the
learner's logprobs of the same tokens under the same weights.

Per token, with ``r = learner_logprob − engine_logprob`` on loss-masked (generated) tokens:

- ``|r|``: its mean and max over the batch are ``rollout/mismatch/mean_abs`` / ``max_abs``;
- ``k3 = exp(r) − 1 − r``: the mean is ``rollout/mismatch/k3_kl``. The tokens are samples of the
  *engine*, so by Schulman's construction (samples x ~ q, ratio p(x)/q(x) with q = engine, p = learner)
  this is an unbiased, always >= 0 estimate of KL(engine ‖ learner). (``actor/engine_kl`` is the same
  estimate against the learner's logprobs in the update's own forward, which moves between mini-batches.)
- per sequence, ``Σ_t r``: the log of the sequence-level ratio π_learner(y)/π_engine(y); the mean of its
  absolute value over rows is ``rollout/mismatch/seq_abs_log_ratio``.

Example (two tokens, r = ln 2 and −ln 2): ``|r|`` = 0.693147 each; k3 = (2 − 1 − ln 2) = 0.306853 and
(0.5 − 1 + ln 2) = 0.193147, mean 0.25; the sequence's Σ r = 0.

Source: Schulman 2020, "Approximating KL Divergence" (joschu.net/blog/kl-approx.html); peer: verl
``compute_offpolicy_metrics`` (rollout_corr_helper), slime ``--get-mismatch-metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from chatgym.trainer.algos.kl import kl_k3
from chatgym.trainer.algos.masked import as_bool_mask, check_2d, check_shape, masked_sum, safe_log_ratio


@dataclass(frozen=True)
class MismatchTerms:
    """Per-token and per-sequence mismatch terms, all detached float.

    Attributes:
        abs_diff: (B, T) ``|learner − engine|``, 0 off the mask.
        k3: (B, T) ``exp(r) − 1 − r``, 0 off the mask.
        seq_log_ratio: (B,) ``Σ_t r`` over each row's masked tokens (0 for a row with none).
        mask: (B, T) bool, the tokens the terms cover.
    """

    abs_diff: torch.Tensor
    k3: torch.Tensor
    seq_log_ratio: torch.Tensor
    mask: torch.Tensor


@torch.no_grad()
def mismatch_terms(
    learner_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor
) -> MismatchTerms:
    """The mismatch of each masked token and sequence (see the module docstring).

    Args:
        learner_logprobs: (B, T) float, the learner's logprobs of the sampled tokens under the weights
            that sampled them.
        engine_logprobs: (B, T) float, the engine's logprobs of the same tokens.
        mask: (B, T) loss mask.

    Raises:
        ValueError: a shape mismatch, naming the argument.
    """
    check_2d("learner_logprobs", learner_logprobs)
    check_shape("engine_logprobs", engine_logprobs, learner_logprobs.shape)
    m = as_bool_mask("mask", mask, learner_logprobs.shape)
    learner = learner_logprobs.detach().float()
    engine = engine_logprobs.detach().to(learner.device, torch.float32)
    r = safe_log_ratio(learner, engine, m)
    k3 = kl_k3(engine, learner, m)  # exp(r) - 1 - r with r = learner - engine; 0 off the mask
    return MismatchTerms(abs_diff=r.abs(), k3=k3, seq_log_ratio=masked_sum(r, m, dim=1), mask=m)


def mismatch_summary(
    learner_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The batch's figures as plain floats: ``mean_abs``, ``max_abs``, ``k3_kl`` (token means / max over
    masked tokens), ``seq_abs_log_ratio`` (mean over rows with a masked token) and ``tokens`` (their
    count); all 0.0 when no token is masked."""
    t = mismatch_terms(learner_logprobs, engine_logprobs, mask)
    n = int(t.mask.sum())
    rows = t.mask.any(dim=1)
    if n == 0:
        return {"mean_abs": 0.0, "max_abs": 0.0, "k3_kl": 0.0, "seq_abs_log_ratio": 0.0, "tokens": 0}
    return {
        "mean_abs": float(masked_sum(t.abs_diff, t.mask)) / n,
        "max_abs": float(t.abs_diff[t.mask].max()),
        "k3_kl": float(masked_sum(t.k3, t.mask)) / n,
        "seq_abs_log_ratio": float(t.seq_log_ratio[rows].abs().mean()),
        "tokens": n,
    }
