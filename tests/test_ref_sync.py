"""Reference-model sync (algorithm.sync_ref_model, backend/train/ref_sync.py): the mix by hand and against TRL's
SyncRefModelCallback, its schedule, and the checks that refuse it where there is no reference of its own. The
trainer runs that sync (and resume with the synced reference) are in tests/test_steps_per_generation.py."""

from __future__ import annotations

import copy
import types
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.checks import check_spec
from backend.spec import RunSpec, spec_from_dict
from backend.train.ref_sync import RefSync, due, mix_into

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "assets/tiny-add"


def _pair(ref: list[float], policy: list[float]) -> tuple[torch.nn.Module, torch.nn.Module]:
    r, p = torch.nn.Linear(len(ref), 1, bias=False), torch.nn.Linear(len(policy), 1, bias=False)
    with torch.no_grad():
        r.weight.copy_(torch.tensor([ref]))
        p.weight.copy_(torch.tensor([policy]))
    return r, p


def test_mix_by_hand() -> None:
    ref, policy = _pair([1.0, 2.0, -4.0], [3.0, 6.0, 4.0])
    mix_into(ref, policy, 0.25)  # 0.75 x ref + 0.25 x policy
    assert ref.weight.tolist() == [[1.5, 3.0, -2.0]]
    assert policy.weight.tolist() == [[3.0, 6.0, 4.0]]  # the policy is read, never written
    mix_into(ref, policy, 0.5)
    assert ref.weight.tolist() == [[2.25, 4.5, 1.0]]
    mix_into(ref, policy, 1.0)  # alpha 1: a copy of the policy
    assert ref.weight.tolist() == [[3.0, 6.0, 4.0]]
    ref, policy = _pair([1.0, 2.0], [3.0, 6.0])
    mix_into(ref, policy, 0.0)  # alpha 0: unchanged
    assert ref.weight.tolist() == [[1.0, 2.0]]


def test_schedule_by_hand() -> None:
    assert [s for s in range(1, 11) if due(s, 3)] == [3, 6, 9]
    assert [s for s in range(0, 4) if due(s, 1)] == [1, 2, 3]
    ref, policy = _pair([0.0], [1.0])
    a = spec_from_dict({"algorithm": {"beta": 0.1, "sync_ref_model": True, "ref_model_mixup_alpha": 0.5,
                                      "ref_model_sync_steps": 2}}).algorithm
    sync = RefSync(a, ref, policy)
    values = []
    for step in range(1, 7):
        sync.after_step(step)
        values.append(ref.weight.item())
    assert values == [0.0, 0.5, 0.5, 0.75, 0.75, 0.875] and sync.syncs == 3


def test_mix_equals_trl_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model, its policy moved at random: every parameter bit for bit as TRL's SyncRefModelCallback leaves
    the reference, on the steps TRL syncs (on_step_end at global_step % ref_model_sync_steps == 0)."""
    from trl.trainer.callbacks import SyncRefModelCallback

    # one process, no DeepSpeed: TRL's own branch for it, without an Accelerator's global state
    monkeypatch.setattr(SyncRefModelCallback, "sync_target_model", staticmethod(SyncRefModelCallback._sync_target_model))
    base = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    policy = copy.deepcopy(base)
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    a = spec_from_dict({"algorithm": {"beta": 0.1, "sync_ref_model": True, "ref_model_mixup_alpha": 0.6,
                                      "ref_model_sync_steps": 3}}).algorithm
    sync = RefSync(a, ours, policy)
    callback = SyncRefModelCallback(ref_model=theirs, accelerator=None)
    args = types.SimpleNamespace(ref_model_sync_steps=3, ref_model_mixup_alpha=0.6)
    gen = torch.Generator().manual_seed(0)
    synced = []
    for step in range(1, 8):
        with torch.no_grad():  # an "update" of the policy
            for p in policy.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=gen))
        synced.append(sync.after_step(step))
        callback.on_step_end(args, types.SimpleNamespace(global_step=step), None, model=policy)
    assert synced == [False, False, True, False, False, True, False]
    moved = 0.0
    for (name, x), (_, y), (_, b) in zip(ours.named_parameters(), theirs.named_parameters(), base.named_parameters()):
        assert torch.equal(x, y), name
        moved += float((x - b).detach().abs().max())
    assert moved > 0


def test_mix_refuses_different_models() -> None:
    ref, policy = torch.nn.Linear(2, 1), torch.nn.Sequential(torch.nn.Linear(2, 1))
    with pytest.raises(RuntimeError, match="different parameters"):
        mix_into(ref, policy, 0.5)
    a = spec_from_dict({"algorithm": {"sync_ref_model": True}}).algorithm
    with pytest.raises(ValueError, match="reference model of its own"):
        RefSync(a, None, policy)


def _issues(**sections) -> dict[str, str]:
    spec = spec_from_dict(sections)
    return {i.field: i.message for i in check_spec(spec, ROOT)}


def test_checks_refuse_sync_without_a_reference_of_its_own() -> None:
    on = {"sync_ref_model": True}
    assert "beta > 0" in _issues(algorithm=on)["algorithm.sync_ref_model"]  # default beta 0: nothing loaded
    assert "algorithm.sync_ref_model" not in _issues(algorithm={**on, "beta": 0.04})
    lora = _issues(algorithm={**on, "beta": 0.04}, model={"finetune": "lora"})
    assert "adapter disabled" in lora["algorithm.sync_ref_model"]
    zero3 = _issues(algorithm={**on, "beta": 0.04}, resources={"deepspeed_stage": 3})
    assert "ZeRO-3" in zero3["algorithm.sync_ref_model"]
    assert "ZeRO-3" not in _issues(algorithm={**on, "beta": 0.04},
                                   resources={"deepspeed_stage": 2}).get("algorithm.sync_ref_model", "")
    off = _issues(algorithm={"beta": 0.04, "ref_model_sync_steps": 8, "ref_model_mixup_alpha": 0.9})
    assert off["algorithm.ref_model_sync_steps"] == off["algorithm.ref_model_mixup_alpha"] == "only used with sync_ref_model"


def test_defaults_are_trls() -> None:
    from trl import GRPOConfig

    ours, theirs = RunSpec().algorithm, GRPOConfig.__dataclass_fields__
    assert ours.sync_ref_model is theirs["sync_ref_model"].default is False
    assert ours.ref_model_mixup_alpha == theirs["ref_model_mixup_alpha"].default == 0.6
    assert ours.ref_model_sync_steps == theirs["ref_model_sync_steps"].default == 512
