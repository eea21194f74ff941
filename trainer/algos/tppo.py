"""Truncated PPO (T-PPO): advantages for responses that are not finished yet, and a value model
trained only on finished ones.

Source: Fan et al. 2025, "Truncated Proximal Policy Optimization" (arXiv:2506.15050), §3:

- **Extended GAE (EGAE).** A response cut before its end (a generation window, a token budget, a
  partial rollout carried to the next step) has no outcome reward yet. Plain GAE would treat the cut
  as the episode's end (``V = 0`` after the last token) and push every token of it towards "bad".
  EGAE instead bootstraps from the value of the state the response was cut at, ``V(s_l)``::

      delta_t = r_t + gamma V(s_{t+1}) - V(s_t),   with V(s_l) the bootstrap value of the cut
      A_t     = sum_{k=0}^{l-t-1} (gamma lam)^k delta_{t+k}

  so a finished response gets exactly GAE, and an unfinished one the truncated lambda-return of the
  tokens it has (Sutton & Barto §12; the time-limit bootstrap of Pardo et al. 2018, arXiv:1712.00378).
- **Independent policy / value updates.** The policy trains on every response's tokens with the EGAE
  advantages; the value model trains only on *finished* responses, against their Monte-Carlo return
  (``critic_lam = 1``: an unbiased target, the decoupled-lambda choice of VC-PPO, arXiv:2503.01491),
  since an unfinished response's return is unknown. :func:`tppo_value_mask` gives that mask.

Conventions as :mod:`.advantages` (``gae``): (B, T) tensors, generated tokens are the time steps,
observation tokens are skipped, rewards at non-generated positions are credited to the nearest earlier
generated token, outputs are 0 where the mask is 0 and computed without gradient.
"""

from __future__ import annotations

import torch

from chatgym.trainer.algos.advantages import AdvantageOutput, check_value_inputs, gae_scan
from chatgym.trainer.algos.masked import check_shape, masked_whiten
from chatgym.trainer.algos.registry import register_advantage_estimator


def _rows_flag(name: str, flag: torch.Tensor | None, batch: int, device: torch.device) -> torch.Tensor:
    if flag is None:
        return torch.zeros(batch, dtype=torch.bool, device=device)
    check_shape(name, flag, (batch,))
    return flag.to(device=device, dtype=torch.bool)


@torch.no_grad()
def extended_gae(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    values: torch.Tensor,
    truncated: torch.Tensor | None = None,
    bootstrap_values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> torch.Tensor:
    """EGAE advantages (not whitened), (B, T) in ``token_rewards``' dtype.

    Args:
        token_rewards: (B, T) float, rewards on tokens (an unfinished row usually has none).
        mask: (B, T) loss mask; its 1s are the time steps.
        values: (B, T) float, ``V(s_t)`` at each generated position (finite there).
        truncated: (B,) bool, True for a row whose response is unfinished (None: all finished).
        bootstrap_values: (B,) float, ``V(s_l)``, the value of the state after a truncated row's
            last token; read only on truncated rows (required when any row is truncated).
        gamma: discount in [0, 1]; lam: lambda in [0, 1].

    Raises:
        ValueError: bad shapes, gamma/lam out of range, a truncated row without a finite bootstrap.
    """
    m = check_value_inputs("tppo", token_rewards, mask, values, gamma, lam)
    batch = token_rewards.shape[0]
    cut = _rows_flag("truncated", truncated, batch, token_rewards.device)
    last_value = None
    if bool(cut.any()):
        if bootstrap_values is None:
            raise ValueError("bootstrap_values (V of the state a truncated response was cut at) is required")
        check_shape("bootstrap_values", bootstrap_values, (batch,))
        boot = bootstrap_values.to(token_rewards.dtype)
        if not bool(torch.isfinite(boot[cut]).all()):
            raise ValueError("bootstrap_values must be finite on truncated rows")
        # The only change from GAE: the value after an unfinished row's last token is V(s_l), not 0.
        last_value = torch.where(cut, boot, torch.zeros_like(boot))
    return gae_scan(token_rewards, m, values.to(token_rewards.dtype), gamma, lam, last_value)


@register_advantage_estimator("tppo")
@torch.no_grad()
def tppo_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    values: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    bootstrap_values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    critic_lam: float = 1.0,
    whiten: bool = True,
    eps: float = 1e-8,
) -> AdvantageOutput:
    """T-PPO's estimator: EGAE advantages for the policy (``lam``; whitened over the batch's
    generated tokens with ``whiten``) and value targets ``returns = EGAE(critic_lam) + V``
    (``critic_lam = 1``: the Monte-Carlo return of a finished row). Train the value model only where
    :func:`tppo_value_mask` is set. ``group_ids`` is ignored. See :func:`extended_gae` for the
    arguments and the module docstring for the source (arXiv:2506.15050).
    """
    common = {"values": values, "truncated": truncated, "bootstrap_values": bootstrap_values, "gamma": gamma}
    advantages = extended_gae(token_rewards, mask, lam=lam, **common)
    critic_adv = (
        advantages if critic_lam == lam else extended_gae(token_rewards, mask, lam=critic_lam, **common)
    )
    m = mask.bool()
    returns = torch.where(m, critic_adv + values.to(token_rewards.dtype), torch.zeros_like(critic_adv))
    if whiten:
        advantages = masked_whiten(advantages, m, eps)
    return AdvantageOutput(advantages, returns)


def tppo_value_mask(mask: torch.Tensor, truncated: torch.Tensor | None) -> torch.Tensor:
    """(B, T) bool: the tokens the value model trains on — generated tokens of finished rows only
    (T-PPO's independent value update: an unfinished row has no known return).

    Args:
        mask: (B, T) loss mask; truncated: (B,) bool (None: no row truncated).
    """
    m = mask.bool()
    cut = _rows_flag("truncated", truncated, m.shape[0], m.device)
    return m & ~cut[:, None]
