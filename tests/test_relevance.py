"""relevance.INERT_RULES: which options do nothing under the other choices. The studio greys those fields out
with the reason (app.build_tab.field_state); the check refuses a changed value where a rule says `refuse`."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.build_tab import field_state
from app.form import Validation
from backend.checks import check
from backend.relevance import INERT_RULES, inert_fields
from backend.spec import LOSS_TYPES, RunSpec, iter_fields, load_spec

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets" / "tiny-cpu.yaml"


def spec_with(**sections: dict) -> RunSpec:
    return RunSpec.model_validate(sections)


def test_every_rule_names_real_fields_and_says_why_in_both_languages() -> None:
    paths = {d.path for d in iter_fields()}
    for rule in INERT_RULES:
        assert rule.fields and set(rule.fields) <= paths, rule.fields
        assert rule.why and rule.why_zh and rule.why != rule.why_zh


def test_lora_fields_are_inert_under_full_fine_tuning_only() -> None:
    lora = ("model.lora_rank", "model.lora_alpha", "model.lora_dropout", "model.lora_targets")
    assert set(lora) <= set(inert_fields(spec_with(model={"finetune": "full"})))
    assert not set(lora) & set(inert_fields(spec_with(model={"finetune": "lora"})))


def test_kl_options_are_inert_without_a_kl_term() -> None:
    assert "algorithm.use_bias_correction_kl" in inert_fields(spec_with(algorithm={"beta": 0.0}))
    assert "algorithm.use_bias_correction_kl" not in inert_fields(spec_with(algorithm={"beta": 0.04}))


@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_loss_type_options_follow_the_loss_types_table(loss_type: str) -> None:
    info = LOSS_TYPES[loss_type]
    inert = inert_fields(spec_with(algorithm={"loss_type": loss_type}))
    for option in info.options:  # its own options are live, every other objective's are not
        assert f"algorithm.{option}" not in inert
    for other, oinfo in LOSS_TYPES.items():
        for option in set(oinfo.options) - set(info.options):
            assert f"algorithm.{option}" in inert, (loss_type, other, option)
    assert ("algorithm.epsilon" in inert) == (not info.clipped)
    assert ("algorithm.delta" in inert) == (not info.clipped)
    assert ("algorithm.epsilon_high" in inert) == (not info.clipped and not info.weight_cap)


def test_hand_worked_loss_types() -> None:
    sapo = inert_fields(spec_with(algorithm={"loss_type": "sapo"}))
    assert {"algorithm.epsilon", "algorithm.epsilon_high", "algorithm.delta"} <= set(sapo)
    assert "algorithm.sapo_temperature_pos" not in sapo
    cispo = inert_fields(spec_with(algorithm={"loss_type": "cispo"}))
    assert "algorithm.epsilon" in cispo and "algorithm.epsilon_high" not in cispo  # its weight cap
    grpo = inert_fields(spec_with(algorithm={"loss_type": "grpo"}))
    assert "algorithm.sapo_temperature_neg" in grpo and "algorithm.epsilon" not in grpo


def test_engine_and_feature_switches() -> None:
    hf = inert_fields(spec_with(rollout={"engine": "hf"}))
    assert {"rollout.lmdeploy_backend", "rollout.gpu_memory_utilization", "rollout.sleep",
            "rollout.max_staleness", "rollout.vllm_importance_sampling_mode"} <= set(hf)
    vllm = inert_fields(spec_with(rollout={"engine": "vllm", "async_generation": True,
                                           "vllm_importance_sampling_correction": True}))
    assert "rollout.lmdeploy_backend" in vllm
    assert not {"rollout.gpu_memory_utilization", "rollout.sleep", "rollout.max_staleness",
                "rollout.vllm_importance_sampling_mode"} & set(vllm)
    assert "rollout.lmdeploy_backend" not in inert_fields(spec_with(rollout={"engine": "lmdeploy"}))


def test_the_check_refuses_only_where_a_rule_says_refuse() -> None:
    # greyed but harmless: a LoRA rank kept from an earlier choice does not stop a full fine-tuning run
    assert check(load_spec(TINY, ["model.lora_rank=8", "rollout.max_staleness=3"]), ROOT) == []
    # refused: a changed value that would be silently ignored
    issues = check(load_spec(TINY, ["algorithm.sapo_temperature_neg=2"]), ROOT)
    assert [(i.field, i.message) for i in issues] == [("algorithm.sapo_temperature_neg", "only used by loss_type sapo")]


def test_the_form_greys_inert_fields_and_keeps_wrong_ones_editable() -> None:
    spec = load_spec(TINY, ["algorithm.loss_type=sapo"])
    v = Validation(spec, by_field={"algorithm.delta": ["only used by loss_type grpo"]})
    state = field_state(v, {}, "en")
    assert state["model.lora_rank"] == "I:only used with fine-tuning 'lora'"
    assert state["algorithm.epsilon"].startswith("I:only used by loss_type grpo")
    assert state["algorithm.delta"] == "E:only used by loss_type grpo"  # an error wins: it must stay editable
    assert state["rollout.num_generations"] == ""
    assert field_state(v, {}, "zh")["model.lora_rank"] == "I:仅在微调方式为 lora 时使用"
    # a form that does not parse keeps which fields were greyed
    broken = Validation(None, by_field={"rollout.num_generations": ["greater than or equal to 2"]})
    again = field_state(broken, state, "en")
    assert again["model.lora_rank"] == state["model.lora_rank"]
    assert again["rollout.num_generations"].startswith("E:")
