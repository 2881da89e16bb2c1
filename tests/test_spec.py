"""RunSpec: defaults, YAML round trip, overrides, field catalogue, and rejection of bad specs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from backend.checks import check_spec
from backend.spec import RunSpec, SpecError, apply_overrides, iter_fields, load_spec, spec_from_dict
from backend.train.cli import main as train_main

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted((ROOT / "presets").glob("*.yaml"))


def test_every_preset_validates() -> None:
    assert any(p.stem == "tiny-cpu" for p in PRESETS)
    for p in PRESETS:
        spec = load_spec(p)
        assert check_spec(spec, ROOT) == [], p.name


def test_yaml_round_trip(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "presets/tiny-cpu.yaml", ["algorithm.learning_rate=3e-5", "rollout.top_k=5"])
    path = tmp_path / "s.yaml"
    path.write_text(spec.to_yaml())
    again = load_spec(path)
    assert again == spec
    assert again.algorithm.learning_rate == pytest.approx(3e-5)
    assert again.rollout.top_k == 5


def test_overrides_parse_yaml_values() -> None:
    data = apply_overrides({}, ["data.sources=[a.jsonl, b.jsonl#10]", "rollout.async_generation=true",
                                "output.report_to=[tensorboard]"])
    spec = spec_from_dict(data)
    assert spec.data.sources == ["a.jsonl", "b.jsonl#10"]
    assert spec.rollout.async_generation is True
    assert spec.output.report_to == ["tensorboard"]


def test_field_catalogue_covers_every_field_with_help() -> None:
    docs = {d.path: d for d in iter_fields()}
    for section, sfield in RunSpec.model_fields.items():
        for name in sfield.annotation.model_fields:
            assert f"{section}.{name}" in docs
    for name in ["model.name_or_path", "rollout.num_generations", "rollout.temperature",
                 "rollout.max_completion_length", "algorithm.loss_type", "algorithm.learning_rate",
                 "algorithm.max_steps", "output.runs_dir", "output.save_steps"]:
        assert docs[name].help, name
    ng = docs["rollout.num_generations"]
    assert (ng.minimum, ng.default) == (2, 8)
    assert docs["algorithm.loss_type"].choices == ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
    assert [docs[f"algorithm.vespo_{n}"].default for n in ("k_pos", "lambda_pos", "k_neg", "lambda_neg")] == [2, 3, 3, 2]
    assert docs["algorithm.advantage_estimator"].choices == ("grpo", "rloo", "reinforce_plus_plus")
    assert docs["algorithm.advantage_estimator"].default == "grpo"
    assert docs["algorithm.multi_objective_aggregation"].default == "sum_then_normalize"
    # the objectives' options carry TRL's GRPOConfig names, defaults and bounds
    assert (docs["algorithm.top_entropy_quantile"].default, docs["algorithm.top_entropy_quantile"].maximum) == (1.0, 1.0)
    assert docs["algorithm.sapo_temperature_neg"].default == 1.05 and docs["algorithm.sapo_temperature_neg"].exclusive_min
    assert docs["algorithm.use_bias_correction_kl"].default is True
    assert docs["algorithm.disable_dropout"].default is True
    assert docs["algorithm.entropy_coef_delta"].default == 0.005
    assert docs["rollout.temperature"].exclusive_min


# (overrides, field the message must name, a word the message must contain)
BAD = [
    (["rollout.num_generations=1"], "rollout.num_generations", "greater than or equal to 2"),
    (["algorithm.learning_rate=-1e-4"], "algorithm.learning_rate", "greater than 0"),
    (["algorithm.prompts_per_step=3", "rollout.num_generations=3", "algorithm.gradient_accumulation_steps=2"],
     "algorithm.gradient_accumulation_steps", "9 completions"),
    (["model.name_or_path=/nonexistent/model"], "model.name_or_path", "no such model"),
    (["model.name_or_path=assets/no-such-model"], "model.name_or_path", "no such model"),
    (["data.sources=[assets/data/missing.jsonl]"], "data.sources", "no such file"),
    (["data.prompt_column=question"], "data.prompt_column", "'question' not in"),
    (["rewards.functions=[{name: no_such_reward}]"], "rewards.functions", "unknown reward"),
    (["algorithm.loss_type=ppo"], "algorithm.loss_type", "grpo"),
    (["rollout.temperature=0"], "rollout.temperature", "greater than 0"),
    (["data.sources=[assets/data/add_train.jsonl#zero]"], "data.sources", "positive integer"),
    (["rollout.placement=separate", "rollout.engine=vllm", "resources.train_gpus=[0]",
      "resources.rollout_gpus=[0]"], "resources.rollout_gpus", "both"),
    (["algorithm.epsilon_high=0.1"], "algorithm.epsilon_high", ">= epsilon"),
    (["rollout.no_such_option=3"], "rollout.no_such_option", "unknown option"),
    (["algorithm.max_steps=0"], "algorithm.max_steps", "greater than or equal to 1"),
    (["rewards.plugins=[nope.py]"], "rewards.plugins", "no such plugin"),
]


@pytest.mark.parametrize(("overrides", "field", "words"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_spec_is_rejected_naming_the_field(overrides, field, words, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    runs = tmp_path / "runs"
    code = train_main(["--config", "presets/tiny-cpu.yaml", "--set", f"output.runs_dir={runs}", *sum(
        (["--set", o] for o in overrides), [])])
    err = capsys.readouterr().err
    assert code == 2
    line = next((ln for ln in err.splitlines() if field in ln), "")
    assert words in line, err
    assert not runs.exists() or not any(runs.iterdir())  # nothing created


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "nope.yaml")
    notmap = tmp_path / "list.yaml"
    notmap.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(SpecError, match="mapping"):
        load_spec(notmap)


def test_cli_bad_config_exits_nonzero_in_a_subprocess(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    p = subprocess.run([sys.executable, "-m", "backend.train", "--config", "presets/tiny-cpu.yaml",
                        "--set", f"output.runs_dir={runs}", "--set", "rollout.num_generations=1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "rollout.num_generations" in p.stderr
    assert p.stdout == ""
    assert not runs.exists()


def test_duplicate_reward_and_missing_reward_model_are_rejected() -> None:
    spec = load_spec(ROOT / "presets/tiny-cpu.yaml", [
        "rewards.functions=[{name: exact_match}, {name: exact_match, weight: 2}, "
        "{name: reward_model, params: {path: assets/no-such-rm}}]"])
    messages = [str(i) for i in check_spec(spec, ROOT)]
    assert any("listed twice" in m for m in messages)
    assert any("reward_model: no such model directory" in m for m in messages)


@pytest.mark.parametrize(("overrides", "field"), [
    (["rollout.engine=vllm"], "rollout.engine"),
    (["resources.device=cuda"], "resources.device"),
    (["resources.train_gpus=[0, 1]"], "resources.device"),
])
def test_launch_refuses_what_this_machine_cannot_run(overrides, field, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    runs = tmp_path / "runs"
    code = train_main(["--config", "presets/tiny-cpu.yaml", "--set", f"output.runs_dir={runs}",
                       *sum((["--set", o] for o in overrides), [])])
    assert code == 2
    assert field in capsys.readouterr().err
    assert not runs.exists() or not any(runs.iterdir())


# (overrides, field the issue must name, words its message must contain); each is fine without the overrides' last item
OBJECTIVE_RULES = [
    (["algorithm.loss_type=cispo"], "algorithm.epsilon_high", "cap"),
    (["algorithm.loss_type=luspo"], "algorithm.importance_sampling_level", "sequence"),
    (["algorithm.loss_type=sapo", "algorithm.delta=4"], "algorithm.delta", "(the clipped objectives)"),
    (["algorithm.delta=1.1"], "algorithm.delta", "1 + epsilon_high = 1.2"),
    (["algorithm.sapo_temperature_pos=2"], "algorithm.sapo_temperature_pos", "loss_type sapo"),
    (["algorithm.entropy_target=1.5"], "algorithm.entropy_target", "use_adaptive_entropy"),
    (["algorithm.use_adaptive_entropy=true", "algorithm.entropy_coef_min=0.5", "algorithm.entropy_coef_max=0.1"],
     "algorithm.entropy_coef_min", "exceeds entropy_coef_max"),
    (["model.finetune=lora", "model.lora_dropout=0.05"], "model.lora_dropout", "disable_dropout"),
    (["algorithm.loss_type=vespo", "algorithm.importance_sampling_level=sequence"],
     "algorithm.importance_sampling_level", "token"),
    (["algorithm.vespo_k_pos=1"], "algorithm.vespo_k_pos", "loss_type vespo"),
    (["algorithm.loss_type=vespo", "rollout.vllm_importance_sampling_correction=true"],
     "rollout.vllm_importance_sampling_mode", "token_truncate or token_mask"),
    (["algorithm.multi_objective_aggregation=normalize_then_sum", "algorithm.advantage_estimator=rloo"],
     "algorithm.advantage_estimator", "leave it at grpo"),
    (["algorithm.multi_objective_aggregation=normalize_then_sum", "algorithm.scale_rewards=batch"],
     "algorithm.scale_rewards", "not applied"),
    (["algorithm.multi_objective_aggregation=normalize_then_sum", "algorithm.advantage_calibration=true"],
     "algorithm.advantage_calibration", "virtual completion"),
    (["algorithm.advantage_estimator=reinforce_plus_plus", "algorithm.advantage_calibration=true"],
     "algorithm.advantage_calibration", "reinforce_plus_plus"),
    (["algorithm.kl_in_reward=true"], "algorithm.kl_in_reward", "needs beta > 0"),
    (["algorithm.kl_in_reward=true", "algorithm.beta=0.04", "algorithm.multi_objective_aggregation=normalize_then_sum"],
     "algorithm.kl_in_reward", "no summed reward"),
]


@pytest.mark.parametrize(("overrides", "field", "words"), OBJECTIVE_RULES, ids=[r[1] for r in OBJECTIVE_RULES])
def test_objective_cross_field_rules_name_the_field(overrides, field, words) -> None:
    issues = check_spec(load_spec(ROOT / "presets/tiny-cpu.yaml", overrides), ROOT)
    assert [i.field for i in issues] == [field], issues
    assert words in issues[0].message


@pytest.mark.parametrize("overrides", [
    ["algorithm.loss_type=cispo", "algorithm.epsilon_high=5"],
    ["algorithm.loss_type=luspo", "algorithm.importance_sampling_level=sequence", "algorithm.delta=4"],
    ["algorithm.loss_type=sapo", "algorithm.sapo_temperature_pos=2", "algorithm.sapo_temperature_neg=3"],
    ["algorithm.use_adaptive_entropy=true", "algorithm.entropy_target=1.5", "algorithm.entropy_coef_max=0.2"],
    ["model.finetune=lora", "model.lora_dropout=0.05", "algorithm.disable_dropout=false"],
    ["algorithm.off_policy_mask_threshold=0.5", "algorithm.top_entropy_quantile=0.2", "algorithm.entropy_coef=0.01"],
    ["algorithm.loss_type=vespo", "algorithm.vespo_k_pos=1", "algorithm.vespo_lambda_neg=4", "algorithm.beta=0.04",
     "rollout.vllm_importance_sampling_correction=true", "rollout.vllm_importance_sampling_mode=token_mask"],
    ["algorithm.advantage_estimator=rloo", "algorithm.scale_rewards=none"],
    ["algorithm.advantage_estimator=reinforce_plus_plus", "algorithm.scale_rewards=batch"],
    ["algorithm.multi_objective_aggregation=normalize_then_sum"],
    ["algorithm.advantage_calibration=true"],
    ["algorithm.kl_in_reward=true", "algorithm.beta=0.04", "algorithm.advantage_estimator=rloo",
     "algorithm.scale_rewards=none"],
    ["algorithm.kl_in_reward=true", "algorithm.beta=0.04", "algorithm.scale_rewards=batch",
     "resources.nproc_per_node=2"],  # the KL is gathered: batch statistics are the whole batch's
])
def test_objective_options_that_fit_together_pass(overrides) -> None:
    assert check_spec(load_spec(ROOT / "presets/tiny-cpu.yaml", overrides), ROOT) == []


def test_a_retired_option_loads_with_a_warning_saying_why(tmp_path: Path) -> None:
    """An older run's spec.yaml that still sets a removed option (resources.activation_reuse_mb) loads."""
    from backend.spec import RETIRED

    old = tmp_path / "spec.yaml"
    old.write_text("resources:\n  activation_reuse_mb: 0\n  num_threads: 2\n")
    with pytest.warns(UserWarning, match=r"resources\.activation_reuse_mb is ignored: the activation tape was removed"):
        spec = load_spec(old)
    assert spec.resources.num_threads == 2 and "activation_reuse_mb" not in spec.resources.model_dump()
    with pytest.warns(UserWarning, match="activation_reuse_mb is ignored"):
        spec_from_dict(apply_overrides({}, ["resources.activation_reuse_mb=64"]))
    assert all(p.split(".")[1] not in RunSpec.model_fields[p.split(".")[0]].annotation.model_fields for p in RETIRED)
    with pytest.raises(SpecError, match="activation_reuse_gb"):  # a misspelt option is still refused
        spec_from_dict({"resources": {"activation_reuse_gb": 1}})
