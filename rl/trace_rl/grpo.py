"""GRPO losses and estimators as pure functions over tensors, registered by name.

Shapes: B = sequences in the batch (prompts x G samples, grouped contiguously: the G samples of
prompt p are rows p*G .. p*G+G-1), T = response tokens (right-padded), `mask` [B, T] is 1.0 on real
response tokens. Log-probabilities are of the sampled tokens, float32.

Registries:
- `ADVANTAGES`: name -> fn(rewards [B], group_size, **kw) -> advantages [B]
- `POLICY_LOSSES`: name -> fn(logprobs, old_logprobs, advantages, mask, **kw) -> (loss [], stats)
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

ADVANTAGES: dict[str, Callable[..., Tensor]] = {}
POLICY_LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, float]]]] = {}


def register_advantage(name: str):
    def wrap(fn):
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} registered twice")
        ADVANTAGES[name] = fn
        return fn
    return wrap


def register_policy_loss(name: str):
    def wrap(fn):
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} registered twice")
        POLICY_LOSSES[name] = fn
        return fn
    return wrap


def get_advantage(name: str) -> Callable[..., Tensor]:
    if name not in ADVANTAGES:
        raise KeyError(f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGES)}")
    return ADVANTAGES[name]


def get_policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    if name not in POLICY_LOSSES:
        raise KeyError(f"unknown policy loss {name!r}; known: {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"batch of {rewards.numel()} rewards is not a multiple of group_size={group_size}")
    return rewards.float().view(-1, group_size)  # [P, G]


@register_advantage("grpo")
def grpo_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """(r - mean_group) / (std_group + eps), std unbiased=False. rewards [B] -> advantages [B].

    A group whose rewards are all equal gets advantage 0 (it carries no learning signal).
    """
    r = _grouped(rewards, group_size)  # [P, G]
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, unbiased=False, keepdim=True)
    return ((r - mean) / (std + eps)).reshape(-1)


@register_advantage("dr_grpo")
def mean_centred_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """r - mean_group, no std normalisation (Dr. GRPO). rewards [B] -> advantages [B]."""
    r = _grouped(rewards, group_size)  # [P, G]
    return (r - r.mean(dim=1, keepdim=True)).reshape(-1)


def token_mean(values: Tensor, mask: Tensor) -> Tensor:
    """DAPO token-level mean: sum over every real token of the batch / number of real tokens.

    values, mask [B, T] -> []. Long responses weigh more than short ones, per token.
    """
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def sequence_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Original GRPO: mean over each sequence's tokens, then over sequences. [B, T] -> []."""
    per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)  # [B]
    has_tokens = (mask.sum(dim=1) > 0).float()
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1.0)


def k3_terms(logp: Tensor, logq: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(p || q) from samples of p: r - 1 - log r with r = q/p.

    logp: log-probs under the sampling policy p, logq: under q, both [B, T] -> [B, T] (>= 0).
    """
    log_ratio = (logq - logp).float()
    return torch.expm1(log_ratio) - log_ratio


def k3_kl(logp: Tensor, logq: Tensor, mask: Tensor) -> Tensor:
    """Token-mean k3 estimate of KL(p || q), samples drawn from p. [B, T] x3 -> []."""
    return token_mean(k3_terms(logp, logq), mask)


def max_abs_prob_diff(logp: Tensor, logq: Tensor, mask: Tensor) -> Tensor:
    """max over real tokens of |p(token) - q(token)|. [B, T] x3 -> []."""
    diff = (logp.float().exp() - logq.float().exp()).abs() * mask
    return diff.max() if diff.numel() else diff.new_zeros(())


def truncated_is_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, cap: float) -> Tensor:
    """Truncated importance weights min(pi_old / pi_rollout, cap), no gradient. [B, T] -> [B, T].

    Corrects for the rollout engine sampling from a slightly different distribution than the
    trainer's policy (FP4 rollout vs BF16 trainer), truncated so rare tokens cannot blow up.
    """
    if cap <= 0:
        raise ValueError(f"truncated IS cap must be > 0, got {cap}")
    return torch.exp(old_logprobs.detach().float() - rollout_logprobs.float()).clamp(max=cap)


def _clipped_surrogate(logprobs, old_logprobs, advantages, eps_low, eps_high):
    log_ratio = logprobs.float() - old_logprobs.detach().float()  # [B, T]
    ratio = torch.exp(log_ratio)
    adv = advantages.float().unsqueeze(1)  # [B, 1]
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)  # [B, T]
    was_clipped = (clipped < unclipped).float()  # the clip bound was the active (smaller) term
    return per_token, ratio, was_clipped


def _policy_loss(reduce, logprobs, old_logprobs, advantages, mask, *, eps_low, eps_high,
                 rollout_logprobs, tis_cap, ref_logprobs, kl_coef):
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} "
                         f"and mask {tuple(mask.shape)} must have the same shape [B, T]")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [B]={logprobs.shape[0]}, got {tuple(advantages.shape)}")
    mask = mask.float()
    per_token, ratio, was_clipped = _clipped_surrogate(logprobs, old_logprobs, advantages,
                                                       eps_low, eps_high)
    stats: dict[str, Tensor] = {}  # read back to floats in one copy at the end
    if tis_cap is not None:
        if rollout_logprobs is None:
            raise ValueError("tis_cap is set but rollout_logprobs is None")
        weights = truncated_is_weights(old_logprobs, rollout_logprobs, tis_cap)  # [B, T]
        per_token = per_token * weights
        stats["tis_weight_mean"] = token_mean(weights, mask)
        stats["tis_capped_frac"] = token_mean((weights >= tis_cap).float(), mask)
    if kl_coef:
        if ref_logprobs is None:
            raise ValueError("kl_coef is non-zero but ref_logprobs is None")
        # k3 of KL(pi || pi_ref) on the trainer's own samples, differentiable through logprobs.
        kl = k3_terms(logprobs, ref_logprobs.detach())
        per_token = per_token + kl_coef * kl
        stats["ref_kl"] = token_mean(kl.detach(), mask)
    loss = reduce(per_token, mask)
    stats["clip_frac"] = token_mean(was_clipped, mask)
    stats["ratio_mean"] = token_mean(ratio.detach(), mask)
    values = torch.stack(list(stats.values())).tolist()
    return loss, dict(zip(stats, values))


@register_policy_loss("grpo_token_mean")
def grpo_token_mean_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                         eps_low: float = 0.2, eps_high: float = 0.28,
                         rollout_logprobs: Tensor | None = None, tis_cap: float | None = None,
                         ref_logprobs: Tensor | None = None, kl_coef: float = 0.0,
                         ) -> tuple[Tensor, dict[str, float]]:
    """DAPO-style GRPO loss: clipped surrogate with asymmetric clip (clip-higher), token-level mean.

    logprobs [B, T]: trainer log-probs of the sampled tokens (with grad);
    old_logprobs [B, T]: the same under the policy that produced the batch, as the trainer computes
        it (detached; equal to logprobs on the first update of an on-policy step);
    advantages [B]: one per sequence, broadcast over its tokens; mask [B, T]: 1 on response tokens;
    rollout_logprobs [B, T]: log-probs the rollout engine reported; with tis_cap, each token's loss
        is weighted by min(exp(old - rollout), tis_cap) (truncated importance sampling);
    ref_logprobs [B, T] and kl_coef: adds kl_coef * k3(pi || pi_ref) per token (off by default).

    per-token loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A), ratio = exp(lp - old).
    Returns (scalar loss, stats: clip_frac, ratio_mean, and tis_*/ref_kl when enabled).
    """
    return _policy_loss(token_mean, logprobs, old_logprobs, advantages, mask, eps_low=eps_low,
                        eps_high=eps_high, rollout_logprobs=rollout_logprobs, tis_cap=tis_cap,
                        ref_logprobs=ref_logprobs, kl_coef=kl_coef)


@register_policy_loss("grpo_seq_mean")
def grpo_sequence_mean_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                            eps_low: float = 0.2, eps_high: float = 0.28,
                            rollout_logprobs: Tensor | None = None, tis_cap: float | None = None,
                            ref_logprobs: Tensor | None = None, kl_coef: float = 0.0,
                            ) -> tuple[Tensor, dict[str, float]]:
    """As `grpo_token_mean` but averaged per sequence first, then over sequences (original GRPO).

    Same inputs and shapes; kept for comparison with the DAPO token-level mean.
    """
    return _policy_loss(sequence_mean, logprobs, old_logprobs, advantages, mask, eps_low=eps_low,
                        eps_high=eps_high, rollout_logprobs=rollout_logprobs, tis_cap=tis_cap,
                        ref_logprobs=ref_logprobs, kl_coef=kl_coef)
