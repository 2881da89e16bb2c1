"""backend/exporters.py: import(export(spec)) gives the spec back on every field the tool can express, and the
fields it cannot are exactly those listed; the text is what the tools read (TRL's keys held to its own dataclasses,
the ms-swift command to a real shell's word splitting)."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from backend.exporters import SWIFT, TRL, export_swift, export_trl
from backend.importers import TABLES, import_any
from backend.spec import RunSpec, load_spec, spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "presets").glob("*.yaml"))
SYSTEM = "He said \"don't\" -- twice.\nLine 2: 'single' quotes, $5, a # hash\n\tand a back\\slash"

VARIED: dict[str, dict] = {
    "lora": {"model": {"name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "finetune": "lora", "lora_rank": 32,
                       "lora_alpha": 64, "lora_dropout": 0.05, "lora_targets": ["q_proj", "v_proj"],
                       "dtype": "bfloat16"}},
    "beta0": {"algorithm": {"beta": 0.0, "loss_type": "bnpo", "learning_rate": 3e-6, "epsilon_high": 0.28}},
    "rewards": {"rewards": {"functions": [
        {"name": "accuracy", "weight": 1.0}, {"name": "format", "weight": 0.5},
        {"name": "cosine", "weight": 0.25, "params": {"min_value_wrong": -0.5, "max_value_wrong": 0.0,
                                                       "min_value_correct": 0.5, "max_value_correct": 1.0,
                                                       "max_len": 512}},
        {"name": "reward_model", "weight": 2.0, "params": {"path": "org/rm"}}], "plugins": ["my_rewards.py"]}},
    "system": {"data": {"system_prompt": SYSTEM, "prompt_column": "problem", "solution_column": "answer"}},
    "split": {"rollout": {"engine": "vllm", "placement": "separate", "data_parallel_size": 2},
              "resources": {"device": "cuda", "train_gpus": [0, 1, 2, 3], "rollout_gpus": [4, 5],
                            "deepspeed_stage": 3, "offload": True, "offload_params": True, "nnodes": 2,
                            "node_rank": 1, "master_addr": "10.0.0.1", "master_port": 29500},
              "algorithm": {"prompts_per_step": 16, "gradient_accumulation_steps": 2}},
    "fp16_sapo": {"model": {"dtype": "float16"}, "algorithm": {"loss_type": "sapo", "sapo_temperature_neg": 1.2},
                  "rollout": {"engine": "vllm", "sleep": False, "top_k": 50}},
    "rloo": {"algorithm": {"advantage_estimator": "rloo", "scale_rewards": "none"}},
    # ms-swift's kl_in_reward: its default with rloo (left out), said off with reinforce_plus_plus, on with grpo
    "rloo_kl": {"algorithm": {"advantage_estimator": "rloo", "scale_rewards": "none", "beta": 0.04,
                              "kl_in_reward": True}},
    "rpp_kl_off": {"algorithm": {"advantage_estimator": "reinforce_plus_plus", "scale_rewards": "batch",
                                 "beta": 0.04}},
    "grpo_kl": {"algorithm": {"beta": 0.02, "kl_in_reward": True}},
    "gdpo_vespo": {"algorithm": {"multi_objective_aggregation": "normalize_then_sum", "loss_type": "vespo",
                                 "vespo_k_pos": 3.0},
                   "rewards": {"functions": [{"name": "accuracy", "weight": 1.0}, {"name": "format", "weight": 0.5}]}},
    "data_options": {"data": {"chat_template_kwargs": {"enable_thinking": False}, "max_prompt_tokens": 1024,
                              "prompt_truncation": "left", "sources": ["openai/gsm8k:main"]},
                     "rollout": {"engine": "vllm", "max_model_len": 4096}},
    "ref_sync_spg": {"algorithm": {"beta": 0.04, "sync_ref_model": True, "ref_model_mixup_alpha": 0.8,
                                   "ref_model_sync_steps": 64, "gradient_accumulation_steps": 2},
                     "rollout": {"steps_per_generation": 3}},
}
SPECS = {p.stem: load_spec(p) for p in PRESETS} | {k: spec_from_dict(v) for k, v in VARIED.items()}


def changed(a: RunSpec, b: RunSpec) -> set[str]:
    da, db = a.model_dump(mode="json"), b.model_dump(mode="json")
    return {f"{s}.{k}" for s in da for k in da[s] if da[s][k] != db[s][k]}


@pytest.mark.parametrize("export", [export_swift, export_trl], ids=[SWIFT, TRL])
@pytest.mark.parametrize("name", list(SPECS))
def test_import_of_the_export_gives_the_spec_but_what_is_listed(name, export):
    spec = SPECS[name]
    res = export(spec)
    back = import_any(res.text)
    assert not back.error, back.error
    assert changed(spec, back.apply()) == set(res.fields), res.text
    assert all(i.reason for i in res.inexpressible)
    assert len(res.fields) == len(set(res.fields))


def test_reference_sync_and_the_generation_batch_are_written():
    spec = SPECS["ref_sync_spg"]
    for export in (export_swift, export_trl):
        res = export(spec)
        assert not res.fields, res.text
        assert "steps_per_generation" in res.text and "6" in res.text  # 3 steps x 2 micro-batches each
        assert import_any(res.text).apply() == spec


def test_kl_in_reward_is_written_where_it_is_not_ms_swifts_default():
    """ms-swift ties kl_in_reward to the estimator (rloo, reinforce_plus_plus: true): written where the spec differs
    from that, left out where the import fills it back; TRL's GRPOTrainer has no such option."""
    assert "--kl_in_reward" not in export_swift(SPECS["rloo_kl"]).text
    assert "    --kl_in_reward false \\" in export_swift(SPECS["rpp_kl_off"]).text
    assert "    --kl_in_reward true \\" in export_swift(SPECS["grpo_kl"]).text
    assert export_trl(SPECS["grpo_kl"]).fields == ["algorithm.kl_in_reward"]
    assert "kl_in_reward" not in export_trl(SPECS["rpp_kl_off"]).text


def test_a_preset_keeps_what_the_tools_have():
    spec = SPECS["qwen2.5-7b-dapo-math"]
    swift, trl = export_swift(spec), export_trl(spec)
    assert swift.text.startswith("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5 \\\nNPROC_PER_NODE=6 \\\nswift rlhf \\\n")
    for line in ("--epsilon_high 0.28", "--dynamic_sample true", "--loss_type dapo", "--deepspeed zero3",
                 "--per_device_train_batch_size 8", "--columns '{\"problem\": \"query\"}'", "--vllm_mode server",
                 "--soft_max_length 4096", "--soft_cache_length 1024", "--reward_funcs accuracy soft_overlong"):
        assert f"    {line} \\" in swift.text
    # 48 prompts x 16 completions = 6 processes x 16 accumulation steps x 8 per device
    assert swift.fields == ["resources.rollout_gpus", "output.log_samples_steps"]
    config = yaml.safe_load(trl.text)
    assert "per_device_train_batch_size" not in config and config["num_processes"] == 6  # 8: TRL's default
    assert config["reward_funcs"] == ["accuracy_reward", "soft_overlong"] and config["accelerate_config"] == "zero3"
    assert {"algorithm.dynamic_sampling", "data.system_prompt", "rewards.functions"} <= set(trl.fields)
    assert any("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5" in n for n in trl.notes)


def test_an_option_at_the_tools_default_is_left_out_and_filled_back():
    spec = spec_from_dict({"algorithm": {"beta": 0.04, "weight_decay": 0.1, "lr_scheduler": "cosine"},
                           "model": {"finetune": "lora", "lora_rank": 8, "lora_alpha": 32, "lora_dropout": 0.05},
                           "rollout": {"temperature": 0.9}})
    res = export_swift(spec)
    for option in ("--beta", "--weight_decay", "--lr_scheduler_type", "--lora_rank", "--temperature",
                   "--tuner_type", "--learning_rate"):  # lr 1e-4: ms-swift's LoRA default
        assert option not in res.text
    back = import_any(res.text)
    assert {"beta", "weight_decay", "lr_scheduler_type", "lora_rank", "temperature"} <= set(back.defaults)
    assert back.apply().algorithm.beta == 0.04
    # RunSpec's beta 0 is not ms-swift's 0.04: written
    assert "    --beta 0.0 \\" in export_swift(RunSpec()).text
    assert "max_steps: 200" in export_trl(RunSpec()).text  # the tools' -1 (by epochs) is not RunSpec's 200


@pytest.mark.parametrize("prompt", [SYSTEM, "  lead and trail  \n", "\nfirst line empty", "ends in \\",
                                    "a \\\n b", "x # y 'z' \"w\""])
def test_a_system_prompt_survives_a_real_shell(prompt):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    res = export_swift(spec_from_dict({"data": {"system_prompt": prompt}}))
    assert "data.system_prompt" not in res.fields
    # the command run by bash, with `swift` a function that prints its words
    show = f"swift() {{ {sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"; }}\n"
    words = json.loads(subprocess.run([bash, "-c", show + res.text], capture_output=True, text=True,
                                      check=True).stdout)
    assert words[words.index("--system") + 1] == prompt
    assert import_any(res.text).apply().data.system_prompt == prompt


_MISSING = object()


def trl_fields() -> dict[str, object]:
    """TRL's grpo script's options (GRPOConfig over TrainingArguments, ModelConfig, the script's and the dataset
    mixture's arguments) -> default (_MISSING: none), read from the installed sources' dataclasses without
    importing them (that imports torch)."""
    files = {"trl.trainer.grpo_config": ["GRPOConfig"], "trl.trainer.base_config": ["_BaseConfig"],
             "transformers.training_args": ["TrainingArguments"], "trl.trainer.model_config": ["ModelConfig"],
             "trl.scripts.grpo": ["GRPOScriptArguments"], "trl.scripts.utils": ["ScriptArguments",
                                                                              "DatasetMixtureConfig"]}
    out: dict[str, object] = {}
    for module in reversed(files):  # bases first: a subclass's default wins
        package, _, rest = module.partition(".")
        spec = importlib.util.find_spec(package)  # a top-level package's spec: found, not run
        assert spec is not None and spec.origin, package
        source = Path(spec.origin).parent / (rest.replace(".", "/") + ".py")
        for node in ast.parse(source.read_text(encoding="utf-8")).body:
            if not (isinstance(node, ast.ClassDef) and node.name in files[module]):
                continue
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    value = stmt.value
                    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
                        value = next((k.value for k in value.keywords if k.arg == "default"), None)
                        if value is None:
                            out[stmt.target.id] = _MISSING
                            continue
                    try:
                        out[stmt.target.id] = ast.literal_eval(value) if value is not None else _MISSING
                    except ValueError:
                        out[stmt.target.id] = _MISSING
    return out


def test_trl_keys_are_trls_and_what_is_left_out_is_trls_default():
    fields = trl_fields()
    assert {"beta", "learning_rate", "model_name_or_path", "reward_funcs", "datasets", "bf16"} <= set(fields)
    launcher = {"num_processes", "accelerate_config"}  # TRL's CLI passes these to accelerate launch
    for name, spec in SPECS.items():
        config = yaml.safe_load(export_trl(spec).text)
        assert set(config) <= set(fields) | launcher, (name, set(config) - set(fields) - launcher)
    # a spec where every option takes effect (vLLM, LoRA): what is left out is TRL's own default
    spec = spec_from_dict({"model": {"finetune": "lora"}, "rollout": {"engine": "vllm"}})
    config = yaml.safe_load(export_trl(spec).text)
    for key, (path, conv) in TABLES.options.items():
        default = fields.get(key, _MISSING)
        if key in config or default is _MISSING or path == "rollout.max_turns":
            continue
        if default is None and key not in TABLES.null_means:
            continue  # None: TRL derives it (run_name, eval_steps)
        section, field_name = path.split(".")
        assert conv(default) == getattr(getattr(spec, section), field_name), key


def test_the_inverse_follows_the_importers_table(monkeypatch):
    # an option added to the importer's table is exported, in both tools, without a line here
    monkeypatch.setitem(TABLES.options, "solved_reward_x", ("algorithm.solved_reward", float))
    spec = spec_from_dict({"algorithm": {"solved_reward": 0.5}})
    for export in (export_swift, export_trl):
        res = export(spec)
        assert "solved_reward" in res.text and "algorithm.solved_reward" not in res.fields
        assert import_any(res.text).apply().algorithm.solved_reward == 0.5
    monkeypatch.undo()
    assert "algorithm.solved_reward" in export_swift(spec).fields


def test_what_no_tool_holds_is_listed_with_the_reason():
    spec = spec_from_dict({"data": {"prompt_template": "Add {a} and {b}.", "limit": 10},
                           "rollout": {"engine": "lmdeploy", "placement": "separate"},
                           "rewards": {"functions": [{"name": "exact_match", "params": {"strip": True}}]},
                           "output": {"log_samples_steps": 0}})
    for export in (export_swift, export_trl):
        res = export(spec)
        by_field = {i.field: i.reason for i in res.inexpressible}
        assert {"data.prompt_template", "data.limit", "rollout.engine", "rollout.placement",
                "rewards.functions"} <= set(by_field)
        assert "columns" in by_field["data.prompt_template"] and "strip" in by_field["rewards.functions"]
        assert "output.log_samples_steps" not in by_field  # never: log_completions false
        assert changed(spec, import_any(res.text).apply()) == set(by_field)


@pytest.mark.parametrize("data", [
    {"rewards": {"functions": []}, "model": {"lora_targets": []}},
    {"rewards": {"functions": [{"name": "cosine", "params": {"max_len": "long"}}]}},
    {"data": {"system_prompt": "prompt.txt"}},
    {"rewards": {"functions": [{"name": "accuracy_reward"}, {"name": "code"}, {"name": "repetition_penalty"},
                               {"name": "reward_model", "params": {"path": "a"}},
                               {"name": "reward_model", "params": {"path": "b", "x": 1}}]}},
    {"data": {"system_prompt": "--be brief", "sources": ["a.jsonl#10", "b.jsonl"]}},
    {"algorithm": {"prompts_per_step": 3}, "resources": {"nproc_per_node": 2}, "rollout": {"num_generations": 3}},
])
def test_odd_specs_export_without_raising_and_list_what_is_lost(data):
    spec = spec_from_dict(data)
    for export in (export_swift, export_trl):
        res = export(spec)
        assert changed(spec, import_any(res.text).apply()) == set(res.fields), res.text


def test_a_quoted_word_over_several_lines_is_read_whole():
    # as bash reads it: the newline inside the quotes is the word's, a '#' inside them is not a comment
    script = "SYSTEM=\"Think first.\n# then answer\"\nswift rlhf --rlhf_type grpo --system \"$SYSTEM\" --beta 0.1 # c\n"
    res = import_any(script)
    assert res.values["data.system_prompt"] == "Think first.\n# then answer" and res.values["algorithm.beta"] == 0.1
    res = import_any("swift rlhf --rlhf_type grpo --system 'a\n  b' \\\n  --beta 0.2")
    assert res.values["data.system_prompt"] == "a\n  b" and res.values["algorithm.beta"] == 0.2
