"""The shared-prompt forward gives the same log-probabilities and gradients as a plain forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.rollout.hf import left_pad
from backend.train.forward import completion_logits
from backend.train.grpo import selective_log_softmax

ROOT = Path(__file__).resolve().parent.parent


def batch(G: int) -> tuple[torch.Tensor, ...]:
    prompts = [[6, 7, 77, 8, 9, 85], [14, 77, 15, 85], [7, 7, 77, 9, 85]]  # different lengths: left padding
    torch.manual_seed(0)
    p_ids, p_mask = left_pad([p for p in prompts for _ in range(G)], 0)
    B, Lc = p_ids.shape[0], 4
    c_ids = torch.randint(5, 20, (B, Lc))
    lens = torch.randint(1, Lc + 1, (B,))
    c_mask = (torch.arange(Lc)[None, :] < lens[:, None]).long()
    c_ids = c_ids * c_mask  # pad id 0 after the end
    return p_ids, p_mask, c_ids, c_mask


@pytest.mark.parametrize("G", [1, 4])
def test_shared_prefix_matches_plain_forward(G: int) -> None:
    model = AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-add", dtype=torch.float32)
    p_ids, p_mask, c_ids, c_mask = batch(G)

    def loss_and_grads(group):
        model.zero_grad()
        logps = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, group), c_ids)
        (logps * c_mask).sum().backward()
        return logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain, g_plain = loss_and_grads(None)
    shared, g_shared = loss_and_grads(G)
    torch.testing.assert_close(shared * c_mask, plain * c_mask, rtol=1e-4, atol=1e-5)
    assert g_plain.keys() == g_shared.keys()
    for name in g_plain:
        torch.testing.assert_close(g_shared[name], g_plain[name], rtol=1e-3, atol=1e-5)
