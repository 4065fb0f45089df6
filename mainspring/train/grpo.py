"""GRPO's arithmetic: group-relative advantages and the clipped, token-level policy loss.

Token-level means DAPO's aggregation: every completion token of the whole batch weighs the same, so
a long answer is not averaged down to the weight of a short one. The loss of a micro-batch is the
*sum* of its token terms divided by the token count of the whole batch (every micro-batch, every
data-parallel rank), which makes gradient accumulation and data parallelism exact: the summed
gradients equal the gradient of the full batch's token mean (verl#906 and #5798 are this, wrong).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """rewards [num_groups, G] -> advantages of the same shape: reward minus its group's mean, over
    the group's std when `scale` is "group" (DeepSeekMath); "none" keeps the raw difference (Dr. GRPO)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, G >= 2], got {tuple(rewards.shape)}")
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "none":
        return centered
    if scale != "group":
        raise ValueError(f"unknown reward scaling {scale!r} (group, none)")
    return centered / (rewards.std(dim=1, keepdim=True, unbiased=True) + eps)


def has_signal(rewards: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """[num_groups] bool: groups whose rewards differ (all-equal groups give zero gradient: DAPO's
    dynamic sampling drops and refills them)."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) > eps


@dataclass
class LossParts:
    loss: torch.Tensor  # this micro-batch's share of the batch loss (sum of token terms / batch tokens)
    clipped_tokens: int  # tokens whose ratio fell outside [1 - clip_low, 1 + clip_high] against their advantage
    kl_sum: float  # sum of per-token k3 KL (when a reference is given)
    tokens: int


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                batch_tokens: int, clip_low: float = 0.2, clip_high: float = 0.28,
                ref_logp: torch.Tensor | None = None, kl_beta: float = 0.0,
                token_weights: torch.Tensor | None = None) -> LossParts:
    """PPO-clip surrogate with clip-higher, token-level aggregation.

    logp, old_logp, ref_logp, mask: [B, T] (mask 1 on completion tokens); advantages: [B] (one per
    completion, broadcast over its tokens); token_weights: optional [B] (a domain's loss weight).
    """
    if batch_tokens <= 0:
        raise ValueError("batch_tokens must be positive")
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None].to(logp.dtype)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl_sum = 0.0
    if ref_logp is not None and kl_beta > 0:
        # k3 estimator (Schulman): exp(ref - logp) - (ref - logp) - 1, unbiased and >= 0
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1.0
        per_token = per_token + kl_beta * kl
        kl_sum = float((kl.detach() * mask).sum())
    if token_weights is not None:
        per_token = per_token * token_weights[:, None].to(logp.dtype)
    loss = (per_token * mask).sum() / batch_tokens
    was_clipped = (clipped.detach() < unclipped.detach()) & mask.bool()
    return LossParts(loss, int(was_clipped.sum()), kl_sum, int(mask.sum()))
