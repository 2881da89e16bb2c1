"""Chunked logprobs and entropies from hidden states (backend.train.token_logps) against the plain computation:
log_softmax over the full [tokens x vocabulary] logits, values and gradients, in float64 and float32."""

from __future__ import annotations

import pytest
import torch

from backend.footprint import auto_chunk
from backend.train.grpo import selective_log_softmax, token_entropy
from backend.train.token_logps import token_logps


def _plain(h, w, b, t, T):
    z = torch.nn.functional.linear(h, w, b).float() / T
    return selective_log_softmax(z, t), token_entropy(z)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_unchunked_computation(chunk: int, bias: bool, temperature: float) -> None:
    g = torch.Generator().manual_seed(0)
    N, H, V = 13, 8, 50
    h = torch.randn(N, H, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    t = torch.randint(0, V, (N,), generator=g)
    g_lp, g_ent = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)

    lp, ent = token_logps(h, w, b, t, temperature, want_entropy=True, chunk=chunk, entropy_grad=True)
    (lp * g_lp + ent * g_ent).sum().backward()
    got = [h.grad.clone(), w.grad.clone()] + ([b.grad.clone()] if bias else [])
    for x in (h, w) + ((b,) if bias else ()):
        x.grad = None
    # the reference in float64 throughout
    z = torch.nn.functional.linear(h, w, b) / temperature
    ref_lp, ref_ent = selective_log_softmax(z, t), token_entropy(z)
    (ref_lp * g_lp + ref_ent * g_ent).sum().backward()
    want = [h.grad, w.grad] + ([b.grad] if bias else [])
    torch.testing.assert_close(lp, ref_lp, rtol=1e-12, atol=1e-12)  # float64 in, float64 throughout
    torch.testing.assert_close(ent, ref_ent, rtol=1e-12, atol=1e-12)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


def test_without_entropy_gradient_the_entropy_is_detached_and_logp_grads_match() -> None:
    g = torch.Generator().manual_seed(1)
    h = torch.randn(9, 6, generator=g, requires_grad=True)
    w = torch.randn(40, 6, generator=g, requires_grad=True)
    t = torch.randint(0, 40, (9,), generator=g)
    lp, ent = token_logps(h, w, None, t, 1.0, want_entropy=True, chunk=4)
    assert not ent.requires_grad and lp.requires_grad
    lp.sum().backward()
    got = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref_lp, ref_ent = _plain(h, w, None, t, 1.0)
    ref_lp.sum().backward()
    torch.testing.assert_close(ent, ref_ent.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[0], h.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], w.grad, rtol=1e-5, atol=1e-6)


def test_no_entropy_asked_gives_none_and_no_grad_mode_works() -> None:
    h, w, t = torch.randn(5, 4), torch.randn(30, 4), torch.randint(0, 30, (5,))
    with torch.no_grad():
        lp, ent = token_logps(h, w, None, t, 1.3, chunk=2)
    assert ent is None and not lp.requires_grad
    torch.testing.assert_close(lp, _plain(h, w, None, t, 1.3)[0])


def test_auto_chunk_keeps_a_slice_within_the_budget() -> None:
    assert auto_chunk(151_936) * 151_936 * 3 * 4 <= 256 << 20
    assert auto_chunk(101) > 100_000 and auto_chunk(10**9) == 16


def test_under_bf16_autocast_the_backward_recomputes_what_the_forward_computed() -> None:
    g = torch.Generator().manual_seed(2)
    h = torch.randn(11, 16, generator=g, requires_grad=True)
    w = torch.randn(64, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 64, (11,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = token_logps(h, w, None, t, 1.0, chunk=4)
        ref = selective_log_softmax(torch.nn.functional.linear(h, w).float(), t)
    torch.testing.assert_close(lp, ref)
    lp.sum().backward()
    got = h.grad.clone()
    h.grad = None
    ref.sum().backward()
    torch.testing.assert_close(got, h.grad, rtol=2e-2, atol=2e-2)  # bf16 products on both sides


@pytest.mark.parametrize("path", ["lean", "model", "lora"])
def test_policy_logps_in_slices_equal_the_full_logits_pass(path: str) -> None:
    """PolicyLogps (the trainer's door) with a 3-token head slice against log_softmax over full logits: the lean
    pass, the model's own forward (eval-mode switch off the lean pass: gradient checkpointing), and LoRA."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from backend.train.batch import Rollout
    from backend.train.forward import PolicyLogps, chunked_head, completion_logits
    from tests.test_forward import batch

    model = AutoModelForCausalLM.from_pretrained(Path(__file__).resolve().parent.parent / "assets/tiny-add",
                                                 dtype=torch.float32)
    if path == "model":
        model.gradient_checkpointing_enable()
        model.train()
    if path == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    assert chunked_head(model)
    p_ids, p_mask, c_ids, c_mask = batch(4)
    B = p_ids.shape[0]
    ro = Rollout(1, 0, p_ids, p_mask, c_ids, c_mask, c_mask, None, torch.zeros(B), {}, [])
    params = [p for p in model.parameters() if p.requires_grad]

    def run(fn):
        model.zero_grad()
        lp, ent = fn()
        ((lp * c_mask).sum() + (ent * c_mask).sum() * 0.5).backward()
        return (lp * c_mask).detach(), (ent * c_mask).detach(), [p.grad.clone() for p in params]

    group = None if path == "model" else 4  # gradient checkpointing runs each sequence whole, as in the trainer
    sliced = PolicyLogps(torch.device("cpu"), None, 0.7, group, chunk_tokens=3)
    got = run(lambda: (lambda o: (o.logps, o.entropies))(sliced(model, ro, slice(0, B), want_entropy=True, entropy_grad=True)))

    def full():
        z = completion_logits(model, p_ids, p_mask, c_ids, c_mask, group).float() / 0.7
        return selective_log_softmax(z, c_ids), token_entropy(z)

    want = run(full)
    # float32 rounding of the same sums in another order (the project's engine-vs-trainer tolerance is 1e-4)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-4)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-4)
    for a, b in zip(got[2], want[2]):
        assert (a - b).norm() <= 2e-4 * b.norm()
