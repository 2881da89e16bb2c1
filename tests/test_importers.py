"""ms-swift and TRL configs mapped onto RunSpec: every option applied or listed with a reason, omitted options
given the source tool's defaults, launch context read, nothing raised; held on a corpus of real configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.importers import (
    _ALIAS_PARAMS,
    _REWARD_ALIASES,
    _REWARD_PARAMS,
    DEFAULTS,
    OPENR1_SOURCE,
    SWIFT_SOURCE,
    TRL_SOURCE,
    import_any,
    import_swift,
    import_trl,
    parse_python_config,
    parse_script,
    parse_swift_args,
)
from backend.rewards.registry import BUILTIN_REWARDS

CORPUS = Path(__file__).parent / "data" / "importers"

SWIFT = r"""
CUDA_VISIBLE_DEVICES=0,1,2,3 NPROC_PER_NODE=4 MAX_PIXELS=1003520 \
swift rlhf \
    --rlhf_type grpo \
    --model Qwen/Qwen2.5-7B-Instruct \
    --train_type lora --lora_rank 64 --lora_alpha 128 --target_modules all-linear \
    --torch_dtype bfloat16 \
    --dataset AI-MO/NuminaMath-TIR#5000 extra/local.jsonl \
    --reward_funcs accuracy format --reward_weights 1.0 0.5 \
    --external_plugins examples/plugin/plugin.py \
    --use_vllm true --vllm_mode colocate --vllm_gpu_memory_utilization 0.5 --sleep_level 1 \
    --num_generations 8 --temperature 0.9 --max_completion_length 2048 \
    --per_device_train_batch_size 4 --gradient_accumulation_steps 2 \
    --learning_rate 1e-6 --lr_scheduler_type cosine --warmup_ratio 0.05 --max_steps 1000 \
    --beta 0.04 --epsilon_high 0.28 --loss_type bnpo --dynamic_sample true \
    --deepspeed zero3_offload --report_to tensorboard wandb \
    --output_dir output --logging_steps 5 --num_infer_workers 2 --save_steps 100 --log_completions true
"""


def unmapped_options(res) -> set[str]:
    return {u.option for u in res.unmapped}


def test_parse_swift_args():
    env, opts, stray = parse_swift_args(SWIFT)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and env["NPROC_PER_NODE"] == "4"
    assert stray == []
    assert opts["dataset"] == ["AI-MO/NuminaMath-TIR#5000", "extra/local.jsonl"]
    _, opts, _ = parse_swift_args("swift rlhf --model=a/b --flag --x 1")
    assert opts == {"model": "a/b", "flag": "true", "x": "1"}


def test_import_swift_maps_fields_and_lists_the_rest():
    res = import_swift(SWIFT)
    v = res.values
    assert res.source == SWIFT_SOURCE
    assert v["model.name_or_path"] == "Qwen/Qwen2.5-7B-Instruct"
    assert v["model.finetune"] == "lora" and v["model.lora_rank"] == 64 and v["model.lora_alpha"] == 128
    assert v["model.lora_targets"] == ["all-linear"] and v["model.dtype"] == "bfloat16"
    assert v["data.sources"] == ["AI-MO/NuminaMath-TIR#5000", "extra/local.jsonl"]
    assert v["rewards.functions"] == [{"name": "accuracy", "weight": 1.0, "params": {}},
                                      {"name": "format", "weight": 0.5, "params": {}}]
    assert v["rewards.plugins"] == ["examples/plugin/plugin.py"]
    assert v["rollout.engine"] == "vllm" and v["rollout.placement"] == "colocate" and v["rollout.sleep"] is True
    assert v["rollout.gpu_memory_utilization"] == 0.5 and v["rollout.max_completion_length"] == 2048
    assert v["resources.train_gpus"] == [0, 1, 2, 3]
    # 4 per device x 4 processes x 2 accumulation = 32 completions = 4 prompts x 8 generations
    assert v["algorithm.prompts_per_step"] == 4
    assert v["algorithm.warmup_steps"] == 50 and v["algorithm.lr_scheduler"] == "cosine"
    assert v["algorithm.beta"] == 0.04 and v["algorithm.epsilon_high"] == 0.28 and v["algorithm.loss_type"] == "bnpo"
    assert v["algorithm.dynamic_sampling"] is True
    assert v["resources.deepspeed_stage"] == 3 and v["resources.offload"] is True
    assert v["output.report_to"] == ["tensorboard", "wandb"] and v["output.save_steps"] == 100
    assert v["output.log_samples_steps"] == 1
    assert {"--output_dir", "--logging_steps", "--num_infer_workers", "MAX_PIXELS=1003520"} <= unmapped_options(res)
    assert all(u.reason for u in res.unmapped)
    assert any("prompts_per_step" in n for n in res.notes)
    spec = res.apply()
    assert spec.model.lora_rank == 64 and spec.rollout.engine == "vllm"


def test_import_swift_server_mode_and_bad_values():
    res = import_swift("swift rlhf --rlhf_type grpo --model m --use_vllm true --vllm_mode server --temperature hot")
    assert res.values["rollout.placement"] == "separate"
    assert "--temperature" in unmapped_options(res)
    assert any("rollout_gpus" in n for n in res.notes)
    assert res.apply().rollout.temperature == 1.0  # the rest still imports


# ----------------------------------------------------------------------------- the source tools' defaults

def test_swift_defaults_are_ms_swifts_and_reported():
    res = import_swift("swift rlhf --rlhf_type grpo --model Qwen/Qwen2.5-7B-Instruct --dataset d.jsonl")
    spec = res.apply()
    # ms-swift's LoRA default, its GRPO beta, cosine schedule, weight decay 0.1, checkpointing, rank 8, lr 1e-4 (LoRA)
    assert spec.model.finetune == "lora" and spec.model.lora_rank == 8 and spec.model.lora_alpha == 32
    assert spec.algorithm.beta == 0.04 and spec.algorithm.lr_scheduler == "cosine"
    assert spec.algorithm.weight_decay == 0.1 and spec.model.gradient_checkpointing is True
    assert spec.algorithm.learning_rate == 1e-4 and spec.rollout.temperature == 0.9
    assert spec.rollout.max_completion_length == 512 and spec.rollout.num_generations == 8
    assert res.defaults["tuner_type"] == "lora" and res.defaults["beta"] == 0.04
    assert res.defaults["learning_rate"] == 1e-4
    full = import_swift("swift rlhf --rlhf_type grpo --model m --tuner_type full")
    assert full.values["model.finetune"] == "full" and full.values["algorithm.learning_rate"] == 1e-5
    assert "lora_rank" not in full.defaults  # LoRA settings of a full fine-tune are not filled
    assert spec.model.dtype == "auto" and res.defaults["torch_dtype"] == "auto"  # ms-swift: the model's own dtype
    bf16 = import_swift("swift rlhf --rlhf_type grpo --torch_dtype bfloat16").values
    assert bf16["model.dtype"] == "bfloat16" and bf16["algorithm.lr_scheduler"] == "cosine"


def test_an_explicit_option_wins_over_the_default():
    res = import_swift("swift rlhf --rlhf_type grpo --beta 0 --lr_scheduler_type linear --weight_decay 0")
    assert res.values["algorithm.beta"] == 0.0 and res.values["algorithm.lr_scheduler"] == "linear"
    assert "beta" not in res.defaults and "beta" in res.applied


def test_trl_defaults_are_trls():
    res = import_trl("model_name_or_path: Qwen/Qwen2.5-0.5B\nreward_funcs: [accuracy_reward]")
    assert res.source == TRL_SOURCE
    spec = res.apply()
    assert spec.algorithm.learning_rate == 1e-6 and spec.algorithm.beta == 0.0
    assert spec.rollout.max_completion_length == 512 and spec.model.dtype == "bfloat16"
    assert spec.model.gradient_checkpointing is True and spec.algorithm.loss_type == "dapo"
    assert spec.algorithm.prompts_per_step == 1  # 8 per device x 1 process / 8 generations
    assert spec.model.finetune == "full" and spec.rewards.functions[0].name == "accuracy"  # accuracy_reward's alias
    assert res.defaults["per_device_train_batch_size"] == 8 and res.defaults["num_processes"] == 1


def test_defaults_tables_name_only_known_options():
    for source, table in DEFAULTS.items():
        assert table, source
    assert DEFAULTS[SWIFT_SOURCE]["beta"] == 0.04 and DEFAULTS[SWIFT_SOURCE]["tuner_type"] == "lora"
    assert DEFAULTS[TRL_SOURCE]["learning_rate"] == 1e-6 and DEFAULTS[OPENR1_SOURCE]["beta"] == 0.04


# ----------------------------------------------------------------------------- nothing raises

@pytest.mark.parametrize("text", [
    "swift rlhf --rlhf_type grpo --model m \\",  # a last line ending in ' \'
    "swift rlhf --rlhf_type grpo --system 'unbalanced",
    "per_device_train_batch_size: null\nwarmup_ratio: null\nreward_funcs: [accuracy]\nreward_weights: 1.0",
    "reward_weights: [a, b]\nreward_funcs: [x, y]",
    "learning_rate: [1, 2, {a: 3}]\nnum_generations: {x: 1}",
    "- just\n- a list",
    "",
    "swift rlhf --per_device_train_batch_size none --num_generations 0",
    "GRPOConfig(beta=",
    "{\"beta\": \"zero\"}",
])
def test_nothing_raises(text):
    res = import_any(text)
    if not res.error:
        res.apply()


def test_nulls_and_scalar_weights():
    res = import_any("per_device_train_batch_size: null\nwarmup_ratio: null\nreward_funcs: [accuracy]\n"
                     "reward_weights: 1.0\nnum_generations: 4")
    assert not res.error
    assert res.values["rewards.functions"] == [{"name": "accuracy", "weight": 1.0, "params": {}}]
    assert res.values["algorithm.prompts_per_step"] == 2  # null: TRL's default 8 per device / 4
    assert any("null" in n for n in res.notes)
    assert import_any("- just\n- a list").error


def test_invalid_values_are_unmapped_with_the_spec_reason():
    res = import_trl("loss_type: fipo\nnum_generations: 1")  # ms-swift has fipo; not here
    fields = " ".join(u.reason for u in res.unmapped)
    assert "algorithm.loss_type" in fields and "rollout.num_generations" in fields
    assert {"loss_type", "num_generations"} <= unmapped_options(res)
    assert res.apply().algorithm.loss_type == "grpo"


# ----------------------------------------------------------------------------- options users rely on

def test_tuner_type_lora_and_qlora_stay_lora():
    res = import_any("swift rlhf --rlhf_type grpo --model Qwen/Qwen2.5-72B-Instruct --tuner_type lora")
    assert res.apply().model.finetune == "lora"
    q = import_any("swift rlhf --rlhf_type grpo --model m --tuner_type lora --quant_bits 4 --quant_method bnb")
    assert q.apply().model.finetune == "lora"
    assert "--quant_bits" in unmapped_options(q)


def test_system_file_is_read_inside_the_project_only(tmp_path):
    (tmp_path / "prompt.txt").write_text("Think step by step.\n")
    (tmp_path.parent / "outside.txt").write_text("secret")
    res = import_any("swift rlhf --rlhf_type grpo --system prompt.txt", base_dir=tmp_path)
    assert res.values["data.system_prompt"] == "Think step by step."
    outside = import_any("swift rlhf --rlhf_type grpo --system ../outside.txt", base_dir=tmp_path)
    assert "data.system_prompt" not in outside.values and "--system" in unmapped_options(outside)
    no_base = import_any("swift rlhf --rlhf_type grpo --system prompt.txt")
    assert "data.system_prompt" not in no_base.values
    literal = import_any("swift rlhf --rlhf_type grpo --system 'You are a helpful assistant.'")
    assert literal.values["data.system_prompt"] == "You are a helpful assistant."


def test_variables_from_earlier_lines_and_unresolved_ones():
    script = """
export NPROC=8
SYSTEM_PROMPT="Answer briefly."
export NNODES=2
NPROC_PER_NODE=$NPROC swift rlhf --rlhf_type grpo --system "$SYSTEM_PROMPT" --model $MODEL_PATH \\
    --per_device_train_batch_size 2 --num_generations 8
"""
    res = import_any(script)
    assert res.values["data.system_prompt"] == "Answer briefly."
    assert "$MODEL_PATH" in unmapped_options(res)
    assert "SYSTEM_PROMPT" not in " ".join(unmapped_options(res))  # a shell variable the command used
    # 2 per device x 8 per node x 2 nodes / 8 generations
    assert res.values["algorithm.prompts_per_step"] == 4
    assert res.values["resources.nnodes"] == 2 and res.values["resources.nproc_per_node"] == 8


def test_launchers_route_to_ms_swift_and_give_the_world_size():
    torchrun = import_any("torchrun --nproc_per_node 4 --nnodes 2 swift/cli/rlhf.py --rlhf_type grpo --model m "
                          "--per_device_train_batch_size 1 --num_generations 8")
    assert torchrun.source == SWIFT_SOURCE and torchrun.values["algorithm.prompts_per_step"] == 1
    assert torchrun.values["resources.nnodes"] == 2
    megatron = import_any("NPROC_PER_NODE=8 megatron rlhf --rlhf_type grpo --model m --global_batch_size 64 "
                          "--micro_batch_size 2 --num_generations 8 --train_iters 10")
    assert "Megatron" in megatron.source and megatron.values["model.finetune"] == "full"  # Megatron's default
    assert megatron.values["algorithm.prompts_per_step"] == 8 and megatron.values["algorithm.max_steps"] == 10
    assert megatron.values["algorithm.gradient_accumulation_steps"] == 4  # 64 / (2 x 8)
    acc = import_any("accelerate launch --num_processes 7 src/open_r1/grpo.py --config recipes/x.yaml "
                     "--per_device_train_batch_size 4 --num_generations 7 --dataset_prompt_column problem")
    assert acc.source == OPENR1_SOURCE and acc.values["algorithm.prompts_per_step"] == 4
    assert "--config" in unmapped_options(acc)


def test_trl_config_file_is_read_from_the_project(tmp_path):
    (tmp_path / "grpo.yaml").write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 4\n"
                                        "num_generations: 4\nbeta: 0.02\n")
    res = import_any("trl grpo --config grpo.yaml --num_processes 2 --beta 0.01", base_dir=tmp_path)
    assert res.values["model.name_or_path"] == "Qwen/Qwen2.5-0.5B"
    assert res.values["algorithm.beta"] == 0.01  # the command line wins over the file
    assert res.values["algorithm.prompts_per_step"] == 2


def test_epochs_become_steps_where_the_data_size_is_known():
    res = import_any("swift rlhf --rlhf_type grpo --dataset AI-MO/NuminaMath-TIR#1000 --num_train_epochs 2 "
                     "--per_device_train_batch_size 8 --num_generations 8 --warmup_ratio 0.1")
    assert res.values["algorithm.max_steps"] == 2000 and res.values["algorithm.warmup_steps"] == 200
    unknown = import_any("dataset_name: open-r1/OpenR1-Math-220k\nmax_steps: -1\nnum_train_epochs: 1")
    assert "num_train_epochs" in unmapped_options(unknown) and "algorithm.max_steps" not in unknown.values
    assert "max_steps" in unknown.applied


def test_datasets_subsets_modelscope_and_open_r1_columns():
    res = import_any("swift rlhf --rlhf_type grpo --dataset modelscope/competition_math:default#500 local.jsonl")
    assert res.values["data.sources"] == ["modelscope/competition_math:default#500", "local.jsonl"]
    assert "--dataset" not in unmapped_options(res)  # the subset is kept: it loads as the dataset's config
    assert any("ModelScope id" in n for n in res.notes)
    r1 = import_any("dataset_name: open-r1/OpenR1-Math-220k\ndataset_config: default\ndataset_prompt_column: problem\n"
                    "system_prompt: Think first.")
    assert r1.source == OPENR1_SOURCE
    assert r1.values["data.prompt_column"] == "problem" and r1.values["data.system_prompt"] == "Think first."
    assert r1.values["data.sources"] == ["open-r1/OpenR1-Math-220k:default"]
    assert "dataset_config" not in unmapped_options(r1)
    cols = import_any("swift rlhf --rlhf_type grpo --columns '{\"answer\": \"solution\", \"problem\": \"query\"}'")
    assert cols.values["data.solution_column"] == "answer" and cols.values["data.prompt_column"] == "problem"


def test_reward_params_aliases_and_weights():
    r1 = import_any("reward_funcs: [accuracy, cosine, repetition_penalty, soft_overlong_punishment, code]\n"
                    "reward_weights: [1, 0.5, 0.2, 1, 1]\ncosine_max_len: 2000\nrepetition_n_grams: 4\n"
                    "max_completion_len: 4096\nsoft_punish_cache: 512\n")
    funcs = {f["name"]: f for f in r1.values["rewards.functions"]}
    assert set(funcs) == {"accuracy", "cosine", "repetition", "soft_overlong", "code"}
    assert funcs["cosine"]["params"] == {"min_value_wrong": 0.0, "max_value_wrong": -0.5, "min_value_correct": 0.5,
                                         "max_value_correct": 1.0, "max_len": 2000}  # open-r1's defaults, its max_len
    assert funcs["repetition"]["params"] == {"ngram_size": 4, "max_penalty": -1.0} and funcs["repetition"]["weight"] == 0.2
    assert funcs["soft_overlong"]["params"] == {"max_completion_len": 4096, "cache_len": 512}
    assert not any(u.value == "code" for u in r1.unmapped)
    code = import_any("reward_funcs: [binary_code, code_format, reasoning_steps]\ncode_language: cpp\n")
    assert code.values["rewards.functions"] == [
        {"name": "code", "weight": 1.0, "params": {"binary": True}},
        {"name": "code_format", "weight": 1.0, "params": {"language": "cpp"}}]
    assert any(u.value == "reasoning_steps" for u in code.unmapped)  # no built-in: left out, said so
    code.apply()
    swift = import_any("swift rlhf --rlhf_type grpo --reward_funcs cosine soft_overlong --max_completion_length 1024 "
                       "--soft_cache_length 256 --cosine_min_len_value_wrong -1.0")
    sf = {f["name"]: f for f in swift.values["rewards.functions"]}
    assert sf["cosine"]["params"]["min_value_wrong"] == -1.0 and sf["cosine"]["params"]["max_value_correct"] == 1.0
    assert sf["cosine"]["params"]["max_len"] == 1024  # None in ms-swift: max_completion_length
    assert sf["soft_overlong"]["params"] == {"max_completion_len": 1024, "cache_len": 256}
    rm = import_any("swift rlhf --rlhf_type grpo --reward_funcs accuracy --reward_model my/rm --reward_weights 1 0.3")
    assert rm.values["rewards.functions"] == [{"name": "accuracy", "weight": 1.0, "params": {}},
                                              {"name": "reward_model", "weight": 0.3, "params": {"path": "my/rm"}}]
    trl_rm = import_any("reward_model_name_or_path: my/rm\nreward_funcs: [accuracy_reward]\nreward_weights: [0.3, 1]")
    assert [(f["name"], f["weight"]) for f in trl_rm.values["rewards.functions"]] == [("reward_model", 0.3),
                                                                                      ("accuracy", 1.0)]


def test_reward_aliases_and_params_name_our_built_ins():
    for table in _REWARD_ALIASES.values():
        assert set(table.values()) <= set(BUILTIN_REWARDS)
    for table in _REWARD_PARAMS.values():
        for reward, param in table.values():
            assert param in BUILTIN_REWARDS[reward].params_model.model_fields
    for alias, params in _ALIAS_PARAMS.items():
        reward = _REWARD_ALIASES["open-r1"][alias]
        assert set(params) <= set(BUILTIN_REWARDS[reward].params_model.model_fields)


def test_lacking_algorithms_are_reported_not_added():
    res = import_any("swift rlhf --rlhf_type grpo --advantage_estimator rloo --loss_type fipo --sync_ref_model true "
                     "--steps_per_generation 4 --gradient_accumulation_steps 1")
    names = unmapped_options(res)
    assert "--loss_type" in names
    plain = import_any("advantage_estimator: grpo\nsync_ref_model: false\nsteps_per_generation: 2\n"
                       "gradient_accumulation_steps: 2\nmax_prompt_length: null")
    assert not unmapped_options(plain) & {"advantage_estimator", "sync_ref_model", "steps_per_generation",
                                          "max_prompt_length"}


def test_advantage_estimators_with_ms_swifts_tied_defaults():
    """ms-swift ties scale_rewards (rloo: none, reinforce_plus_plus: batch) and kl_in_reward (true for both) to the
    estimator when they are not given; Megatron's defaults are fixed (group, false)."""
    rloo = import_any("swift rlhf --rlhf_type grpo --advantage_estimator rloo")
    assert rloo.values["algorithm.advantage_estimator"] == "rloo" and rloo.values["algorithm.scale_rewards"] == "none"
    assert rloo.defaults["scale_rewards"] == "none"
    # beta 0.04 by default: the KL in the reward, as there
    assert rloo.values["algorithm.kl_in_reward"] is True and rloo.defaults["kl_in_reward"] is True
    assert rloo.apply().algorithm.beta == 0.04 and "--kl_in_reward" not in unmapped_options(rloo)
    rpp = import_any("swift rlhf --rlhf_type grpo --advantage_estimator reinforce_plus_plus --beta 0")
    assert rpp.apply().algorithm.scale_rewards == "batch" and not rpp.apply().algorithm.kl_in_reward  # nothing to charge
    assert "--kl_in_reward" not in unmapped_options(rpp)
    given = import_any("swift rlhf --rlhf_type grpo --advantage_estimator rloo --scale_rewards group "
                       "--kl_in_reward false")
    assert given.values["algorithm.scale_rewards"] == "group" and not unmapped_options(given) & {"--kl_in_reward"}
    assert given.apply().algorithm.kl_in_reward is False and "kl_in_reward" in given.applied
    on = import_any("swift rlhf --rlhf_type grpo --kl_in_reward true --beta 0.01").apply().algorithm
    assert on.kl_in_reward and on.beta == 0.01 and on.advantage_estimator == "grpo"
    # ms-swift's beta default is 0.04, so a grpo run asked for it is charged; gdpo turns it off there
    assert import_any("swift rlhf --rlhf_type grpo --kl_in_reward true").apply().algorithm.kl_in_reward
    gdpo = import_any("swift rlhf --rlhf_type grpo --kl_in_reward true --scale_rewards gdpo")
    assert not gdpo.apply().algorithm.kl_in_reward and any("gdpo" in n for n in gdpo.notes)
    mega = import_any("megatron rlhf --rlhf_type grpo --advantage_estimator rloo")
    assert mega.values["algorithm.scale_rewards"] == "group" and "--kl_in_reward" not in unmapped_options(mega)
    assert not mega.apply().algorithm.kl_in_reward  # Megatron's default is false
    spec = import_any((CORPUS / "ms-swift/train__grpo__internal__reinforce_plus_plus.sh").read_text()).apply()
    assert (spec.algorithm.advantage_estimator, spec.algorithm.scale_rewards) == ("reinforce_plus_plus", "batch")
    assert import_any("swift rlhf --rlhf_type grpo --advantage_estimator ppo").apply().algorithm.advantage_estimator \
        == "grpo"  # not an estimator here: unmapped with the spec's reason


def test_per_reward_normalisation_from_trl_and_ms_swift():
    trl = import_any("multi_objective_aggregation: normalize_then_sum\nscale_rewards: batch\nnum_generations: 4")
    spec = trl.apply()
    assert (spec.algorithm.multi_objective_aggregation, spec.algorithm.scale_rewards) == ("normalize_then_sum", "group")
    assert any("does not apply it with normalize_then_sum" in n for n in trl.notes)
    swift = import_any("swift rlhf --rlhf_type grpo --scale_rewards gdpo --reward_funcs accuracy format")
    assert swift.apply().algorithm.multi_objective_aggregation == "normalize_then_sum"
    assert "scale_rewards" in swift.applied and any("1e-8" in n for n in swift.notes)
    assert import_any("swift rlhf --rlhf_type grpo --scale_rewards gdpo --advantage_estimator rloo").apply() \
        .algorithm.advantage_estimator == "grpo"  # ms-swift's gdpo replaces the leave-one-out baseline
    rpp = import_any("swift rlhf --rlhf_type grpo --scale_rewards gdpo --advantage_estimator reinforce_plus_plus").apply()
    assert (rpp.algorithm.multi_objective_aggregation, rpp.algorithm.scale_rewards) == ("sum_then_normalize", "none")
    paper = import_any((CORPUS / "trl/paper_index__L629.py.txt").read_text()).apply()
    assert paper.algorithm.multi_objective_aggregation == "normalize_then_sum"


def test_vespo_and_its_parameters_from_trl():
    res = import_any((CORPUS / "trl/paper_index__L673.py.txt").read_text())
    spec = res.apply()
    assert spec.algorithm.loss_type == "vespo"
    assert not unmapped_options(res) & {"vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"}
    custom = import_any("loss_type: vespo\nvespo_k_pos: 1.5\nvespo_lambda_neg: 4\nnum_generations: 4").apply()
    assert (custom.algorithm.vespo_k_pos, custom.algorithm.vespo_lambda_neg) == (1.5, 4.0)


def test_prompt_bounds_and_chat_template_arguments():
    swift = import_any("swift rlhf --rlhf_type grpo --max_length 2048 --truncation_strategy delete "
                       "--enable_thinking false")
    assert swift.values["data.max_prompt_tokens"] == 2048 and swift.values["data.prompt_truncation"] == "delete"
    assert swift.values["data.chat_template_kwargs"] == {"enable_thinking": False}
    left = import_any("swift rlhf --rlhf_type grpo --max_length 1024")  # ms-swift's GRPO default: left
    assert left.values["data.prompt_truncation"] == "left"
    right = import_any("swift rlhf --rlhf_type grpo --max_length 1024 --truncation_strategy right")
    assert "--max_length" in unmapped_options(right) and "data.max_prompt_tokens" not in right.values
    trl = import_any("max_prompt_length: 256\nchat_template_kwargs: {enable_thinking: true}\n")
    assert trl.values["data.max_prompt_tokens"] == 256 and trl.values["data.prompt_truncation"] == "left"
    assert trl.values["data.chat_template_kwargs"] == {"enable_thinking": True}
    r1 = import_any("dataset_name: open-r1/OpenR1-Math-220k\ndataset_prompt_column: problem\n")
    assert r1.values["data.max_prompt_tokens"] == 512 and "max_prompt_length" in r1.defaults  # open-r1's default
    bad = import_any("chat_template_kwargs: '[1, 2]'\n")
    assert "chat_template_kwargs" in unmapped_options(bad)
    for res in (swift, trl, r1):
        res.apply()


def test_reference_sync_and_generation_batch_import():
    """sync_ref_model and its two parameters map as they are (ignored without it, as in TRL); a generation batch
    becomes rollout.steps_per_generation in optimizer steps: TRL and ms-swift count micro-batches (and
    generation_batch_size completions), Megatron global batches."""
    trl = import_any("beta: 0.04\nsync_ref_model: true\nref_model_mixup_alpha: 0.9\nref_model_sync_steps: 64\n"
                     "per_device_train_batch_size: 8\nnum_generations: 4\ngradient_accumulation_steps: 2\n"
                     "steps_per_generation: 6\n")
    spec = trl.apply()
    assert (spec.algorithm.sync_ref_model, spec.algorithm.ref_model_mixup_alpha, spec.algorithm.ref_model_sync_steps,
            spec.rollout.steps_per_generation, spec.algorithm.prompts_per_step) == (True, 0.9, 64, 3, 4)
    assert not unmapped_options(trl) & {"sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps",
                                        "steps_per_generation"}
    swift = import_any("swift rlhf --rlhf_type grpo --beta 0.04 --sync_ref_model true --ref_model_sync_steps 32")
    assert (swift.values["algorithm.sync_ref_model"], swift.values["algorithm.ref_model_sync_steps"]) == (True, 32)
    off = import_any("sync_ref_model: false\nref_model_mixup_alpha: 0.9\nref_model_sync_steps: 64\n").apply()
    assert (off.algorithm.sync_ref_model, off.algorithm.ref_model_sync_steps) == (False, 512)
    gbs = import_any("swift rlhf --rlhf_type grpo --per_device_train_batch_size 4 --num_generations 4 "
                     "--gradient_accumulation_steps 2 --generation_batch_size 32")  # 4 x 1 x 2 = 8 per step
    assert gbs.values["rollout.steps_per_generation"] == 4
    mega = import_any("megatron rlhf --rlhf_type grpo --global_batch_size 64 --micro_batch_size 4 "
                      "--num_generations 8 --steps_per_generation 4")
    assert mega.values["rollout.steps_per_generation"] == 4
    odd = import_any("per_device_train_batch_size: 8\nnum_generations: 4\ngradient_accumulation_steps: 4\n"
                     "steps_per_generation: 6\n")
    assert "steps_per_generation" in unmapped_options(odd) and "rollout.steps_per_generation" not in odd.values


def test_python_grpo_config_snippets():
    text = """
from peft import LoraConfig
training_args = GRPOConfig(
    learning_rate=1.0e-5,
    per_device_train_batch_size=16,
    num_generations=8,
    ...
)
trainer = GRPOTrainer(model="Qwen/Qwen2-0.5B", args=training_args, peft_config=LoraConfig(r=32, lora_alpha=16),
                      train_dataset=load_dataset("trl-lib/DeepMath-103K", split="train"))
"""
    opts, _ = parse_python_config(text)
    assert opts["use_peft"] is True and opts["lora_r"] == 32
    spec = import_any(text).apply()
    assert spec.model.finetune == "lora" and spec.model.lora_rank == 32 and spec.algorithm.learning_rate == 1e-5
    assert spec.model.name_or_path == "Qwen/Qwen2-0.5B" and spec.data.sources == ["trl-lib/DeepMath-103K"]
    assert spec.algorithm.prompts_per_step == 2


def test_trl_yaml_and_json():
    res = import_trl("model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\ndataset_name: trl-lib/tldr\nuse_peft: true\n"
                     "lora_r: 16\nlora_target_modules: [q_proj, v_proj]\nbeta: 0.0\nnum_generations: 16\n"
                     "per_device_train_batch_size: 8\ngradient_accumulation_steps: 4\nnum_processes: 2\n"
                     "scale_rewards: false\nmax_steps: 200\nwarmup_ratio: 0.1\nreport_to: none\noutput_dir: out\n")
    v = res.values
    assert v["model.finetune"] == "lora" and v["model.lora_rank"] == 16 and v["model.lora_targets"] == ["q_proj", "v_proj"]
    assert v["algorithm.scale_rewards"] == "none" and v["algorithm.prompts_per_step"] == 8 * 2 * 4 // 16
    assert v["algorithm.warmup_steps"] == 20 and v["output.report_to"] == [] and v["resources.nproc_per_node"] == 2
    assert "output_dir" in unmapped_options(res)
    js = import_any(json.dumps({"learning_rate": 3e-6, "num_generations": 4, "unknown_thing": 1}))
    assert js.values["algorithm.learning_rate"] == 3e-6 and "unknown_thing" in unmapped_options(js)


def test_parse_script_picks_the_grpo_training_line():
    script = "CUDA_VISIBLE_DEVICES=7 swift rollout --model m\n\nswift rlhf --rlhf_type dpo --model m\n" \
             "swift rlhf --rlhf_type grpo --model m2 --beta 0.1 > log.txt 2>&1 &\n"
    cmd = parse_script(script)
    assert cmd is not None and cmd.opts["model"] == "m2" and "log.txt" not in json.dumps(cmd.opts)


# ----------------------------------------------------------------------------- the corpus

def corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.glob("*/*") if p.is_file() and p.name != "README.md")


def source_options(text: str) -> set[str]:
    """The options a config gives, as the importer's result names them."""
    python = parse_python_config(text)
    if python is not None:
        return set(python[0])
    cmd = parse_script(text)
    if cmd is not None:
        return set(cmd.opts)
    import yaml

    data = yaml.safe_load(text)
    return set(data) if isinstance(data, dict) else set()


def test_corpus_imports_apply_or_say_why():
    files = corpus_files()
    assert len(files) >= 150
    ok = 0
    for path in files:
        text = path.read_text()
        res = import_any(text)  # never raises
        if res.error:
            continue
        res.apply()
        ok += 1
        named = set(res.applied) | set(res.defaults) | {u.option.lstrip("-") for u in res.unmapped}
        missing = source_options(text) - named
        assert not missing, f"{path.name}: options neither applied nor reported: {sorted(missing)}"
        assert all(u.reason for u in res.unmapped), path.name
    assert ok / len(files) >= 0.95, f"{ok}/{len(files)} imported"


HAND_CHECKED = {
    # file: (finetune, beta, learning_rate, prompts_per_step)
    "ms-swift/train__grpo__internal__vllm_72b_4gpu.sh": ("lora", 0.04, 1e-6, 1),  # 1 x 4 GPUs x 1 / 4
    "ms-swift/train__grpo__internal__qlora.sh": ("lora", 0.04, 1e-5, 8),  # 4 x 4 GPUs x 4 / 8
    "ms-swift/train__grpo__multi_node__colocate_multi_node1.sh": ("full", 0.04, 1e-6, 2),  # 1 x 4 x 2 nodes x 2 / 8
    "ms-swift/megatron__grpo__dense_colocate.sh": ("full", 0.001, 1e-6, 16),  # global_batch_size 128 / 8
    "open-r1/main__Qwen2.5-1.5B-Instruct__grpo__config_demo.yaml": ("full", 0.04, 2e-5, 28),  # 16 x 7 x 4 / 16
    "trl/peft_integration__L293.sh": ("lora", 0.0, 1e-5, 1),
    "trl/paper_index__L168.py.txt": ("full", 0.0, 1e-6, 32),  # DAPO: 512 / 16
    "trl/clis__L273.sh": ("full", 0.0, 1e-6, 4),  # 8 x 4 processes / 8
}


@pytest.mark.parametrize("name", sorted(HAND_CHECKED))
def test_hand_checked_corpus_entries(name):
    finetune, beta, lr, pps = HAND_CHECKED[name]
    spec = import_any((CORPUS / name).read_text()).apply()
    assert (spec.model.finetune, spec.algorithm.beta, spec.algorithm.learning_rate,
            spec.algorithm.prompts_per_step) == (finetune, beta, lr, pps)


def test_hand_checked_details():
    qlora = import_any((CORPUS / "ms-swift/train__grpo__internal__qlora.sh").read_text())
    assert qlora.values["data.system_prompt"].startswith("You are a helpful math assistant.")  # $SYSTEM_PROMPT
    assert qlora.values["data.solution_column"] == "answer"
    multi = import_any((CORPUS / "ms-swift/train__grpo__multi_node__colocate_multi_node1.sh").read_text()).apply()
    assert (multi.resources.nnodes, multi.algorithm.max_steps, multi.algorithm.warmup_steps) == (2, 2500, 125)
    r1 = import_any((CORPUS / "open-r1/main__Qwen2.5-1.5B-Instruct__grpo__config_demo.yaml").read_text()).apply()
    assert r1.data.prompt_column == "problem" and r1.data.system_prompt.startswith("You are a helpful AI Assistant")
    assert [f.name for f in r1.rewards.functions] == ["accuracy", "format", "tag_count"]


def test_accelerate_config_and_rollout_gpus(tmp_path):
    (tmp_path / "zero3.yaml").write_text("num_machines: 1\nnum_processes: 8\ndeepspeed_config:\n  zero_stage: 3\n")
    res = import_any("accelerate launch --config_file zero3.yaml src/open_r1/grpo.py --per_device_train_batch_size 2 "
                     "--num_generations 8 --dataset_prompt_column problem", base_dir=tmp_path)
    assert res.values["algorithm.prompts_per_step"] == 2 and res.values["resources.deepspeed_stage"] == 3
    server = import_any("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 NPROC_PER_NODE=6 swift rlhf --rlhf_type grpo "
                        "--use_vllm true --vllm_server_host 127.0.0.1 --per_device_train_batch_size 4 "
                        "--num_generations 8")
    assert server.values["rollout.placement"] == "separate"
    assert server.values["resources.train_gpus"] == [0, 1, 2, 3, 4, 5] and server.values["algorithm.prompts_per_step"] == 3


def test_multi_turn_limits_import_and_the_plugins_say_what_to_write() -> None:
    """ms-swift's --max_turns and TRL's max_tool_calling_iterations are rollout.max_turns; ms-swift's scheduler
    plugin is reported with what to write instead."""
    p = CORPUS / "ms-swift" / "train__grpo__internal__vllm_multi_turn.sh"
    r = import_any(p.read_text(), p.name)
    assert r.values["rollout.max_turns"] == 3
    sched = [u for u in r.unmapped if u.option.lstrip("-") == "multi_turn_scheduler"]
    assert sched and "tools.environment" in sched[0].reason
    r = import_any("max_tool_calling_iterations: 4\nlearning_rate: 1.0e-6\nnum_generations: 4\n", "grpo.yaml")
    assert r.values["rollout.max_turns"] == 5


def test_the_engine_context_length_maps_and_reaches_the_worker() -> None:
    from backend.checks import check_spec
    from backend.train.builders import worker_config

    res = import_any("swift rlhf --rlhf_type grpo --use_vllm true --vllm_max_model_len 4096 "
                     "--max_completion_length 1024")
    assert res.values["rollout.max_model_len"] == 4096 and "--vllm_max_model_len" not in unmapped_options(res)
    spec = res.apply()
    root = Path(__file__).parent.parent
    assert worker_config(spec, root).max_model_len == 4096
    short = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"max_model_len": 1024})})
    assert any(i.field == "rollout.max_model_len" for i in check_spec(short, root))
    assert not any(i.field == "rollout.max_model_len" for i in check_spec(spec, root))


def test_a_refused_prompt_bound_sets_neither_field_and_the_context_bounds_prompts() -> None:
    tiny = import_any("swift rlhf --rlhf_type grpo --max_length 8")
    assert "--max_length" in unmapped_options(tiny)
    assert "data.max_prompt_tokens" not in tiny.values and "data.prompt_truncation" not in tiny.values
    ctx = import_any("vllm_max_model_length: 2048\nmax_completion_length: 512\nuse_vllm: true\n")
    assert ctx.values["rollout.max_model_len"] == 2048 and ctx.values["data.max_prompt_tokens"] == 1536
    assert any("leaves 1536 for the prompt" in n for n in ctx.notes)
    old_trl = import_any("max_prompt_length: 256\nuse_vllm: true\n")
    assert any("before 0.19" in n for n in old_trl.notes)
    bad_kwargs = import_any("chat_template_kwargs: {tokenize: true}\n")
    assert "chat_template_kwargs" in unmapped_options(bad_kwargs)
    bad_kwargs.apply()


def test_vespo_at_sequence_level_is_the_token_level_run() -> None:
    res = import_any("loss_type: vespo\nimportance_sampling_level: sequence\n")
    assert res.values["algorithm.importance_sampling_level"] == "token"
    assert any("VESPO" in n for n in res.notes)
    from backend.checks import check_spec

    assert not any(i.field == "algorithm.importance_sampling_level" for i in check_spec(res.apply()))
