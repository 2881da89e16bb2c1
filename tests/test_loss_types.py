"""The loss types' one table (spec.LOSS_TYPES) against what reads it: grpo's registry, the trainer's entry
`grpo.loss(algorithm, inputs)`, the zero-advantage skip and the ranks' gradient rule."""

from __future__ import annotations

from typing import get_args

import pytest
import torch

from backend.spec import CLIPPED_LOSS_TYPES, LOSS_TYPES, AlgorithmSection, LossType, RunSpec
from backend.train import dist, grpo


def test_registry_and_literal_name_the_tables_loss_types() -> None:
    assert set(grpo.POLICY_TERMS) == set(LOSS_TYPES)
    assert get_args(LossType) == tuple(LOSS_TYPES)
    assert CLIPPED_LOSS_TYPES == ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
    assert all(grpo.POLICY_TERMS[name] is grpo.clipped_term for name in CLIPPED_LOSS_TYPES)


def _batch(seed: int = 0, B: int = 4, T: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < torch.tensor([5, 3, 4, 2])[:, None]).double()
    return {"logps": -torch.rand(B, T, generator=g, dtype=torch.float64), "old": -torch.rand(B, T, generator=g, dtype=torch.float64),
            "ref": -torch.rand(B, T, generator=g, dtype=torch.float64), "samp": -torch.rand(B, T, generator=g, dtype=torch.float64),
            "ent": torch.rand(B, T, generator=g, dtype=torch.float64), "adv": torch.tensor([1.0, -0.5, 0.0, 2.0], dtype=torch.float64),
            "isw": 0.5 + torch.rand(B, T, generator=g, dtype=torch.float64), "mask": mask}


ALGOS = [dict(loss_type=lt) for lt in LOSS_TYPES] + [
    dict(loss_type="grpo", beta=0.04, delta=4.0, epsilon_high=0.28),
    dict(loss_type="dapo", off_policy_mask_threshold=0.1, top_entropy_quantile=0.5, entropy_coef=0.01),
    dict(loss_type="cispo", epsilon_high=5.0, importance_sampling_level="sequence"),
    dict(loss_type="sapo", sapo_temperature_pos=2.0, sapo_temperature_neg=3.0, beta=0.1, use_bias_correction_kl=False),
    dict(loss_type="luspo", importance_sampling_level="sequence"),
]


@pytest.mark.parametrize("options", ALGOS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_loss_of_the_algorithm_section_is_the_keyword_loss(options: dict) -> None:
    """grpo.loss(a, LossInputs) is policy_loss with the section's options resolved as the trainer resolves them
    (epsilon_high = upper_clip, delta and the off-policy threshold 0 = off), in value, gradient and metrics."""
    a, t = AlgorithmSection(**options), _batch()
    outs, grads = [], []
    for entry in ("loss", "policy_loss"):
        logps = t["logps"].clone().requires_grad_(True)
        common = dict(ref_logps=t["ref"], sampling_logps=t["samp"], entropies=t["ent"], token_weights=t["isw"],
                      entropy_coef=a.entropy_coef, global_num_tokens=20.0, global_num_seqs=8, num_micro_batches=2,
                      max_completion_length=5)
        if entry == "loss":
            out = grpo.loss(a, grpo.LossInputs(logps, t["old"], t["adv"], t["mask"], **common))
        else:
            out = grpo.policy_loss(
                logps, t["old"], t["adv"], t["mask"], loss_type=a.loss_type, epsilon_low=a.epsilon,
                epsilon_high=a.upper_clip, is_level=a.importance_sampling_level, beta=a.beta, delta=a.delta or None,
                sapo_temperature_pos=a.sapo_temperature_pos, sapo_temperature_neg=a.sapo_temperature_neg,
                use_bias_correction_kl=a.use_bias_correction_kl,
                off_policy_mask_threshold=a.off_policy_mask_threshold or None,
                top_entropy_quantile=a.top_entropy_quantile, **common)
        out.loss.backward()
        outs.append(out)
        grads.append(logps.grad)
    assert outs[0].loss.item() == outs[1].loss.item() and outs[0].metrics == outs[1].metrics
    assert float(outs[0].kl) == float(outs[1].kl)
    assert torch.equal(grads[0], grads[1])


def test_zero_advantage_skippable_is_the_tables_and_the_options() -> None:
    def algo(**kw) -> AlgorithmSection:
        return AlgorithmSection(**kw)

    assert [lt for lt in LOSS_TYPES if algo(loss_type=lt).zero_advantage_skippable] == ["grpo", "dr_grpo", "dapo"]
    assert not algo(beta=0.04).zero_advantage_skippable  # the KL term has a gradient at zero advantage
    assert not algo(entropy_coef=0.01).zero_advantage_skippable  # the entropy bonus acts on every row
    assert not algo(use_adaptive_entropy=True).zero_advantage_skippable
    assert not algo(top_entropy_quantile=0.2).zero_advantage_skippable  # the quantile is over all tokens
    assert not algo(importance_sampling_level="sequence").zero_advantage_skippable
    assert not algo(off_policy_mask_threshold=0.5).zero_advantage_skippable
    assert not algo(delta=4.0).zero_advantage_skippable


def test_ranks_average_only_a_per_micro_batch_mean() -> None:
    sums = {lt: dist.setup(RunSpec(algorithm=AlgorithmSection(loss_type=lt))).loss_sums for lt in LOSS_TYPES}
    assert [lt for lt, s in sums.items() if not s] == ["bnpo"]
