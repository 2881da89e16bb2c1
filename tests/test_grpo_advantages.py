"""Rewards to advantages under advantage_estimator and multi_objective_aggregation: by hand, and against TRL.

The estimators follow ms-swift (swift/rl_core/advantage.py): rloo is the leave-one-out baseline, reinforce_plus_plus
whitens the group-mean-subtracted advantages over the batch; kl_in_reward charges the rewards the KL as its
compute_advantages does (checked against that function written out below). normalize_then_sum is TRL 1.16's GDPO
path. A completion no function scored follows TRL 1.16 everywhere (left out of the statistics, advantage 0).
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


def _unscored_rows(case: dict) -> int:
    return sum(all(math.isnan(x) for x in row) for row in case["rewards"])


def test_recorded_advantage_cases_cover_both_aggregations_and_an_unscored_row() -> None:
    cases = DATA["advantage_cases"]
    assert {(c.get("multi_objective_aggregation"), c.get("scale_rewards")) for c in cases if c["trainer"] == "grpo"} \
        == {(m, s) for m in ("sum_then_normalize", "normalize_then_sum") for s in ("group", "batch", "none")}
    # every path meets completions no function scored, and a group with a single scored one (no std, no baseline)
    for key in {(c["trainer"], c.get("multi_objective_aggregation"), c.get("scale_rewards")) for c in cases}:
        counts = {_unscored_rows(c) for c in cases if (c["trainer"], c.get("multi_objective_aggregation"),
                                                        c.get("scale_rewards")) == key}
        assert counts == {0, 1, 4}, key
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


NAN = float("nan")


def test_unscored_completion_is_left_out_of_the_group_statistics() -> None:
    """TRL 1.16: group 1, 3, NaN, 5 has mean 3 and std 2 over its three scored completions; the unscored one gets 0
    (counted as reward 0 it would pull the mean to 2.25). Group 7, NaN, NaN, NaN: one scored, no std: all 0."""
    per_fn = torch.tensor([[1.0], [3.0], [NAN], [5.0], [7.0], [NAN], [NAN], [NAN]], dtype=torch.float64)
    one = torch.ones(1, dtype=torch.float64)
    out = grpo.advantages(AlgorithmSection(), per_fn, one, 4)
    assert out.advantages.tolist() == pytest.approx([-2 / 2.0001, 0, 0, 2 / 2.0001, 0, 0, 0, 0], rel=1e-9)
    assert out.rewards.tolist() == [1.0, 3.0, 0.0, 5.0, 7.0, 0.0, 0.0, 0.0]  # reported as scored: None counts 0
    none = grpo.advantages(AlgorithmSection(scale_rewards="none"), per_fn, one, 4)
    assert none.advantages.tolist() == [-2.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]
    # batch: the std of the four scored rewards 1, 3, 5, 7 (sqrt(20 / 3)), each less its own group's mean
    batch = grpo.advantages(AlgorithmSection(scale_rewards="batch"), per_fn, one, 4)
    assert batch.advantages.tolist() == pytest.approx([x / (math.sqrt(20 / 3) + 1e-4) for x in (-2, 0, 0, 2, 0, 0, 0,
                                                                                                0)], rel=1e-9)
    # rloo: the mean of the other scored completions, 1 - 4, 3 - 3, 5 - 2; one scored in the group: 0 / 0 -> 0
    rloo = grpo.advantages(AlgorithmSection(advantage_estimator="rloo", scale_rewards="none"), per_fn, one, 4)
    assert rloo.advantages.tolist() == pytest.approx([-3.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0])
    # reinforce_plus_plus batch: the std of the scored advantages -2, 0, 2, 0 (sqrt(8 / 3))
    rpp = grpo.advantages(AlgorithmSection(advantage_estimator="reinforce_plus_plus", scale_rewards="batch"), per_fn,
                          one, 4)
    assert rpp.advantages.tolist() == pytest.approx([x / (math.sqrt(8 / 3) + 1e-4) for x in (-2, 0, 0, 2, 0, 0, 0,
                                                                                             0)], rel=1e-9)


def test_a_none_among_scores_is_still_zero_in_the_sum() -> None:
    """Only a completion no function scored is left out: one None among scores counts 0 in the sum (nansum)."""
    per_fn = torch.tensor([[1.0, NAN], [0.0, 1.0]], dtype=torch.float64)
    out = grpo.advantages(AlgorithmSection(scale_rewards="none"), per_fn, torch.ones(2, dtype=torch.float64), 2)
    assert out.advantages.tolist() == [0.0, 0.0]


def _swift_compute_advantages(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, K: int, estimator: str,
                              scale_rewards: str, beta: float, kl_values: torch.Tensor) -> torch.Tensor:
    """ms-swift's compute_advantages (swift/rl_core/advantage.py) with kl_in_reward on, written out from its source
    (the gdpo branch left out): the KL charged to the weighted reward, then the estimator's baseline and std."""
    rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards = rewards - beta * kl_values
    grouped = rewards.view(-1, K)
    group_mean = grouped.mean(dim=1).repeat_interleave(K)
    if estimator == "rloo" and K > 1:
        advantages = rewards * K / (K - 1) - group_mean * K / (K - 1)
    else:
        advantages = rewards - group_mean
    std = None
    if estimator == "reinforce_plus_plus":
        if scale_rewards == "batch":
            std = advantages.std().expand_as(advantages)
        elif scale_rewards == "group":
            std = advantages.view(-1, K).std(dim=1).repeat_interleave(K)
    elif scale_rewards == "batch":
        std = rewards.std().expand_as(rewards)
    elif scale_rewards == "group":
        std = grouped.std(dim=1).repeat_interleave(K)
    if std is not None and scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return advantages


def test_kl_in_reward_by_hand() -> None:
    """Rewards 1, 1 | 2, 0 charged beta 0.5 x summed k1 KLs 2, 0 | 1, 1 (sequence_kl of the token log-ratios below):
    0, 1 | 1.5, -0.5. grpo, scale none: -0.5, 0.5 | 1, -1 (without the charge: 0, 0 | 1, -1)."""
    old = torch.tensor([[-1.0, -1.0, -9.0], [-2.0, -2.0, 0.0], [-1.0, -1.0, -1.0], [-0.5, -0.5, 5.0]],
                       dtype=torch.float64)
    ref = torch.tensor([[-2.0, -2.0, 0.0], [-1.0, -3.0, 7.0], [-1.5, -1.5, -1.0], [-1.0, -1.0, NAN]],
                       dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 0]])
    kl = grpo.sequence_kl(old, ref, mask)
    assert kl.tolist() == [2.0, 0.0, 1.0, 1.0]  # summed over the real tokens, not averaged; padding never counts
    per_fn = torch.tensor([[1.0], [1.0], [2.0], [0.0]], dtype=torch.float64)
    a = AlgorithmSection(beta=0.5, kl_in_reward=True, scale_rewards="none")
    out = grpo.advantages(a, per_fn, torch.ones(1, dtype=torch.float64), 2, kl)
    assert out.advantages.tolist() == [-0.5, 0.5, 1.0, -1.0]
    assert out.rewards.tolist() == [0.0, 1.0, 1.5, -0.5]  # ms-swift returns (and logs) the charged rewards
    assert grpo.advantages(a, per_fn, torch.ones(1, dtype=torch.float64), 2).advantages.tolist() == [0, 0, 1, -1]
    # the KL is in the reward, so the loss has none: the objective's beta is 0
    assert grpo.Objective.of(a).beta == 0.0 and grpo.Objective.of(AlgorithmSection(beta=0.5)).beta == 0.5
    # a broken reference pass is not an unscored completion: its advantage is NaN, for the guard to skip the batch
    broken = grpo.advantages(a, per_fn, torch.ones(1, dtype=torch.float64), 2, torch.tensor([1.0, NAN, 0.0, 0.0]))
    assert math.isnan(broken.advantages[1]) and torch.isfinite(broken.advantages[2:]).all()
    with pytest.raises(ValueError, match="sum_then_normalize"):
        grpo.advantages(AlgorithmSection(beta=0.5, kl_in_reward=True, multi_objective_aggregation="normalize_then_sum"),
                        per_fn, torch.ones(1, dtype=torch.float64), 2, kl)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_kl_in_reward_equals_ms_swift(estimator: str, scale: str) -> None:
    g = torch.Generator().manual_seed(7)
    per_fn = torch.stack([(torch.rand(12, generator=g, dtype=torch.float64) > 0.5).double(),
                          torch.rand(12, generator=g, dtype=torch.float64)], dim=1)
    per_fn[3, 1] = NAN  # a None among scores: nansum's 0 in both
    weights = torch.tensor([1.0, 0.5], dtype=torch.float64)
    old = -torch.rand(12, 6, generator=g, dtype=torch.float64) * 2
    ref = old + torch.randn(12, 6, generator=g, dtype=torch.float64) * 0.3
    mask = (torch.arange(6)[None, :] < torch.randint(1, 7, (12, 1), generator=g)).long()
    beta = 0.2
    # ms-swift's per-sequence KL (rlhf_trainers/grpo_trainer.py): (old - ref) x completion_mask, summed
    swift_kl = ((old - ref) * mask).sum(-1)
    assert grpo.sequence_kl(old, ref, mask).tolist() == pytest.approx(swift_kl.tolist(), rel=1e-12)
    a = AlgorithmSection(beta=beta, kl_in_reward=True, advantage_estimator=estimator, scale_rewards=scale)
    got = grpo.advantages(a, per_fn, weights, 4, grpo.sequence_kl(old, ref, mask))
    want = _swift_compute_advantages(per_fn, weights, 4, estimator, scale, beta, swift_kl)
    assert got.advantages.tolist() == pytest.approx(want.tolist(), rel=1e-9, abs=1e-12)


def test_estimator_and_calibration_refuse_each_other_in_the_math() -> None:
    with pytest.raises(ValueError, match="grpo estimator"):
        grpo.group_advantages(torch.tensor(REWARDS), 4, "group", virtual_reward=1.0, estimator="rloo")
    with pytest.raises(ValueError, match="unknown advantage_estimator"):
        grpo.group_advantages(torch.tensor(REWARDS), 4, "group", estimator="ppo")
