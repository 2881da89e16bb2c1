"""GRPO math: rewards to advantages, per-token log-probabilities, and the clipped policy loss.

Pure tensor functions, no trainer state, so each formula can be checked by hand in tests.
Notation: B completions, T completion tokens (right padded), mask[b, t] = 1 on real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def combine_rewards(per_fn: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(B, F) rewards with NaN for 'not scored' -> (B,) weighted sum; NaN counts as 0 (TRL's nansum)."""
    return torch.nansum(per_fn * weights[None, :], dim=1)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantage = reward - group mean, divided by the group's std, the batch's std, or 1.

    Returns (advantages (B,), per-group std (B / G,)). Groups are consecutive runs of `group_size`.
    The std is the unbiased one (as torch.std and TRL), plus 1e-4 so zero-std groups give 0, not NaN.
    """
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1).repeat_interleave(group_size)
    group_std = grouped.std(dim=1)
    adv = rewards - mean
    if scale == "group":
        adv = adv / (group_std.repeat_interleave(group_size) + 1e-4)
    elif scale == "batch":
        adv = adv / (rewards.std() + 1e-4)
    elif scale != "none":
        raise ValueError(f"unknown scale_rewards {scale!r}")
    return adv, group_std


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[index] without materialising the full log-softmax for the gradient."""
    return logits.gather(-1, index.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = logits.log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


@dataclass
class LossOut:
    loss: torch.Tensor  # this micro-batch's contribution; summing over micro-batches gives the step's loss
    kl: torch.Tensor  # masked token mean of the k3 estimate (0 when beta = 0)
    clip_low: torch.Tensor
    clip_high: torch.Tensor
    clip_region: torch.Tensor


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str,
    epsilon_low: float,
    epsilon_high: float,
    is_level: str = "token",
    beta: float = 0.0,
    ref_logps: torch.Tensor | None = None,
    num_micro_batches: int = 1,
    max_completion_length: int | None = None,
    global_num_tokens: float | None = None,
    global_num_seqs: int | None = None,
    token_weights: torch.Tensor | None = None,
) -> LossOut:
    """Clipped surrogate loss plus beta * k3 KL, aggregated by `loss_type`.

    ratio r = exp(logps - old_logps) per token, or for is_level='sequence' (GSPO) one ratio per
    sequence, exp(mean over its tokens of the log-ratio). Token loss:
        -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) + beta * (exp(ref - logp) - (ref - logp) - 1)
    Aggregation over the step (all micro-batches of one optimizer step):
        grpo:    mean over sequences of each sequence's token mean
        bnpo:    token mean within each micro-batch, averaged over micro-batches
        dr_grpo: token sum / (sequences in the step x max_completion_length)
        dapo:    token sum / tokens in the whole step
    The returned loss is this micro-batch's share, so gradients accumulate to the step's loss.
    """
    mask = mask.to(logps.dtype)
    log_ratio = logps - old_logps
    if is_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    elif is_level != "token":
        raise ValueError(f"unknown importance_sampling_level {is_level!r}")
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    adv = advantages.unsqueeze(-1)
    per_token = -torch.min(ratio * adv, clipped * adv)
    per_token = per_token.expand_as(logps) if per_token.shape != logps.shape else per_token
    if token_weights is not None:  # truncated importance sampling (see importance_weights), not on the KL term
        per_token = per_token * token_weights

    kl = torch.zeros((), dtype=logps.dtype)
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs reference logprobs")
        delta = ref_logps - logps
        per_token_kl = torch.exp(delta) - delta - 1
        per_token = per_token + beta * per_token_kl
        kl = masked_mean(per_token_kl.detach(), mask)

    n_seqs = global_num_seqs if global_num_seqs is not None else logps.shape[0] * num_micro_batches
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / n_seqs
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1) / num_micro_batches
    elif loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length")
        loss = (per_token * mask).sum() / (n_seqs * max_completion_length)
    elif loss_type == "dapo":
        tokens = global_num_tokens if global_num_tokens is not None else float(mask.sum()) * num_micro_batches
        loss = (per_token * mask).sum() / max(tokens, 1.0)
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}")

    with torch.no_grad():
        r = ratio.expand_as(logps) if ratio.shape != logps.shape else ratio
        a = adv.expand_as(logps)
        low = ((r < 1 - epsilon_low) & (a < 0)).to(mask.dtype)
        high = ((r > 1 + epsilon_high) & (a > 0)).to(mask.dtype)
        out = LossOut(loss, kl, masked_mean(low, mask), masked_mean(high, mask),
                      masked_mean(((low + high) > 0).to(mask.dtype), mask))
    return out


@dataclass
class ISWeights:
    weights: torch.Tensor  # (B, L) or (B, 1): multiplies the per-token policy loss
    metrics: dict[str, float]


@torch.no_grad()
def importance_weights(train_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                       cap: float) -> ISWeights:
    """Truncated importance sampling between the trainer's and the sampler's policies (TIS; TRL's
    vllm_importance_sampling_*, verl's rollout correction).

    ratio = pi_train / pi_sample = exp(train_logps - sampling_logps) per token ('token_*'), or the product
    over a sequence's tokens ('sequence_*', exp of the summed difference). '*_truncate' clips the ratio at
    `cap`; '*_mask' sets ratios above `cap` to 0 (the token or the sequence drops out of the loss).
    Metrics (TRL's names): sampling/sampling_logp_difference/{mean,max} (|train - sample| over real tokens),
    sampling/importance_sampling_ratio/{min,mean,max}, and sampling/is_masked_fraction (our name).
    """
    m = mask.to(train_logps.dtype)
    diff = (train_logps - sampling_logps) * m
    level, _, how = mode.partition("_")
    if level == "sequence":
        log_ratio = diff.sum(-1, keepdim=True)
        valid = m.sum(-1, keepdim=True) > 0
    elif level == "token":
        log_ratio, valid = diff, m > 0
    else:
        raise ValueError(f"unknown importance sampling mode {mode!r}")
    ratio = torch.exp(log_ratio.clamp(max=80.0))
    if how == "truncate":
        weights, dropped = ratio.clamp(max=cap), torch.zeros_like(valid)
    elif how == "mask":
        dropped = ratio > cap
        weights = ratio.masked_fill(dropped, 0.0)
    else:
        raise ValueError(f"unknown importance sampling mode {mode!r}")
    r = ratio[valid.expand_as(ratio)]
    absdiff = diff.abs()[m > 0]
    metrics = {
        "sampling/sampling_logp_difference/mean": absdiff.mean().item() if absdiff.numel() else 0.0,
        "sampling/sampling_logp_difference/max": absdiff.max().item() if absdiff.numel() else 0.0,
        "sampling/importance_sampling_ratio/min": r.min().item() if r.numel() else 1.0,
        "sampling/importance_sampling_ratio/mean": r.mean().item() if r.numel() else 1.0,
        "sampling/importance_sampling_ratio/max": r.max().item() if r.numel() else 1.0,
        "sampling/is_masked_fraction": (dropped & valid).sum().item() / max(1, int(valid.sum())),
    }
    return ISWeights(weights, metrics)
