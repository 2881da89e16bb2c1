"""The activation tape (backend.rollout.tape): a rollout's recorded linear outputs, replayed by the training pass,
give the logprobs and gradients of the plain pass, and are used only while the weights are the recorded ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.rollout.base import PromptInput, SamplingParams
from backend.rollout.hf import HFEngine, left_pad
from backend.rollout.tape import tape_bytes
from backend.train.forward import TapeRows, completion_logits
from backend.train.grpo import selective_log_softmax
from tests.test_forward import _random_model
from tests.test_trainer import _final_weights, metrics, train

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[6, 7, 77, 8, 9, 85], [14, 77, 15, 85], [7, 7, 77, 9, 85]]  # different lengths: left padding
N = 4


def _model(which: str) -> torch.nn.Module:
    if which == "tiny":
        return AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-add", dtype=torch.float32)
    return _random_model(which.split("-")[0])


def _rollout(model, max_tokens: int = 6):
    tok = AutoTokenizer.from_pretrained(ROOT / "assets/tiny-add")
    engine = HFEngine(model, tok, tape_budget=1 << 30)
    sp = SamplingParams(n=N, max_tokens=max_tokens, temperature=1.0, seed=3)
    groups = engine.generate([PromptInput(p) for p in PROMPTS], sp)
    return engine, sp, groups, engine.take_tape()


def _batch(groups):
    """The trainer's layout: each row its prompt (left padded) and completion (right padded)."""
    p_ids, p_mask = left_pad([p for p in PROMPTS for _ in range(N)], 0)
    comps = [c.token_ids for g in groups for c in g]
    Lc = max(len(c) for c in comps)
    c_ids = torch.zeros((len(comps), Lc), dtype=torch.long)
    c_mask = torch.zeros_like(c_ids)
    for i, c in enumerate(comps):
        c_ids[i, :len(c)], c_mask[i, :len(c)] = torch.tensor(c), 1
    return p_ids, p_mask, c_ids, c_mask


def test_taped_generate_samples_what_generate_samples() -> None:
    model = _model("tiny")
    engine, sp, groups, tape = _rollout(model)
    engine.tape_budget = 0
    plain = engine.generate([PromptInput(p) for p in PROMPTS], sp)
    assert engine.take_tape() is None
    assert [[c.token_ids for c in g] for g in groups] == [[c.token_ids for c in g] for g in plain]
    assert [[c.logprobs for c in g] for g in groups] == [[c.logprobs for c in g] for g in plain]
    assert tape is not None and tape.valid_for(model)
    assert (tape.prompts, tape.width, tape.rows, tape.n) == (3, 6, 3 * N, N)
    assert [tape.row(c) for g in groups for c in g] == list(range(3 * N))
    steps = sp.max_tokens - 1
    assert sum(t.numel() * 4 for t in tape.outputs.values()) == tape_bytes(model, 3, 6, 3 * N, steps)
    # a budget below that size, or autocast: no tape, the same samples
    engine.tape_budget = tape_bytes(model, 3, 6, 3 * N, steps) - 1
    small, none = engine.generate([PromptInput(p) for p in PROMPTS], sp), engine.take_tape()
    assert none is None and [[c.token_ids for c in g] for g in small] == [[c.token_ids for c in g] for g in plain]


@pytest.mark.parametrize("which", ["tiny", "qwen2-gqa", "llama-gqa"])
@pytest.mark.parametrize("rows", ["all", "subset"])
def test_replayed_pass_matches_the_plain_pass(which: str, rows: str) -> None:
    """Logprobs and gradients with the tape replayed equal the plain lean pass's (float32 rounding of the decode's
    products), for whole groups sharing prompts and for a subset of rows in any order; and the replayed pass
    reads the tape (a changed recording changes its logits)."""
    model = _model(which)
    model.train()
    _, _, groups, tape = _rollout(model)
    p_ids, p_mask, c_ids, c_mask = _batch(groups)
    sel = torch.arange(3 * N) if rows == "all" else torch.tensor([9, 1, 2, 6, 11])
    group = N if rows == "all" else None
    p_ids, p_mask, c_ids, c_mask = p_ids[sel], p_mask[sel], c_ids[sel], c_mask[sel]
    taped = TapeRows(tape, sel)

    def pass_(tape_rows):
        model.zero_grad()
        logps = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, group, tape=tape_rows),
                                      c_ids)
        (logps * c_mask * torch.linspace(0.5, 2.0, logps.numel()).view_as(logps)).sum().backward()
        return logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain, g_plain = pass_(None)
    replayed, g_replayed = pass_(taped)
    torch.testing.assert_close(replayed * c_mask, plain * c_mask, rtol=1e-5, atol=1e-4)  # as engine vs forward
    assert g_plain.keys() == g_replayed.keys()
    # the decode's products round differently from one packed product: the trained tiny model's gradients then
    # differ by up to 2e-4 of their norm (an index or mask mistake moves them by order 1)
    for name in g_plain:
        assert (g_replayed[name] - g_plain[name]).norm() <= 1e-3 * g_plain[name].norm(), name
    # the pass reads the tape: recorded logits are the logits, a recorded layer output enters the gradients
    torch.manual_seed(0)
    tape.outputs[model.lm_head] += torch.randn_like(tape.outputs[model.lm_head])
    tape.outputs[model.model.layers[0].mlp.down_proj] += 0.5
    shifted, g_shifted = pass_(taped)
    assert ((shifted - replayed).abs() * c_mask).max() > 1e-2
    name = "model.layers.1.self_attn.q_proj.weight"
    assert not torch.allclose(g_shifted[name], g_replayed[name], rtol=1e-2)


def test_tape_is_valid_only_for_its_model_and_weights() -> None:
    model = _model("tiny")
    _, _, _, tape = _rollout(model)
    assert tape.valid_for(model)
    assert not tape.valid_for(_model("tiny"))  # the same weights in another model object
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # an update, even one that changes no value
    assert not tape.valid_for(model)


def test_one_token_completions_replay_the_prefill() -> None:
    model = _model("tiny")
    model.train()
    _, _, groups, tape = _rollout(model, max_tokens=1)
    p_ids, p_mask, c_ids, c_mask = _batch(groups)
    rows = TapeRows(tape, torch.arange(3 * N))
    with torch.no_grad():
        plain = completion_logits(model, p_ids, p_mask, c_ids, c_mask, N)
        replayed = completion_logits(model, p_ids, p_mask, c_ids, c_mask, N, tape=rows)
    torch.testing.assert_close(replayed, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("extra", [[], ["algorithm.replay_solved=true", "rollout.temperature=1.5", "data.limit=8",
                                        "rewards.functions=[{name: exact_match}]"]], ids=["plain", "success-replay"])
def test_trainer_replays_the_tape_and_trains_as_without(tmp_path: Path, extra: list[str]) -> None:
    """A run with the tape (the default) ends at the weights of a run without it (resources.activation_reuse_mb=0);
    success replay's put-back completions are not on the tape, so those steps replay only part of the rows."""
    on, _ = train(tmp_path / "on", "algorithm.max_steps=6", *extra)
    off, _ = train(tmp_path / "off", "algorithm.max_steps=6", "resources.activation_reuse_mb=0", *extra)
    share = [r.get("activation_reuse/replayed") for r in metrics(on)]
    assert all(s is not None for s in share) and max(share) == 1.0
    assert all("activation_reuse/replayed" not in r for r in metrics(off))
    if extra:
        assert any(r["replay/replayed"] > 0 for r in metrics(on))
        assert any(0 < s < 1 for s in share)
    assert [r["reward"] for r in metrics(on)] == pytest.approx([r["reward"] for r in metrics(off)], abs=1e-6)
    # the same updates up to float32 rounding: Adam's first steps move each weight by about lr x sign(gradient),
    # so an entry whose gradient is only rounding noise (k_proj's bias: softmax ignores a shift of every key)
    # steps either way in either run; compare the whole update
    base = load_file(ROOT / "assets/tiny-add/model.safetensors")
    a, b = _final_weights(on), _final_weights(off)
    assert a.keys() == b.keys()
    gap = torch.cat([(a[k] - b[k]).flatten() for k in a]).norm()
    assert gap <= 0.02 * torch.cat([(b[k] - base[k]).flatten() for k in a]).norm()
