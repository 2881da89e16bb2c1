"""The loss pass leaves all-zero-advantage groups out only where that changes nothing: same step, less work."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from backend.rundir import create_run
from backend.spec import AlgorithmSection, load_spec
from backend.train.batch import live_groups
from backend.train.loop import GRPOTrainer

ROOT = Path(__file__).resolve().parent.parent


def test_live_groups_keeps_whole_groups_with_signal() -> None:
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 0.5, 0.0])  # groups of 2: dead, live, dead, live
    assert live_groups(adv, slice(0, 8), 2).tolist() == [2, 3, 6, 7]
    assert live_groups(adv, slice(4, 8), 2).tolist() == [6, 7]
    assert live_groups(adv, slice(2, 4), 2) == slice(2, 4)  # all live: the slice itself, no gather
    assert live_groups(adv, slice(0, 2), 2) is None


def test_only_exact_cases_skip() -> None:
    def algo(**kw: object) -> AlgorithmSection:
        return AlgorithmSection(**kw)

    assert algo().zero_advantage_skippable and algo(loss_type="dapo").zero_advantage_skippable
    assert not algo(beta=0.04).zero_advantage_skippable  # the KL term has a gradient at zero advantage
    assert not algo(loss_type="bnpo").zero_advantage_skippable  # normalised by the micro-batch's own token count
    assert not algo(entropy_coef=0.01).zero_advantage_skippable  # the entropy bonus acts on every row
    assert not algo(top_entropy_quantile=0.2).zero_advantage_skippable  # the quantile is over all tokens
    assert not algo(importance_sampling_level="sequence").zero_advantage_skippable


def _trainer(tmp_path: Path, *overrides: str) -> GRPOTrainer:
    spec = load_spec(ROOT / "presets/tiny-cpu.yaml", [
        f"output.runs_dir={tmp_path}", "algorithm.prompts_per_step=4", "rollout.num_generations=4",
        "output.eval_steps=0", "output.save_steps=0", "rewards.functions=[{name: exact_match}, {name: digit_match}]",
        "algorithm.lr_scheduler=constant", *overrides])
    return GRPOTrainer(spec, create_run(spec, ROOT), ROOT).setup()


@pytest.mark.parametrize("overrides", [[], ["algorithm.gradient_accumulation_steps=2", "algorithm.loss_type=dapo"]])
def test_skipping_zero_advantage_groups_gives_the_same_update(tmp_path: Path, overrides: list[str]) -> None:
    trainer = _trainer(tmp_path, *overrides)
    # plain SGD at lr 1: the weight change is the (clipped) gradient itself. AdamW's first step divides by
    # |g|, so a gradient of 1e-12 vs 0 (summation order) would move a weight by a whole lr either way
    trainer.optimizer = torch.optim.SGD([p for p in trainer.policy.parameters() if p.requires_grad], lr=1.0)
    ro = trainer.make_rollout(1, 0)
    ro.advantages[4:8] = 0.0  # one dead group whatever the sampled rewards
    ro.advantages[0:4] = torch.tensor([1.0, -1.0, 0.5, -0.5])  # and at least one live one
    start = copy.deepcopy(trainer.policy.state_dict())
    opt_start = copy.deepcopy(trainer.optimizer.state_dict())

    def step(skip: bool) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        trainer.policy.load_state_dict(start)
        trainer.optimizer.load_state_dict(copy.deepcopy(opt_start))  # loading keeps the tensors: copy
        trainer.skip_zero_advantage = skip
        metrics = trainer.optimizer_step(ro)
        return metrics, {k: v.clone() for k, v in trainer.policy.state_dict().items()}

    full, w_full = step(False)
    skipped, w_skipped = step(True)
    for k in w_full:
        torch.testing.assert_close(w_skipped[k], w_full[k], rtol=1e-4, atol=1e-6)
    for k in ("loss", "grad_norm", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert skipped[k] == pytest.approx(full[k], rel=1e-4, abs=1e-7), k


def test_a_step_with_no_signal_still_steps_the_optimizer(tmp_path: Path) -> None:
    """All advantages zero: nothing runs, but AdamW still applies its momentum as with a zero gradient."""
    trainer = _trainer(tmp_path, "algorithm.max_steps=3")
    trainer.optimizer_step(trainer.make_rollout(1, 0))  # some momentum
    ro = trainer.make_rollout(2, 1)
    ro.advantages.zero_()
    start = copy.deepcopy(trainer.policy.state_dict())
    opt_start = copy.deepcopy(trainer.optimizer.state_dict())
    out = {}
    for skip in (False, True):
        trainer.policy.load_state_dict(start)
        trainer.optimizer.load_state_dict(copy.deepcopy(opt_start))  # loading keeps the tensors: copy
        trainer.skip_zero_advantage = skip
        m = trainer.optimizer_step(ro)
        out[skip] = ({k: v.clone() for k, v in trainer.policy.state_dict().items()}, m)
    for k, v in out[False][0].items():
        torch.testing.assert_close(out[True][0][k], v)
    assert any(not torch.equal(out[True][0][k], start[k]) for k in start)  # momentum moved the weights
    assert out[True][1]["loss"] == 0.0 and out[True][1]["grad_norm"] == 0.0
    assert out[True][1]["clip_ratio/low_mean"] == out[False][1]["clip_ratio/low_mean"] == 0.0  # the same keys
