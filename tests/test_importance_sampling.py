"""Truncated importance sampling between trainer and sampler logprobs (grpo.importance_weights), against
hand-worked values and against TRL's formula."""

from __future__ import annotations

import math

import pytest
import torch

from backend.train.grpo import importance_weights, policy_loss

TRAIN = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -0.2, 0.0]])
SAMPLE = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -2.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the last token of row 2 is padding


def test_token_truncate_hand_worked() -> None:
    out = importance_weights(TRAIN, SAMPLE, MASK, "token_truncate", cap=2.0)
    # diffs: row1 [0.5, -1, 0], row2 [0, 1.8, (pad)]: ratios e^0.5=1.6487, e^-1, 1, 1, e^1.8=6.05 -> capped at 2
    expect = torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0], [1.0, 2.0, 1.0]])
    torch.testing.assert_close(out.weights, expect)
    m = out.metrics
    assert m["sampling/sampling_logp_difference/max"] == pytest.approx(1.8)
    assert m["sampling/sampling_logp_difference/mean"] == pytest.approx((0.5 + 1.0 + 0 + 0 + 1.8) / 5)
    assert m["sampling/importance_sampling_ratio/max"] == pytest.approx(math.exp(1.8))  # before the cap
    assert m["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-1.0))
    assert m["sampling/is_masked_fraction"] == 0.0


def test_token_mask_drops_tokens_above_the_cap() -> None:
    out = importance_weights(TRAIN, SAMPLE, MASK, "token_mask", cap=2.0)
    assert out.weights[1, 1] == 0.0 and out.weights[0, 0] == pytest.approx(math.exp(0.5))
    assert out.metrics["sampling/is_masked_fraction"] == pytest.approx(1 / 5)


def test_sequence_modes_use_the_product_of_token_ratios() -> None:
    t = importance_weights(TRAIN, SAMPLE, MASK, "sequence_truncate", cap=2.0)
    # row1: sum of diffs -0.5 -> e^-0.5; row2: 1.8 -> e^1.8 = 6.05, capped at 2
    torch.testing.assert_close(t.weights, torch.tensor([[math.exp(-0.5)], [2.0]]))
    m = importance_weights(TRAIN, SAMPLE, MASK, "sequence_mask", cap=2.0)
    torch.testing.assert_close(m.weights, torch.tensor([[math.exp(-0.5)], [0.0]]))
    assert m.metrics["sampling/is_masked_fraction"] == 0.5


def test_matches_trl_formula() -> None:
    """TRL's GRPOTrainer: exp((old - sampling) * mask), summed over tokens for sequence modes, clamp or masked_fill."""
    g = torch.Generator().manual_seed(0)
    old, samp = -torch.rand(4, 6, generator=g) * 3, -torch.rand(4, 6, generator=g) * 3
    mask = (torch.rand(4, 6, generator=g) > 0.2).long()
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        diff = (old - samp) * mask
        if mode.startswith("sequence"):
            diff = diff.sum(-1, keepdim=True)
        ratio = torch.exp(diff)
        ref = ratio.clamp(max=3.0) if mode.endswith("truncate") else ratio.masked_fill(ratio > 3.0, 0.0)
        torch.testing.assert_close(importance_weights(old, samp, mask, mode, 3.0).weights, ref)
    with pytest.raises(ValueError, match="unknown importance sampling mode"):
        importance_weights(old, samp, mask, "tokens", 3.0)


def test_weights_scale_the_policy_loss_per_token() -> None:
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    kw = dict(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.2)
    plain = policy_loss(logps, logps.detach(), adv, mask, **kw).loss
    weighted = policy_loss(logps, logps.detach(), adv, mask, token_weights=torch.tensor([[0.5, 0.0]]), **kw).loss
    assert plain.item() == pytest.approx(-1.0) and weighted.item() == pytest.approx(-0.25)  # (0.5 + 0) / 2 tokens
