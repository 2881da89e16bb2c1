"""backend.gemm: large float32 products through oneDNN equal torch's up to float32 rounding, small ones and
everything it does not take are torch's own bit for bit, and the lean training pass really runs through it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from backend import gemm
from backend.rollout.tape import ReplayLinear
from backend.train.forward import packed_completion_logits

ROOT = Path(__file__).resolve().parent.parent
needs_onednn = pytest.mark.skipif(not gemm.available(), reason="this torch build has no oneDNN linear")


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    """Equal up to float32 rounding: within `rel` of the reference's largest entry (1e-5 for one product; a whole
    model's logits and gradients compound it over the layers, as the engine-vs-forward tests allow 1e-4)."""
    assert a.shape == b.shape
    err, scale = float((a - b).abs().max()), float(b.abs().max())
    assert err <= rel * scale, (err, scale)


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_linear_forward_and_backward_match_torch(bias: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 200, 96, requires_grad=True)  # 800 rows: oneDNN's path
    w = torch.randn(48, 96, requires_grad=True)
    b = torch.randn(48, requires_grad=True) if bias else None
    assert gemm.uses_onednn(800, 96, 48, x, w, b)
    g = torch.randn(4, 200, 48)
    y = gemm.linear(x, w, b)
    grads = torch.autograd.grad(y, [x, w] + ([b] if bias else []), g)
    y_ref = F.linear(x, w, b)
    grads_ref = torch.autograd.grad(y_ref, [x, w] + ([b] if bias else []), g)
    _close(y, y_ref)
    for got, ref in zip(grads, grads_ref):
        _close(got, ref)


@needs_onednn
def test_mm_reads_strided_operands() -> None:
    torch.manual_seed(0)
    a = torch.randn(64, 900).t()  # (900, 64), transposed view
    b = torch.randn(32, 64).t()  # (64, 32), transposed view
    assert gemm.uses_onednn(900, 64, 32, a, b)
    _close(gemm.mm(a, b), a.contiguous() @ b.contiguous())


def test_what_it_does_not_take_is_torch_bit_for_bit() -> None:
    torch.manual_seed(0)
    small = torch.randn(16, 64)
    w, b = torch.randn(32, 64), torch.randn(32)
    assert not gemm.uses_onednn(16, 64, 32, small, w)  # few rows, few multiply-adds: decoding a small model
    assert gemm.uses_onednn(32, 512, 1536, torch.randn(32, 512), torch.randn(1536, 512))  # a larger model's
    assert torch.equal(gemm.linear(small, w, b), F.linear(small, w, b))
    big = torch.randn(600, 64)
    assert not gemm.uses_onednn(600, 64, 32, big.double(), w.double())  # not float32
    assert torch.equal(gemm.linear(big.double(), w.double()), F.linear(big.double(), w.double()))
    assert not gemm.uses_onednn(64, 5000, 64, big, w)  # a long reduction (a weight gradient)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not gemm.uses_onednn(600, 64, 32, big, w)
    before = gemm.set_enabled(False)
    try:
        assert not gemm.uses_onednn(600, 64, 32, big, w)
        assert torch.equal(gemm.linear(big, w, b), F.linear(big, w, b))
        assert torch.equal(gemm.mm(big, w.t()), big @ w.t())
    finally:
        gemm.set_enabled(before)


def _count_onednn(monkeypatch) -> list[tuple[int, ...]]:
    calls: list[tuple[int, ...]] = []
    real = gemm._onednn_linear

    def spy(x, weight, bias):  # noqa: ANN001, ANN202
        calls.append((x.shape[0], x.shape[1], weight.shape[0]))
        return real(x, weight, bias)

    monkeypatch.setattr(gemm, "_onednn_linear", spy)
    return calls


@needs_onednn
def test_lean_training_pass_runs_through_onednn(monkeypatch) -> None:
    """A packed training pass of over MIN_ROWS tokens takes oneDNN for its layers' products and their input
    gradients, and its logprobs and gradients equal the same pass with the path off, up to rounding."""
    model = AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-add", dtype=torch.float32)
    torch.manual_seed(0)
    B, Lp, Lc = 48, 8, 16  # 6 prompts x 8 completions: 6 packed sequences of 8 + 8 x 15 tokens = 768 rows
    p_ids = torch.randint(2, 100, (B // 8, Lp)).repeat_interleave(8, 0)
    c_ids = torch.randint(2, 100, (B, Lc))
    p_mask, c_mask = torch.ones_like(p_ids), torch.ones_like(c_ids)

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        logits = packed_completion_logits(model, p_ids, p_mask, c_ids, c_mask, group_size=8)
        logits.float().logsumexp(-1).sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    calls = _count_onednn(monkeypatch)
    logits, grads = run()
    layers = len(model.model.layers)
    forward = [c for c in calls if c[0] >= gemm.MIN_ROWS and c[1] in (256, 512) and c[2] in (256, 512)]
    assert len(forward) >= 2 * 7 * layers  # 7 products a layer, forward and input gradient
    before = gemm.set_enabled(False)
    try:
        calls.clear()
        ref_logits, ref_grads = run()
        assert not calls
    finally:
        gemm.set_enabled(before)
    _close(logits, ref_logits, 1e-4)
    for name in ref_grads:
        _close(grads[name], ref_grads[name], 1e-4)


@needs_onednn
def test_tape_replay_backward_runs_through_onednn(monkeypatch) -> None:
    """ReplayLinear's backward is the linear's, its input gradient through oneDNN for many rows."""
    torch.manual_seed(0)
    x = torch.randn(700, 32, requires_grad=True)
    w = torch.randn(24, 32, requires_grad=True)
    b = torch.randn(24, requires_grad=True)
    y = F.linear(x, w, b).detach()
    g = torch.randn(700, 24)
    calls = _count_onednn(monkeypatch)
    got = torch.autograd.grad(ReplayLinear.apply(x, w, b, y), [x, w, b], g)
    assert calls == [(700, 24, 32)]  # dY W; dY^T X (a 700-long reduction into 24 rows) stays with torch
    ref = torch.autograd.grad(F.linear(x, w, b), [x, w, b], g)
    for a, r in zip(got, ref):
        _close(a, r)


@pytest.mark.parametrize("rows", [16, 700])
def test_linear_into_writes_linears_numbers(rows: int) -> None:
    """The tape's recorder writes exactly `linear`'s numbers (generate_taped samples what generate samples)."""
    torch.manual_seed(0)
    x, w, b = torch.randn(rows, 64), torch.randn(48, 64), torch.randn(48)
    assert gemm.uses_onednn(rows, 64, 48, x, w, b) == (rows >= gemm.MIN_ROWS and gemm.available())
    for bias in (b, None):
        out = torch.empty(rows + 3, 48)
        gemm.linear_into(out[2:2 + rows], x, w, bias)
        assert torch.equal(out[2:2 + rows], gemm.linear(x, w, bias))
