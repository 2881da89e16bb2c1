"""Rewards to advantages under advantage_estimator and multi_objective_aggregation: by hand, and against TRL.

The estimators follow ms-swift (swift/rl_core/advantage.py): rloo is the leave-one-out baseline, reinforce_plus_plus
whitens the group-mean-subtracted advantages over the batch. normalize_then_sum is TRL 1.16's GDPO path.
tests/data/trl_objectives.json holds what TRL's own source returned (tests/data/record_trl_objectives.py cuts the
block out of GRPOTrainer and RLOOTrainer and runs it); here the same rewards go through grpo.advantages.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from backend.spec import AlgorithmSection
from backend.train import grpo

DATA = json.loads((Path(__file__).parent / "data" / "trl_objectives.json").read_text())
REWARDS = [1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0]
S_1234 = math.sqrt(5 / 3)  # unbiased std of 1, 2, 3, 4


def _id(case: dict) -> str:
    return "-".join(str(case[k]) for k in ("trainer", "multi_objective_aggregation", "scale_rewards") if k in case)


@pytest.mark.parametrize("case", DATA["advantage_cases"], ids=_id)
def test_advantages_equal_trl(case: dict) -> None:
    if case["trainer"] == "rloo":  # TRL's RLOOTrainer: the leave-one-out baseline, unscaled
        a = AlgorithmSection(advantage_estimator="rloo", scale_rewards="none")
    else:
        a = AlgorithmSection(multi_objective_aggregation=case["multi_objective_aggregation"],
                             scale_rewards=case["scale_rewards"])
    per_fn = torch.tensor(case["rewards"], dtype=torch.float64)
    got = grpo.advantages(a, per_fn, torch.tensor(DATA["advantage_weights"], dtype=torch.float64),
                          DATA["advantage_group_size"])
    # TRL's nanstd rounds Bessel's correction n / (n - 1) to float32 (an int tensor divided): 1.5e-8 relative
    assert got.advantages.tolist() == pytest.approx(case["advantages"], rel=1e-7, abs=1e-12)
    assert got.rewards.tolist() == pytest.approx(grpo.combine_rewards(per_fn, torch.tensor(DATA["advantage_weights"],
                                                                                           dtype=torch.float64)).tolist())


def test_recorded_advantage_cases_cover_both_aggregations_and_an_unscored_row() -> None:
    cases = DATA["advantage_cases"]
    assert {(c.get("multi_objective_aggregation"), c.get("scale_rewards")) for c in cases if c["trainer"] == "grpo"} \
        == {(m, s) for m in ("sum_then_normalize", "normalize_then_sum") for s in ("group", "batch", "none")}
    assert any(c["trainer"] == "rloo" for c in cases)
    assert any(all(math.isnan(x) for x in row) for c in cases for row in c["rewards"])
    # the two aggregations differ on the same rewards
    by = {(c.get("multi_objective_aggregation"), c.get("scale_rewards"), json.dumps(c["rewards"])): c["advantages"]
          for c in cases}
    r = json.dumps(cases[0]["rewards"])
    assert by[("sum_then_normalize", "group", r)] != pytest.approx(by[("normalize_then_sum", "group", r)])


def test_rloo_is_reward_minus_the_mean_of_the_others() -> None:
    adv, std = grpo.group_advantages(torch.tensor(REWARDS), 4, "none", estimator="rloo")
    assert adv.tolist() == pytest.approx([1 - 3, 2 - 8 / 3, 3 - 7 / 3, 4 - 2, 0, 0, 0, 0])
    assert std.tolist() == pytest.approx([S_1234, 0.0], rel=1e-6)
    adv, _ = grpo.group_advantages(torch.tensor(REWARDS), 4, "group", estimator="rloo")
    assert adv[:4].tolist() == pytest.approx([x / (S_1234 + 1e-4) for x in (-2, -2 / 3, 2 / 3, 2)], rel=1e-5)
    mean = sum(REWARDS) / 8
    bstd = math.sqrt(sum((r - mean) ** 2 for r in REWARDS) / 7)  # ms-swift: the rewards' batch std, as grpo
    adv, _ = grpo.group_advantages(torch.tensor(REWARDS), 4, "batch", estimator="rloo")
    assert adv[:4].tolist() == pytest.approx([x / (bstd + 1e-4) for x in (-2, -2 / 3, 2 / 3, 2)], rel=1e-5)


def test_reinforce_plus_plus_whitens_the_advantages_over_the_batch() -> None:
    """r - group mean = -1.5, -0.5, 0.5, 1.5, 0 x 4: batch std sqrt(5 / 7) of these, not of the rewards."""
    adv, _ = grpo.group_advantages(torch.tensor(REWARDS), 4, "batch", estimator="reinforce_plus_plus")
    centred = [-1.5, -0.5, 0.5, 1.5, 0, 0, 0, 0]
    assert adv.tolist() == pytest.approx([x / (math.sqrt(5 / 7) + 1e-4) for x in centred], rel=1e-5)
    grpo_batch, _ = grpo.group_advantages(torch.tensor(REWARDS), 4, "batch")
    assert adv.tolist() != pytest.approx(grpo_batch.tolist())
    # group and none: the group-mean-subtracted advantages by the group std, or as they are (grpo's values)
    for scale in ("group", "none"):
        rpp, _ = grpo.group_advantages(torch.tensor(REWARDS), 4, scale, estimator="reinforce_plus_plus")
        plain, _ = grpo.group_advantages(torch.tensor(REWARDS), 4, scale)
        assert rpp.tolist() == pytest.approx(plain.tolist(), rel=1e-6)


def test_normalize_then_sum_by_hand() -> None:
    """2 functions, weights 1 and 2, groups of 2. Function 0 in each group: 1, 0 -> +-0.5 / (sqrt(0.5) + 1e-4) = +-a;
    function 1: 0, 0 -> 0, 0, then 2, 4 -> -+1 / (sqrt(2) + 1e-4) = -+b. Sums a, -a, a - 2b, 2b - a (mean 0),
    then over the batch / (their unbiased std + 1e-4)."""
    per_fn = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 2.0], [0.0, 4.0]], dtype=torch.float64)
    a_ = 0.5 / (math.sqrt(0.5) + 1e-4)
    b_ = 1.0 / (math.sqrt(2.0) + 1e-4)
    s = [a_, -a_, a_ - 2 * b_, 2 * b_ - a_]
    std = math.sqrt(sum(x * x for x in s) / 3)
    got = grpo.decoupled_advantages(per_fn, torch.tensor([1.0, 2.0], dtype=torch.float64), 2)
    assert got.tolist() == pytest.approx([x / (std + 1e-4) for x in s], rel=1e-9)
    out = grpo.advantages(AlgorithmSection(multi_objective_aggregation="normalize_then_sum"), per_fn,
                          torch.tensor([1.0, 2.0], dtype=torch.float64), 2)
    assert out.advantages.tolist() == got.tolist()
    assert out.rewards.tolist() == [1.0, 0.0, 5.0, 8.0]  # reported: the weighted sum, as with sum_then_normalize
    assert out.group_std.tolist() == pytest.approx([math.sqrt(0.5), math.sqrt(4.5)])


def test_unscored_completion_gets_no_advantage_under_normalize_then_sum() -> None:
    per_fn = torch.tensor([[1.0, 0.5], [0.0, float("nan")], [float("nan"), float("nan")], [1.0, 1.0]],
                          dtype=torch.float64)
    got = grpo.decoupled_advantages(per_fn, torch.tensor([1.0, 1.0], dtype=torch.float64), 2)
    assert got[2].item() == 0.0 and torch.isfinite(got).all()


def test_estimator_and_calibration_refuse_each_other_in_the_math() -> None:
    with pytest.raises(ValueError, match="grpo estimator"):
        grpo.group_advantages(torch.tensor(REWARDS), 4, "group", virtual_reward=1.0, estimator="rloo")
    with pytest.raises(ValueError, match="unknown advantage_estimator"):
        grpo.group_advantages(torch.tensor(REWARDS), 4, "group", estimator="ppo")
