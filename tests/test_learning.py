"""GRPO learns: from the shipped model, a fixed-seed run of the tiny-cpu preset improves reward and accuracy.

Margins come from seeds 0-3 (100 steps) of the earlier preset (8 prompts, constant lr 1e-4, exact + digit reward):
held-out greedy accuracy went from 0.446 to 0.550-0.564 (+10 to +12 points) and the training reward's last-10-step
mean beat its first-10 mean by 0.15-0.24. The test asks for about half of that; the current preset (16 prompts,
lr 2e-4 cosine over the 100 steps, exact-match reward) passes it at seed 0.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.data import load_rows
from backend.eval.greedy import greedy_eval
from backend.rewards.scorer import RewardScorer
from backend.rollout.hf import HFEngine
from backend.rundir import create_run, read_jsonl
from backend.spec import load_spec
from backend.train.loop import GRPOTrainer

ROOT = Path(__file__).resolve().parent.parent


def accuracy(model, tok, spec) -> float:
    rows = load_rows(spec.data.eval_sources, spec.data, 0, ROOT)
    res = greedy_eval(HFEngine(model, tok), tok, rows, spec.data, RewardScorer(spec.rewards), 6)
    return res["eval/rewards/exact_match/mean"]


def test_tiny_preset_learns(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "presets/tiny-cpu.yaml", [
        f"output.runs_dir={tmp_path}", "algorithm.max_steps=100", "algorithm.seed=0", "output.eval_steps=0",
        "output.log_samples_steps=0", "output.save_steps=0"])
    tok = AutoTokenizer.from_pretrained(ROOT / "assets/tiny-add")
    before = accuracy(AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-add", dtype=torch.float32), tok, spec)
    run = create_run(spec, ROOT)
    trainer = GRPOTrainer(spec, run, ROOT).setup()
    trainer.train()
    after = accuracy(trainer.policy, tok, spec)
    rewards = [r["reward"] for r in read_jsonl(run.metrics_path)[0]]
    assert len(rewards) == 100
    assert after >= before + 0.06, (before, after)
    assert sum(rewards[-10:]) / 10 >= sum(rewards[:10]) / 10 + 0.08, rewards
