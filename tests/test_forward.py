"""The shared-prompt forward gives the same log-probabilities and gradients as a plain forward, and the lean
forward (backend.train.forward.packed_completion_logits) the same as transformers' forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.rollout.fast_decode import set_lean
from backend.rollout.hf import left_pad
from backend.train import forward
from backend.train.builders import disable_dropout
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


def _random_model(arch: str, **extra) -> torch.nn.Module:
    """A small random model with grouped-query attention (2 key/value heads for 4 query heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kw = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64, attn_implementation="sdpa", **extra)
    torch.manual_seed(1)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**kw, attention_bias=True, tie_word_embeddings=False))
    return Qwen2ForCausalLM(Qwen2Config(**kw, tie_word_embeddings=True))


def _hf_only(monkeypatch) -> None:
    monkeypatch.setattr(forward, "lean_supported", lambda *a: False)


@pytest.mark.parametrize("which", ["tiny", "qwen2-gqa", "llama-gqa"])
@pytest.mark.parametrize("G", [None, 4])
def test_lean_forward_matches_hf(which: str, G: int | None, monkeypatch) -> None:
    """The lean forward's logprobs and gradients equal the transformers forward's (both paths: plain, shared)."""
    model = (AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-add", dtype=torch.float32) if which == "tiny"
             else _random_model(which.split("-")[0]))
    model.train()
    assert forward.lean_supported(model, torch.device("cpu"))
    p_ids, p_mask, c_ids, c_mask = batch(G or 1)

    def loss_and_grads():
        model.zero_grad()
        logps = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, G), c_ids)
        (logps * c_mask * torch.linspace(0.5, 2.0, logps.numel()).view_as(logps)).sum().backward()
        return logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    lean, g_lean = loss_and_grads()
    assert torch.isfinite(lean).all()  # padding rows too: no all-masked attention row
    with monkeypatch.context() as m:
        _hf_only(m)
        hf, g_hf = loss_and_grads()
    torch.testing.assert_close(lean * c_mask, hf * c_mask, rtol=1e-5, atol=1e-5)
    assert g_lean.keys() == g_hf.keys()
    for name in g_hf:
        scale = max(1.0, g_hf[name].abs().max().item())  # summation order: error grows with the gradient's size
        torch.testing.assert_close(g_lean[name], g_hf[name], rtol=1e-4, atol=1e-5 * scale)


def test_lean_forward_falls_back_where_it_would_differ() -> None:
    """Wrapped (LoRA), hooked, autocast, dropout-in-training, flash-attention and sliding-window models take the
    transformers forward, and every model does after fast_decode.set_lean(False); gradient checkpointing does not
    (the lean pass checkpoints its own layers)."""
    from peft import LoraConfig, get_peft_model

    cpu = torch.device("cpu")
    model = _random_model("qwen2").train()
    assert forward.lean_supported(model, cpu)
    before = set_lean(False)
    try:
        assert not forward.lean_supported(model, cpu)
    finally:
        set_lean(before)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not forward.lean_supported(model, cpu)
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert not forward.lean_supported(model, cpu)
    handle.remove()
    model.gradient_checkpointing_enable()
    assert forward.lean_supported(model, cpu)
    dropout = _random_model("qwen2", attention_dropout=0.1).train()
    assert not forward.lean_supported(dropout, cpu)
    assert forward.lean_supported(dropout.eval(), cpu)  # attention dropout acts only in training
    disable_dropout(dropout.train())  # what the trainer does with algorithm.disable_dropout
    assert forward.lean_supported(dropout, cpu)
    flash = _random_model("qwen2")
    flash.config._attn_implementation = "flash_attention_2"
    assert not forward.lean_supported(flash, cpu)
    window = _random_model("qwen2")
    window.config.use_sliding_window = True
    assert not forward.lean_supported(window, cpu)
    lora = get_peft_model(_random_model("qwen2"), LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    assert not forward.lean_supported(lora, cpu)


def test_rows_per_sequence() -> None:
    """The largest divisor of the group size whose completions fit PACK_TOKENS (hand-worked)."""
    assert forward.PACK_TOKENS == 128
    assert forward.rows_per_sequence(8, 5) == 8  # 40 tokens
    assert forward.rows_per_sequence(8, 31) == 4  # 124
    assert forward.rows_per_sequence(8, 127) == 1
    assert forward.rows_per_sequence(6, 40) == 3  # 120 (4 does not divide 6)
    assert forward.rows_per_sequence(1, 500) == 1


def test_packing_part_of_a_group_matches_hf(monkeypatch) -> None:
    """Two completions per packed sequence (a group of 4 split in two): still HF's logprobs."""
    model = _random_model("qwen2").eval()
    p_ids, p_mask, c_ids, c_mask = batch(4)
    monkeypatch.setattr(forward, "PACK_TOKENS", 2 * (int(c_mask.sum(1).max()) - 1))
    assert forward.rows_per_sequence(4, int(c_mask.sum(1).max()) - 1) == 2
    with torch.no_grad():
        lean = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, 4), c_ids)
        _hf_only(monkeypatch)
        hf = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, 4), c_ids)
    assert torch.isfinite(lean).all()
    torch.testing.assert_close(lean * c_mask, hf * c_mask, rtol=1e-5, atol=1e-5)


def test_rope_is_transformers_rotary_bit_for_bit() -> None:
    """fast_decode.rope (sign in the table, halves swapped by a roll) equals apply_rotary_pos_emb exactly."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    from backend.rollout.fast_decode import rope, rope_tables

    torch.manual_seed(0)
    q, k = torch.randn(3, 4, 7, 16), torch.randn(3, 2, 7, 16)
    cos, sin = torch.randn(3, 7, 16), torch.randn(3, 7, 16)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    cos, sin = rope_tables(cos, sin)
    assert torch.equal(rope(q, cos[:, None], sin[:, None]), q_ref)
    assert torch.equal(rope(k, cos[:, None], sin[:, None]), k_ref)


@pytest.mark.parametrize("lean", [True, False])
def test_gradient_checkpointing_keeps_the_numbers_and_saves_less(lean: bool, monkeypatch) -> None:
    """model.gradient_checkpointing on either path (the lean pass's own, the transformers forward's): the same
    logprobs and gradients as without, and the autograd graph keeps fewer bytes of activations."""
    model = _random_model("qwen2").train()
    p_ids, p_mask, c_ids, c_mask = batch(4)
    if not lean:
        _hf_only(monkeypatch)

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        model.zero_grad()
        saved = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logps = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, 4), c_ids)
        (logps * c_mask).sum().backward()
        return logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, saved[0]

    plain, g_plain, kept_plain = run()
    model.gradient_checkpointing_enable()
    assert forward.lean_supported(model, torch.device("cpu")) == lean
    ckpt, g_ckpt, kept_ckpt = run()
    torch.testing.assert_close(ckpt * c_mask, plain * c_mask, rtol=1e-5, atol=1e-5)
    for name in g_plain:
        torch.testing.assert_close(g_ckpt[name], g_plain[name], rtol=1e-4, atol=1e-6)
    assert kept_ckpt < 0.7 * kept_plain, (kept_ckpt, kept_plain)
