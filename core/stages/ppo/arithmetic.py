"""The arithmetic of PPO for language models, on padded (batch, position) tensors with a mask.

Positions are those of the next-token predictions: position t holds the log-probability of token
t + 1 and the value of the state after token t. `mask` is 1 on the positions that predict a
response token, 0 on the prompt and padding. Each function is plain torch, so the trainer in
`ppo.py` stays about data flow and these stay testable by hand.

The formulas are the ones of Ziegler et al. (2019) and Schulman et al. (2017) as LLaMA-Factory's
PPO applies them: a per-token KL penalty against the reference with the reward-model score added
at the last response token, generalised advantage estimation, clipped policy and value losses, and
an adaptive KL coefficient that steers the measured KL towards `ppo_target`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True) -> torch.Tensor:
    """Scale `values` to unit variance over the masked positions; centred too when `shift_mean`."""
    mean = masked_mean(values, mask)
    count = mask.sum()
    variance = masked_mean((values - mean) ** 2, mask) * (count / (count - 1).clamp(min=1))  # unbiased
    whitened = (values - mean) * torch.rsqrt(variance + 1e-8)
    return (whitened if shift_mean else whitened + mean) * mask


def last_positions(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last masked position of each row (rows hold at least one)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).max(dim=1).values


def token_rewards(
    scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, *, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards, kl) per position: -kl_coef x (log pi - log pi_ref) on every response token, plus the
    score at the last one."""
    kl = (logprobs - ref_logprobs) * mask
    rewards = -kl_coef * kl
    rows = torch.arange(scores.shape[0], device=scores.device)
    rewards[rows, last_positions(mask)] += scores.to(rewards.dtype)
    return rewards, kl


def advantages_and_returns(
    values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, *, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates (whitened over the response) and the value targets.

    The episode ends after the last response token; masked-out positions neither earn nor pass on value.
    """
    values, rewards = values * mask, rewards * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * mask[:, t] + running * (1 - mask[:, t])
        advantages[:, t] = running * mask[:, t]
    returns = advantages + values
    return masked_whiten(advantages, mask), returns


@dataclass(frozen=True)
class Losses:
    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    policy_clipped: torch.Tensor  # share of positions where the ratio was clipped
    value_clipped: torch.Tensor
    approx_kl: torch.Tensor  # between the rollout policy and the current one


def clipped_losses(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, values: torch.Tensor, old_values: torch.Tensor,
    advantages: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
    cliprange: float, cliprange_value: float, vf_coef: float,
) -> Losses:
    """PPO's clipped surrogate policy loss plus `vf_coef` times the clipped value loss."""
    clipped_values = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    value_errors = torch.maximum((values - returns) ** 2, (clipped_values - returns) ** 2)
    value_loss = 0.5 * masked_mean(value_errors, mask)
    ratio = torch.exp(logprobs - old_logprobs)
    policy_errors = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - cliprange, 1 + cliprange))
    policy_loss = masked_mean(policy_errors, mask)
    with torch.no_grad():
        policy_clipped = masked_mean((-advantages * ratio < policy_errors).float(), mask)
        value_clipped = masked_mean(((values - returns) ** 2 < value_errors).float(), mask)
        approx_kl = 0.5 * masked_mean((logprobs - old_logprobs) ** 2, mask)
    return Losses(policy_loss + vf_coef * value_loss, policy_loss, value_loss, policy_clipped, value_clipped, approx_kl)


class AdaptiveKLController:
    """The KL coefficient, moved towards the value that keeps the measured KL at `target`
    (proportional control, error clipped to +-20%, over a `horizon` of samples)."""

    def __init__(self, value: float, *, target: float, horizon: int) -> None:
        self.value, self.target, self.horizon = value, target, horizon

    def update(self, kl: float, *, samples: int) -> None:
        error = min(max(kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * samples / self.horizon


class RunningMoments:
    """Mean and standard deviation of every score seen (for `ppo_score_norm`), merged batch by batch."""

    def __init__(self, mean: float = 0.0, var: float = 1.0, count: float = 1e-24) -> None:
        self.mean, self.var, self.count = mean, var, count

    def update(self, values: torch.Tensor) -> None:
        batch_mean = values.double().mean().item()
        batch_var = values.double().var(unbiased=False).item()
        batch_count = values.numel()
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean += delta * batch_count / total
        self.var = (self.var * self.count + batch_var * batch_count + delta ** 2 * self.count * batch_count / total) / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.var * self.count / max(self.count - 1, 1))

    def state(self) -> dict[str, float]:
        return {"mean": self.mean, "var": self.var, "count": self.count}
