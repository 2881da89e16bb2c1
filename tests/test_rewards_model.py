"""The reward-model reward kind, on the shipped tiny sequence-classification model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend.rewards.registry import BUILTIN_REWARDS
from backend.rewards.scorer import RewardError, RewardScorer
from backend.spec import RewardFunction, RewardsSection

ROOT = Path(__file__).resolve().parents[1]
TINY_RM = ROOT / "assets" / "tiny-reward"


def test_tiny_reward_model_asset_is_small() -> None:
    assert (TINY_RM / "config.json").is_file() and (TINY_RM / "tokenizer.json").is_file()
    assert sum(p.stat().st_size for p in TINY_RM.iterdir()) < 2_000_000


def test_reward_model_scores_in_batches_on_the_device() -> None:
    rewards = RewardsSection(functions=[
        RewardFunction(name="reward_model", weight=0.5, params={"path": "assets/tiny-reward", "batch_size": 2}),
        RewardFunction(name="reward_model", params={"path": str(TINY_RM), "batch_size": 64, "max_length": 64}),
    ])
    prompts = ["35+50=", "12+34=", "99+99=", "10+10=", "47+38="]
    completions = ["58", "abc", "", "1234567", "58"]
    with RewardScorer(rewards, base_dir=ROOT, device="cpu") as scorer:
        assert scorer.where == ["trainer", "trainer"]  # on the trainer's device
        m = scorer.score(prompts, completions, [{"prompt": p} for p in prompts])
    assert m.shape == (5, 2) and np.isfinite(m).all()
    a = m[:, 0]
    assert a[0] > 0 > a[1] and a[4] > 0 > a[2] and a[3] < 0  # the toy preference: a 2-3 digit answer
    # padding must not change a score: batches of 2 against one batch of 5
    np.testing.assert_allclose(a, m[:, 1], atol=1e-4)


def test_reward_model_truncates_long_texts() -> None:
    fn = BUILTIN_REWARDS["reward_model"].make({"path": str(TINY_RM), "max_length": 8})
    out = fn(completions=["58" + "x" * 500, "58"], prompts=["35+50=", "35+50="])
    assert len(out) == 2 and out[1] > 0  # "35+50=58" is 8 tokens: the junk after it is cut off


def test_reward_model_errors() -> None:
    assert "path" in (BUILTIN_REWARDS["reward_model"].check_params({"batch_size": 4}) or "")
    assert "batch_size" in (BUILTIN_REWARDS["reward_model"].check_params({"path": "x", "batch_size": 0}) or "")
    with pytest.raises(RewardError, match="reward model directory not found"):
        RewardScorer(RewardsSection(functions=[RewardFunction(name="reward_model",
                                                              params={"path": "assets/absent-rm"})]), ROOT)
