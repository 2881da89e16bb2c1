"""The transformers rollout engine on the shipped tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.rollout.base import PromptInput, SamplingParams
from backend.rollout.fast_decode import set_lean
from backend.rollout.hf import HFEngine, filter_logits, left_pad, positions
from backend.train.grpo import selective_log_softmax

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    tok = AutoTokenizer.from_pretrained(ROOT / "assets/tiny-add")
    model = AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-add", dtype=torch.float32)
    return HFEngine(model, tok)


def prompts(engine: HFEngine, texts: list[str]) -> list[PromptInput]:
    return [PromptInput(engine.tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


def test_groups_shapes_and_finish_reasons(engine: HFEngine) -> None:
    out = engine.generate(prompts(engine, ["12+34=", "9+9=", "10+20="]), SamplingParams(n=4, max_tokens=6, seed=1))
    assert [len(g) for g in out] == [4, 4, 4]
    for group in out:
        for c in group:
            assert len(c.logprobs) == len(c.token_ids)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == engine.tok.eos_token_id
                assert engine.tok.eos_token_id not in c.token_ids[:-1]
            else:
                assert len(c.token_ids) == 6
            assert c.text == engine.tok.decode(c.token_ids, skip_special_tokens=True)


def test_truncation_at_max_tokens(engine: HFEngine) -> None:
    out = engine.generate(prompts(engine, ["12+34="]), SamplingParams(n=3, max_tokens=1, seed=0))
    assert all(c.finish_reason == "length" and len(c.token_ids) == 1 for c in out[0])


def test_seeded_sampling_is_reproducible(engine: HFEngine) -> None:
    sp = SamplingParams(n=8, max_tokens=5, temperature=1.5, seed=123)
    a = engine.generate(prompts(engine, ["23+45=", "71+18="]), sp)
    b = engine.generate(prompts(engine, ["23+45=", "71+18="]), sp)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]


def test_top_k_one_is_greedy_like_hf_generate(engine: HFEngine) -> None:
    texts = ["23+45=", "7+18=", "99+99="]  # different lengths: exercises left padding
    out = engine.generate(prompts(engine, texts), SamplingParams(n=1, max_tokens=5, top_k=1, seed=0))
    enc = engine.tok(texts, return_tensors="pt", padding=True)
    ref = engine.model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=engine.pad_id)
    ref_texts = engine.tok.batch_decode(ref[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert [g[0].text for g in out] == ref_texts


def test_logprobs_match_one_forward_pass(engine: HFEngine) -> None:
    sp = SamplingParams(n=4, max_tokens=5, temperature=0.7, seed=7)
    ps = prompts(engine, ["23+45=", "7+18="])
    out = engine.generate(ps, sp)
    for p, group in zip(ps, out):
        for c in group:
            ids = torch.tensor([p.token_ids + c.token_ids])
            mask = torch.ones_like(ids)
            with torch.no_grad():
                logits = engine.model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
            lp = selective_log_softmax(logits[0, len(p.token_ids) - 1:-1] / sp.temperature, ids[0, len(p.token_ids):])
            assert lp.tolist() == pytest.approx(c.logprobs, abs=1e-4)


def test_filter_logits_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    k = filter_logits(logits, 2, 1.0)
    assert torch.isinf(k[0, 2:]).all() and torch.isfinite(k[0, :2]).all()
    p = filter_logits(logits, 0, 0.8)  # 0.5 + 0.3 reaches 0.8: keep two
    assert torch.isfinite(p[0, :2]).all() and torch.isinf(p[0, 2:]).all()
    p = filter_logits(logits, 0, 0.81)
    assert torch.isfinite(p[0, :3]).all() and torch.isinf(p[0, 3])


def test_left_pad() -> None:
    ids, mask = left_pad([[1, 2, 3], [4]], 0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert positions(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


@pytest.mark.parametrize("sp", [SamplingParams(n=4, max_tokens=6, temperature=1.0, seed=3),
                                SamplingParams(n=1, max_tokens=6, top_k=1, seed=0)])
def test_lean_decode_matches_the_model_forward(engine: HFEngine, sp: SamplingParams) -> None:
    """The lean decode loop (fast_decode.KVDecoder) samples what the model's own forward samples."""
    ps = prompts(engine, ["23+45=", "7+18=", "99+99="])  # different lengths: left padding in the cache
    before = set_lean(False)
    try:
        ref = engine.generate(ps, sp)
    finally:
        set_lean(before)
    lean = engine.generate(ps, sp)
    assert [[c.token_ids for c in g] for g in lean] == [[c.token_ids for c in g] for g in ref]
    for g_lean, g_ref in zip(lean, ref):
        for a, b in zip(g_lean, g_ref):  # float32 rounding: the lean decode's products and attention sum in another order
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_set_lean_turns_the_lean_decode_off(engine: HFEngine, monkeypatch) -> None:
    """fast_decode.set_lean(False), the lean passes' one switch, makes the engine decode with the model's forward."""
    import backend.rollout.hf as hf

    def no_lean(*args, **kwargs):
        raise AssertionError("the lean decode ran")

    monkeypatch.setattr(hf, "KVDecoder", no_lean)
    ps, sp = prompts(engine, ["23+45="]), SamplingParams(n=2, max_tokens=3, seed=0)
    with pytest.raises(AssertionError, match="lean decode ran"):
        engine.generate(ps, sp)
    before = set_lean(False)
    try:
        assert len(engine.generate(ps, sp)[0]) == 2
    finally:
        set_lean(before)


def test_lean_decode_covers_only_plain_llama_family() -> None:
    from transformers import AutoConfig

    from backend.rollout.fast_decode import supports

    cfg = AutoConfig.from_pretrained(ROOT / "assets/tiny-add")
    with torch.device("meta"):
        assert supports(AutoModelForCausalLM.from_config(cfg))
        cfg.use_sliding_window = True
        assert not supports(AutoModelForCausalLM.from_config(cfg))
    assert not supports(torch.nn.Linear(2, 2))


def test_lean_decode_matches_with_grouped_query_attention(engine: HFEngine) -> None:
    """A random Qwen2 with 2 key/value heads for 4 query heads: lean prefill + decode = the model's forward."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=64, eos_token_id=1, pad_token_id=0)
    gqa = HFEngine(Qwen2ForCausalLM(cfg), engine.tok)
    ps = prompts(gqa, ["23+45=", "7+18=", "99+99="])
    sp = SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=5)
    before = set_lean(False)
    try:
        ref = gqa.generate(ps, sp)
    finally:
        set_lean(before)
    lean = gqa.generate(ps, sp)
    assert [[c.token_ids for c in g] for g in lean] == [[c.token_ids for c in g] for g in ref]
    for g_lean, g_ref in zip(lean, ref):
        for a, b in zip(g_lean, g_ref):  # float32 rounding: the lean decode's products and attention sum in another order
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_inverse_cdf_draws_exactly_from_the_distribution() -> None:
    """Each row's draws follow its probabilities (a chi-square bound that a biased sampler fails), zero-probability
    tokens are never drawn, and a group's draws depend on its own generator only."""
    from backend.rollout.hf import inverse_cdf

    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.1, 0.0, 0.0, 0.9]], dtype=torch.float32)
    draws = 40_000
    gens = [torch.Generator().manual_seed(1)]
    counts = torch.zeros_like(probs)
    for _ in range(draws // 100):
        picked, lse = inverse_cdf(probs.log().repeat_interleave(100, 0), gens, 200)
        counts.index_put_((torch.arange(2).repeat_interleave(100), picked), torch.ones(200), accumulate=True)
    assert counts[probs == 0].sum() == 0
    torch.testing.assert_close(lse, torch.zeros(200))  # log of a distribution's total, 1
    expected = probs * draws
    live = probs > 0
    chi2 = float((((counts - expected) ** 2)[live] / expected[live]).sum())
    assert chi2 < 20.5, chi2  # 4 degrees of freedom: p < 0.0005 under the exact distribution
    # a group's tokens do not change when another group's seed or presence changes
    flat = torch.full((3, 1000), 1e-3)
    a = inverse_cdf(flat.log(), [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6), None], 1)[0]
    b = inverse_cdf(flat.log(), [torch.Generator().manual_seed(5), torch.Generator().manual_seed(7), None], 1)[0]
    assert a[0] == b[0] and inverse_cdf(flat[:1].log(), [torch.Generator().manual_seed(5)], 1)[0][0] == a[0]
