"""backend.rollout.decode_attention: the C decode-attention kernel equals torch's SDPA up to float32 rounding, the
engine's lean decode really runs through it, and everything it does not take (or a host that cannot build it,
backend.native) runs SDPA itself."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend import native
from backend.rollout import decode_attention as da
from backend.rollout.base import PromptInput, SamplingParams
from backend.rollout.hf import HFEngine

ROOT = Path(__file__).resolve().parent.parent
needs_kernel = pytest.mark.skipif(not da.available(), reason="no C compiler here: the kernel cannot be built")


def _operands(B: int, H: int, G: int, D: int, W: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, 1, D, generator=g)
    keys, values = torch.randn(B, G, W, D, generator=g), torch.randn(B, G, W, D, generator=g)
    attend = torch.ones(B, W + 3, dtype=torch.bool)  # a table wider than the cache is read up to `end`
    attend[0, :5] = False  # left padding of different lengths
    attend[1::3, :2] = False
    attend[B - 1, 1] = False
    return q, keys, values, attend


def _sdpa(q, keys, values, attend, end, scale):  # noqa: ANN001, ANN202
    B, H, _, D = q.shape
    o = F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end], attn_mask=attend[:, None, None, :end],
                                       scale=scale, enable_gqa=H != keys.shape[1])
    return o.transpose(1, 2).reshape(B, 1, H * D)


@needs_kernel
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 64), (8, 2, 32), (6, 3, 80)])
@pytest.mark.parametrize("end", [6, 17, 40])
def test_kernel_matches_sdpa(heads: int, kv_heads: int, dim: int, end: int) -> None:
    q, keys, values, attend = _operands(5, heads, kv_heads, dim, 40)
    assert da.uses_kernel(q, keys, values, attend)
    got = da.attention(q, keys, values, attend, end, 0.125)
    ref = _sdpa(q, keys, values, attend, end, 0.125)
    assert got.shape == ref.shape == (5, 1, heads * dim)
    assert float((got - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


@needs_kernel
def test_kernel_reads_only_attended_positions_below_end() -> None:
    q, keys, values, attend = _operands(3, 4, 4, 16, 20)
    ref = da.attention(q, keys, values, attend, 12, 0.25)
    keys[:, :, 12:], values[:, :, 12:] = float("nan"), float("nan")  # past end
    keys[0, :, :5], values[0, :, :5] = 1e30, 1e30  # row 0's padding
    assert torch.equal(da.attention(q, keys, values, attend, 12, 0.25), ref)
    attend[0, 7] = False  # masking one more position changes exactly that row
    changed = da.attention(q, keys, values, attend, 12, 0.25)
    assert not torch.equal(changed[0], ref[0]) and torch.equal(changed[1:], ref[1:])


@needs_kernel
def test_threads_give_the_same_numbers() -> None:
    q, keys, values, attend = _operands(7, 4, 2, 32, 30)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = da.attention(q, keys, values, attend, 30, 0.2)
        torch.set_num_threads(2)
        two = da.attention(q, keys, values, attend, 30, 0.2)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_what_it_does_not_take_runs_sdpa_bit_for_bit() -> None:
    q, keys, values, attend = _operands(3, 4, 2, 16, 12)
    cases = [(q.double(), keys.double(), values.double(), attend),  # another dtype
             (q, keys[:, :, ::2].contiguous().transpose(2, 3).contiguous().transpose(2, 3), values, attend)]  # strided keys
    for args in cases:
        assert not da.uses_kernel(*args)
        assert torch.equal(da.attention(*args, 6, 0.3), _sdpa(*args, 6, 0.3))
    assert not da.uses_kernel(q[:2], keys, values, attend)  # rows that do not match: never handed to the kernel
    assert not da.uses_kernel(q[..., :8], keys, values, attend)
    with pytest.raises(RuntimeError):
        da.attention(q[..., :8], keys, values, attend, 6, 0.3)
    grad_q = q.clone().requires_grad_()
    assert not da.uses_kernel(grad_q, keys, values, attend)  # autograd: the kernel has no backward
    before = da.set_enabled(False)
    try:
        assert not da.uses_kernel(q, keys, values, attend)
        assert torch.equal(da.attention(q, keys, values, attend, 9, 0.3), _sdpa(q, keys, values, attend, 9, 0.3))
    finally:
        da.set_enabled(before)


def test_end_beyond_the_cache_is_refused() -> None:
    q, keys, values, attend = _operands(2, 4, 4, 16, 10)
    for end in (0, 11):
        with pytest.raises(ValueError, match="cache"):
            da.attention(q, keys, values, attend, end, 0.25)


@needs_kernel
def test_engine_decodes_through_the_kernel_with_the_same_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hf engine's lean decode calls the kernel once per layer and step, and samples what SDPA samples."""
    tok = AutoTokenizer.from_pretrained(ROOT / "assets/tiny-add")
    model = AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-add", dtype=torch.float32)
    engine = HFEngine(model, tok)
    ps = [PromptInput(tok(t, add_special_tokens=False)["input_ids"]) for t in ("23+45=", "7+18=", "99+99=")]
    sp = SamplingParams(n=4, max_tokens=6, temperature=1.0, seed=7)
    kernel, calls = da._kernel(), []
    monkeypatch.setattr(da, "_kernel", lambda: lambda *a: calls.append(a) or kernel(*a))
    fast = engine.generate(ps, sp)
    steps = max(len(c.token_ids) for g in fast for c in g) - 1  # the first token comes from the prefill
    assert len(calls) == steps * model.config.num_hidden_layers
    before = da.set_enabled(False)
    try:
        ref = engine.generate(ps, sp)
    finally:
        da.set_enabled(before)
    assert [[c.token_ids for c in g] for g in fast] == [[c.token_ids for c in g] for g in ref]
    for g_fast, g_ref in zip(fast, ref):
        for a, b in zip(g_fast, g_ref):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


# ---------------------------------------------------------------------------------------------- backend.native


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler here")
def test_native_builds_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_STUDIO_CACHE", str(tmp_path))
    source = native.SOURCES / "decode_attention.c"
    lib = native._build(source, native.compiler(), native.FLAGS)
    assert lib.parent == tmp_path / "native" and lib.exists()
    # a second build with the same key reuses the library: a compiler that would fail is never run
    monkeypatch.setattr(native.subprocess, "run", _fail_compiles(native.subprocess.run))
    assert native._build(source, native.compiler(), native.FLAGS) == lib
    assert [p.name for p in lib.parent.iterdir()] == [lib.name]  # no temporary files left


def _fail_compiles(run):  # noqa: ANN001, ANN202
    def fake(cmd, *a, **k):  # noqa: ANN001, ANN202
        if "--version" in cmd:
            return run(cmd, *a, **k)
        raise AssertionError("compiled again")
    return fake


def test_native_without_a_working_compiler_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("GRPO_STUDIO_CACHE", str(tmp_path))
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo broken-cc 1.0 && exit 0\necho 'no such header' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with caplog.at_level(logging.WARNING, logger="backend.native"):
        assert native.load.__wrapped__("decode_attention") is None
    assert "no such header" in caplog.text
    assert [p for p in (tmp_path / "native").iterdir()] == []  # the failed build left nothing behind
    monkeypatch.setenv("CC", str(tmp_path / "missing-cc"))
    assert native.load.__wrapped__("decode_attention") is None
    monkeypatch.setenv("GRPO_STUDIO_NATIVE", "0")
    monkeypatch.delenv("CC")
    assert native.load.__wrapped__("decode_attention") is None
