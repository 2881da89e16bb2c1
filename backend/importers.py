"""Map other tools' GRPO configurations onto RunSpec fields.

What it reads:
- ms-swift: `swift rlhf --rlhf_type grpo ...`, `megatron rlhf ...`, and torchrun / accelerate / python lines that
  run `swift/cli/rlhf.py`, alone or inside a pasted shell script (continuation lines, comments, `export`s);
- TRL: a GRPOConfig (with the ScriptArguments / ModelConfig keys TRL's grpo script reads) as YAML or JSON, an
  open-r1 recipe (a TRL config read by open-r1's grpo.py), or a `trl grpo` / `accelerate launch ... grpo.py` line.

The contract (tests/test_importers.py holds it on a corpus of real configs, tests/data/importers/):
- every option of the source is applied (named in `applied`) or listed in `unmapped` with a reason;
- an option the source omits gets the SOURCE tool's default, from one table per tool and version (`DEFAULTS`),
  and `defaults` says which ones were filled in: ms-swift omitting `--beta` means 0.04, not RunSpec's default;
- launch context (NPROC_PER_NODE, NNODES, CUDA_VISIBLE_DEVICES, torchrun/accelerate process counts, exports on
  earlier lines) is read, and the global batch derived from it;
- a value RunSpec cannot hold is listed as unmapped with the spec's own message, so `apply()` succeeds;
- nothing raises: text that is neither source gives an ImportResult whose `error` says why.

Pure functions but for one read: a file the source names (ms-swift's `--system prompt.txt`, `--config x.yaml`,
an accelerate config) is read only when `base_dir` is given and the file lies inside it.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from backend.spec import RunSpec, SpecError, spec_from_dict

# The versions the defaults tables were read from (the source files are named beside each table).
SWIFT_SOURCE = "ms-swift 4.6.0.dev0 (modelscope/ms-swift@3602360)"
MEGATRON_SOURCE = "ms-swift Megatron 4.6.0.dev0 (modelscope/ms-swift@3602360)"
TRL_SOURCE = "TRL 1.10.0.dev0 (huggingface/trl@f2cd577)"
OPENR1_SOURCE = "open-r1 (huggingface/open-r1@1416fa0, pinned trl==0.18.0)"


@dataclass(frozen=True)
class Unmapped:
    option: str  # as the source spells it: '--output_dir', 'output_dir', 'MAX_PIXELS'
    value: str
    reason: str

    def __str__(self) -> str:
        return f"{self.option} {self.value}".strip() + f" ({self.reason})"


@dataclass
class ImportResult:
    source: str = ""  # the tool, and the version its defaults come from
    values: dict[str, Any] = field(default_factory=dict)  # 'section.field' -> value
    applied: list[str] = field(default_factory=list)  # the source's options that were applied
    unmapped: list[Unmapped] = field(default_factory=list)
    defaults: dict[str, Any] = field(default_factory=dict)  # source option -> the source default filled in
    notes: list[str] = field(default_factory=list)  # conversions that needed an assumption
    error: str = ""  # the text was not a config at all
    origin: dict[str, str] = field(default_factory=dict, repr=False)  # 'section.field' -> the option that set it

    def apply(self, base: RunSpec | None = None) -> RunSpec:
        """`base` (default: RunSpec defaults) with the imported values set. The importer has already moved every
        value RunSpec refuses to `unmapped`, so this raises SpecError only when `base` itself is invalid."""
        data = (base or RunSpec()).model_dump(mode="json")
        for path, value in self.values.items():
            section, name = path.split(".")
            data[section][name] = value
        return spec_from_dict(data)


# ----------------------------------------------------------------------------- the source tools' defaults
# One table per tool and version, in the source's own option names and values; an option the config omits is fed
# through the same mapping as a given one. Read from:
#   ms-swift  swift/arguments/{base_args/base_args,rlhf_args,sft_args,tuner_args}.py, swift/trainers/arguments.py,
#             swift/rlhf_trainers/args_mixin.py (GRPO: beta 0.04, gradient_accumulation_steps 1, loss_type grpo)
#   Megatron  swift/megatron/arguments/megatron_args.py
#   TRL       trl/trainer/grpo_config.py, trl/trainer/base_config.py, trl/trainer/model_config.py
#   open-r1   src/open_r1/configs.py over trl v0.18.0's grpo_config.py; num_processes 7: the README's launch
#             (8 GPUs, one for the vLLM server)
_SWIFT_COMMON: dict[str, Any] = {
    "lora_rank": 8, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": ["all-linear"],
    "torch_dtype": "auto",  # None in ms-swift: the model's own dtype
    "beta": 0.04, "lr_scheduler_type": "cosine", "weight_decay": 0.1, "warmup_ratio": 0.0, "max_grad_norm": 1.0,
    "num_generations": 8, "max_completion_length": 512, "temperature": 0.9, "top_k": -1, "top_p": 1.0,
    "epsilon": 0.2, "loss_type": "grpo", "scale_rewards": "group", "num_iterations": 1,
    "importance_sampling_level": "token", "seed": 42, "num_train_epochs": 3, "disable_dropout": False,
    "dynamic_sample": False, "max_resample_times": 3, "overlong_filter": False, "top_entropy_quantile": 1.0,
    "tau_pos": 1.0, "tau_neg": 1.05, "vllm_gpu_memory_utilization": 0.9, "sleep_level": 0,
    "cosine_min_len_value_wrong": -0.5, "cosine_max_len_value_wrong": 0.0, "cosine_min_len_value_correct": 1.0,
    "cosine_max_len_value_correct": 0.5, "repetition_n_grams": 3, "repetition_max_penalty": -1.0,
}
DEFAULTS: dict[str, dict[str, Any]] = {
    SWIFT_SOURCE: {**_SWIFT_COMMON, "tuner_type": "lora", "gradient_checkpointing": True, "max_steps": -1,
                   "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "save_steps": 500,
                   "report_to": ["tensorboard"]},
    MEGATRON_SOURCE: {**_SWIFT_COMMON, "tuner_type": "full", "recompute_granularity": "selective",
                      "micro_batch_size": 1, "global_batch_size": 16, "num_train_epochs": None},
    TRL_SOURCE: {
        "learning_rate": 1e-6, "beta": 0.0, "num_generations": 8, "max_completion_length": 512,
        "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "lr_scheduler_type": "linear",
        "weight_decay": 0.0, "max_grad_norm": 1.0, "seed": 42, "num_train_epochs": 3, "max_steps": -1,
        "loss_type": "dapo", "scale_rewards": "group", "epsilon": 0.2, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
        "bf16": True, "gradient_checkpointing": True, "disable_dropout": False, "use_peft": False, "lora_r": 16,
        "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": ["q_proj", "v_proj"], "num_iterations": 1,
        "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3, "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": 3.0,
        "importance_sampling_level": "token", "save_steps": 500, "num_processes": 1,
    },
    OPENR1_SOURCE: {
        "learning_rate": 1e-6, "beta": 0.04, "num_generations": 8, "max_completion_length": 256,
        "max_prompt_length": 512, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
        "lr_scheduler_type": "linear", "weight_decay": 0.0, "max_grad_norm": 1.0, "seed": 42, "num_train_epochs": 3,
        "max_steps": -1, "loss_type": "bnpo", "scale_rewards": True, "epsilon": 0.2, "temperature": 1.0,
        "top_p": 1.0, "bf16": False, "gradient_checkpointing": False, "disable_dropout": False, "use_peft": False,
        "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": ["q_proj", "v_proj"],
        "num_iterations": 1, "vllm_mode": "server", "vllm_gpu_memory_utilization": 0.3,
        "vllm_importance_sampling_correction": False, "importance_sampling_level": "token", "save_steps": 500,
        "reward_funcs": ["accuracy", "format", "tag_count"], "dataset_prompt_column": "prompt",
        "cosine_min_value_wrong": 0.0, "cosine_max_value_wrong": -0.5, "cosine_min_value_correct": 0.5,
        "cosine_max_value_correct": 1.0, "cosine_max_len": 1000, "repetition_n_grams": 3,
        "repetition_max_penalty": -1.0, "max_completion_len": 16384, "soft_punish_cache": 4096, "num_processes": 7,
        "code_language": "python",
    },
}
# defaults that depend on another option: ms-swift's learning rate follows the tuner
_SWIFT_LR = {"lora": 1e-4, "full": 1e-5}
# ... and its scale_rewards and kl_in_reward follow advantage_estimator (swift/arguments/rlhf_args.py; Megatron's
# have fixed defaults: group, false)
_SWIFT_SCALE = {"grpo": "group", "rloo": "none", "reinforce_plus_plus": "batch"}
_SWIFT_KL_IN_REWARD = {"rloo", "reinforce_plus_plus"}

# Each source's built-in reward names -> ours, where ours computes the same thing (backend/rewards/; a test holds
# the targets to the registry). The reward's own options become its params (_REWARD_PARAMS).
_REWARD_ALIASES: dict[str, dict[str, str]] = {
    "swift": {"accuracy": "accuracy", "format": "format", "cosine": "cosine", "repetition": "repetition",
              "soft_overlong": "soft_overlong", "react_format": "react_format"},
    "open-r1": {"accuracy": "accuracy", "format": "format", "tag_count": "tag_count", "cosine": "cosine",
                "repetition_penalty": "repetition", "length": "length", "soft_overlong_punishment": "soft_overlong",
                "code": "code", "binary_code": "code", "code_format": "code_format"},
    "trl": {"accuracy_reward": "accuracy"},
}
_OURS = {name for table in _REWARD_ALIASES.values() for name in table.values()}
# an alias that is one of our built-ins with a parameter set (open-r1's binary_code: the code reward, all or nothing)
_ALIAS_PARAMS: dict[str, dict[str, Any]] = {"binary_code": {"binary": True}}
# the sources' built-ins we have no equivalent of: dropped from the rewards, with the reason
_REWARDS_LACKING: dict[str, str] = {
    "ioi_code": "runs IOI solutions in a Piston sandbox", "cf_code": "runs Codeforces solutions in a sandbox",
    "reasoning_steps": "counts 'Step 1:'-style markers",
    "toolbench": "ToolBench's tool-call match",
    "math": "ms-swift's MathORM (its own answer extraction)",
    "think_format_reward": "TRL's <think>-only format check",
    "reasoning_accuracy_reward": "TRL's accuracy on the text after </think>",
}
# a reward's options in the source -> (our reward, its param)
_REWARD_PARAMS: dict[str, dict[str, tuple[str, str]]] = {
    "swift": {
        "cosine_min_len_value_wrong": ("cosine", "min_value_wrong"),
        "cosine_max_len_value_wrong": ("cosine", "max_value_wrong"),
        "cosine_min_len_value_correct": ("cosine", "max_value_correct"),  # length 0, correct: the high end
        "cosine_max_len_value_correct": ("cosine", "min_value_correct"),
        "cosine_max_len": ("cosine", "max_len"),
        "repetition_n_grams": ("repetition", "ngram_size"), "repetition_max_penalty": ("repetition", "max_penalty"),
        "soft_max_length": ("soft_overlong", "max_completion_len"), "soft_cache_length": ("soft_overlong", "cache_len"),
    },
    "open-r1": {
        "cosine_min_value_wrong": ("cosine", "min_value_wrong"), "cosine_max_value_wrong": ("cosine", "max_value_wrong"),
        "cosine_min_value_correct": ("cosine", "min_value_correct"),
        "cosine_max_value_correct": ("cosine", "max_value_correct"), "cosine_max_len": ("cosine", "max_len"),
        "repetition_n_grams": ("repetition", "ngram_size"), "repetition_max_penalty": ("repetition", "max_penalty"),
        "max_completion_len": ("soft_overlong", "max_completion_len"),
        "soft_punish_cache": ("soft_overlong", "cache_len"), "code_language": ("code_format", "language"),
    },
    "trl": {},
}
_PARAM_TYPES = {"max_len": int, "ngram_size": int, "max_completion_len": int, "cache_len": int, "language": str}


# ----------------------------------------------------------------------------- why an option is not applied

_REASONS: list[tuple[frozenset[str], str]] = [
    (frozenset({"output_dir", "logging_dir", "logging_steps", "logging_first_step", "logging_strategy", "log_level",
                "overwrite_output_dir", "save_strategy", "save_only_model", "save_safetensors", "push_to_hub",
                "hub_model_id", "hub_strategy", "hub_private_repo", "hub_model_revision", "push_to_hub_revision",
                "overwrite_hub_revision", "wandb_entity", "wandb_project", "wandb_run_group", "wandb_log_unique_prompts",
                "log_unique_prompts", "num_completions_to_print", "callbacks", "benchmarks", "add_version",
                "create_checkpoint_symlink", "no_save_optim", "no_save_rng", "log_entropy", "save_on_each_node",
                "log_rollout_offpolicy_metrics", "logging_nan_inf_filter", "log_interval", "save", "log_multimodal",
                "save_interval", "hub_token", "resume_only_model", "ignore_args_error", "log_completions_hub_repo",
                "merge_lora", "check_model", "safe_serialization"}),
     "bookkeeping of the source (output folders, logs, hub uploads): the studio's run directory covers it"),
    (frozenset({"attn_impl", "attn_implementation", "attention_backend", "use_liger_kernel", "use_liger_loss",
                "padding_free", "dataloader_num_workers", "dataset_num_proc", "dataloader_drop_last",
                "dataloader_persistent_workers", "dataloader_pin_memory", "vllm_enforce_eager", "vllm_max_num_seqs",
                "vllm_enable_prefix_caching", "vllm_disable_custom_all_reduce", "vllm_use_async_engine",
                "move_model_batches", "torch_compile", "ddp_timeout", "ddp_find_unused_parameters",
                "ddp_backend", "gradient_checkpointing_kwargs", "cache_implementation", "enable_flattened_weight_sync",
                "vllm_limit_mm_per_prompt", "recompute_method", "recompute_num_layers", "optimizer_cpu_offload",
                "use_precision_aware_optimizer", "cast_lm_head_to_fp32", "vllm_model_impl", "use_cpu_initialization",
                "offload_bridge", "lazy_tokenize", "streaming", "packing", "max_num_seqs", "torch_empty_cache_steps",
                "vllm_disable_cascade_attn", "vllm_mm_processor_cache_gb", "model_init_kwargs", "dataset_shuffle",
                "shuffle_dataset", "use_ray", "vllm_server_timeout", "vllm_group_port", "vllm_server_group_port", "load_from_cache_file",
                "gradient_accumulation_fusion", "use_liger", "use_transformers_continuous_batching",
                "transformers_continuous_batching_config", "ds3_gather_for_generation", "use_transformers_paged"}),
     "performance tuning of the source's stack: the trainer here chooses its own"),
    (frozenset({"tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel", "sequence_parallel_size",
                "decoder_first_pipeline_num_layers", "moe_grouped_gemm", "moe_permute_fusion",
                "moe_shared_expert_overlap", "moe_aux_loss_coeff", "moe_expert_capacity_factor", "router_aux_loss_coef"}),
     "Megatron/sequence model parallelism: training here is data-parallel (ZeRO for large models); "
     "the data-parallel size was used for the global batch"),
    (frozenset({"do_eval", "eval_strategy", "evaluation_strategy", "per_device_eval_batch_size", "num_generations_eval",
                "eval_on_start", "split_dataset_ratio", "eval_limit", "eval_datasets", "eval_interval", "eval_iters",
                "eval_use_evalscope", "eval_dataset_args", "eval_generation_config"}),
     "evaluation settings of the source: here evaluation runs on data.eval_sources every output.eval_steps"),
    (frozenset({"model_revision", "model_type", "ref_model", "ref_model_type", "ref_model_revision", "template",
                "dataset_test_split", "dataset_streaming", "columns", "hub_model_revision", "use_chat_template"}),
     "the source's loading details: the model is read at its main revision, the reference model is the initial "
     "policy and the dataset's own columns are read"),
    (frozenset({"quant_bits", "quant_method", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
                "bnb_4bit_compute_dtype", "use_bnb_nested_quant", "bnb_4bit_use_double_quant", "bnb_4bit_quant_storage"}),
     "quantised (QLoRA) base weights are not supported here: the run trains LoRA on unquantised weights"),
    (frozenset({"lora_bias", "use_rslora", "use_dora", "lora_dtype", "modules_to_save", "target_regex", "lora_modules_to_save",
                "lora_task_type", "freeze_vit", "freeze_aligner", "freeze_llm", "freeze_parameters",
                "freeze_parameters_ratio", "trainable_parameters", "vit_lr", "aligner_lr", "lora_target_parameters",
                "vllm_max_lora_rank", "vllm_enable_lora", "init_weights"}),
     "a LoRA variant or partial freezing the trainer here does not offer"),
    (frozenset({"multi_turn_scheduler", "gym_env", "use_gym_env", "completion_length_limit_scope",
                "vllm_server_pass_dataset", "tools", "agent_template", "context_manager"}),
     "the source's multi-turn scheduler, gym environment or tool objects are its own Python plugins: write the "
     "environment as a tools.environment class or the tools as tools.functions (docs/agent.md)"),
    (frozenset({"teacher_model", "teacher_model_type", "teacher_model_revision", "teacher_model_server",
                "teacher_kl_coef", "teacher_tag_key", "offload_teacher_model", "gkd_logits_topk", "lmbda", "sft_alpha",
                "seq_kd", "teacher_deepspeed"}),
     "on-policy distillation from a teacher is not implemented here"),
    (frozenset({"chord_sft_dataset", "chord_sft_per_device_train_batch_size", "chord_enable_phi_function",
                "chord_mu_warmup_steps", "chord_mu_decay_steps", "chord_mu_peak", "chord_mu_valley"}),
     "CHORD (SFT mixed into GRPO) is not implemented here"),
    (frozenset({"advantage_reweight", "rlsd_lambda", "rlsd_reweight_clip_range", "rlsd_lambda_warmup_steps",
                "rlsd_lambda_decay_steps", "rlsd_negative_only", "sdar_loss_coef", "sdar_gate_beta"}),
     "advantage reweighting variants are not implemented here"),
    (frozenset({"real_tau", "fipo_decay_rate", "fipo_clip_range", "fipo_clip_high_only", "fipo_safety_threshold"}),
     "a parameter of a loss type (real, fipo) that is not implemented here"),
    (frozenset({"min_p", "repetition_penalty", "stop_words", "structured_outputs_regex", "vllm_structured_outputs_regex",
                "vllm_guided_decoding_regex", "generation_kwargs", "max_new_tokens_eval"}),
     "a sampling option the rollout here does not offer (temperature, top_p, top_k only)"),
    (frozenset({"parallel_code_exec_per_proc", "e2b_router_url", "morph_router_url", "code_eval_test_batch_size",
                "code_eval_scoring_mode", "code_provider", "ioi_provider"}),
     "a setting of open-r1's code execution providers (E2B, Morph, Piston): the code rewards here run in the local "
     "sandbox (backend/sandbox.py)"),
    (frozenset({"fsdp", "fsdp_config"}), "FSDP: sharding here is DeepSpeed ZeRO (resources.deepspeed_stage)"),
    (frozenset({"loss_scale"}), "ms-swift's per-turn loss weights: the completion alone is trained here"),
    (frozenset({"chat_template"}), "a custom chat template: the tokenizer's own template is applied here"),
    (frozenset({"vllm_pipeline_parallel_size",
                "vllm_enable_expert_parallel", "vllm_quantization", "vllm_reasoning_parser", "vllm_speculative_config",
                "vllm_engine_kwargs", "vllm_kv_cache_dtype"}),
     "an engine setting the rollout here does not expose: the engine's context follows the model and "
     "max_completion_length"),
    (frozenset({"vllm_server_host", "vllm_server_port", "vllm_server_base_url", "num_infer_workers",
                "remote_gen_model_url", "server_ip", "server_port"}),
     "the address of the source's vLLM server: rollout workers here are started by the trainer or named in "
     "rollout.worker_urls"),
    (frozenset({"offload_model", "offload_optimizer"}),
     "offloading the model/optimizer during rollout is not implemented here (resources.offload is DeepSpeed's "
     "optimizer offload)"),
    (frozenset({"reward_model_plugin", "reward_model_type", "reward_model_revision", "reward_processing_classes"}),
     "a reward model's loader plugin: the reward_model reward here reads a sequence-classification model"),
    (frozenset({"rollout_importance_sampling_mode", "rollout_importance_sampling_threshold", "vllm_importance_sampling_clip_min"}),
     "ms-swift's rollout importance sampling: use rollout.vllm_importance_sampling_* here"),
    (frozenset({"dataset_configs", "dataset_mixture"}),
     "several configs of one dataset, or a mixture's per-dataset settings: give each config as its own source "
     "('org/name:config')"),
    (frozenset({"lr_scheduler_kwargs", "min_lr", "lr_decay_iters", "optim", "adam_beta1", "adam_beta2", "adam_epsilon",
                "warmup_steps_ratio", "lr_warmup_init"}),
     "an optimizer/schedule detail not offered here (AdamW, schedule to 0)"),
    (frozenset({"resume_from_checkpoint", "adapters", "ref_adapters", "load", "mcore_model", "mcore_adapter",
                "mcore_ref_adapter"}),
     "starting from a checkpoint or adapter of the source: give its merged weights as model.name_or_path"),
]
_REASON_OF = {name: reason for names, reason in _REASONS for name in names}
_NO_EQUIVALENT = "no RunSpec equivalent"


def _reason(key: str) -> str:
    return _REASON_OF.get(key, _NO_EQUIVALENT)


# ----------------------------------------------------------------------------- value converters

_NULL = ("none", "null", "~", "")


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) and v else v


def _bool(v: Any) -> bool:
    v = _first(v)
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes", "on", "y")


def _num(v: Any) -> float:
    return float(_first(v))


def _int(v: Any) -> int:
    return int(float(_first(v)))


def _is_null(v: Any) -> bool:
    v = _first(v)
    return v is None or (isinstance(v, str) and v.strip().lower() in _NULL) or v == []


def _list(v: Any) -> list[str]:
    """A list option: YAML list, space-separated CLI values, or one comma-separated string."""
    items = v if isinstance(v, list) else [v]
    out: list[str] = []
    for x in items:
        if x is None:
            continue
        out += [p.strip() for p in str(x).split(",") if p.strip()]
    return out


def _floats(v: Any) -> list[float]:
    return [float(x) for x in _list(v)]


def _off_if_none(v: Any) -> float:
    """An optional number (None = off in TRL) as RunSpec's 0 = off."""
    return 0.0 if _is_null(v) else _num(v)


def _scale_rewards(v: Any) -> str:
    s = str(_first(v)).strip().lower()
    if s in ("group", "batch", "none"):
        return s
    return "group" if _bool(s) else "none"


def _text(v: Any) -> str:
    return " ".join(str(x) for x in v) if isinstance(v, list) else str(v)


_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
           "fp32": "float32", "float32": "float32", "float": "float32", "auto": "auto"}
_SCHEDULERS = {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine",
               "cosine_with_min_lr": "cosine", "cosine_warmup_with_min_lr": "cosine"}
_REPORT = {"tensorboard", "wandb", "swanlab"}

# option (the same name in ms-swift and TRL, or an alias either accepts) -> (field, converter)
_COMMON: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "lora_rank": ("model.lora_rank", _int),
    "lora_r": ("model.lora_rank", _int),
    "lora_alpha": ("model.lora_alpha", _int),
    "lora_dropout": ("model.lora_dropout", _num),
    "target_modules": ("model.lora_targets", _list),
    "lora_target_modules": ("model.lora_targets", _list),
    "gradient_checkpointing": ("model.gradient_checkpointing", _bool),
    "trust_remote_code": ("model.trust_remote_code", _bool),
    "num_generations": ("rollout.num_generations", _int),
    "temperature": ("rollout.temperature", _num),
    "top_p": ("rollout.top_p", _num),
    "top_k": ("rollout.top_k", lambda v: 0 if _is_null(v) else max(0, _int(v))),  # -1 / None (off) is 0 here
    "max_completion_length": ("rollout.max_completion_length", _int),
    "max_turns": ("rollout.max_turns", _int),  # ms-swift
    # TRL: tool rounds after the first turn (None: unbounded there, the most here)
    "max_tool_calling_iterations": ("rollout.max_turns", lambda v: 100 if _is_null(v) else min(_int(v) + 1, 100)),
    "max_new_tokens": ("rollout.max_completion_length", _int),  # ms-swift's older name
    "vllm_gpu_memory_utilization": ("rollout.gpu_memory_utilization", _num),
    # None: the engine's own context, 0 here
    "vllm_max_model_len": ("rollout.max_model_len", lambda v: 0 if _is_null(v) else _int(v)),  # ms-swift's
    "vllm_max_model_length": ("rollout.max_model_len", lambda v: 0 if _is_null(v) else _int(v)),  # TRL's
    "vllm_tensor_parallel_size": ("rollout.tensor_parallel_size", _int),
    "vllm_data_parallel_size": ("rollout.data_parallel_size", _int),
    "vllm_enable_sleep_mode": ("rollout.sleep", _bool),
    "sleep_level": ("rollout.sleep", lambda v: _int(v) > 0),
    "async_generate": ("rollout.async_generation", _bool),
    "vllm_importance_sampling_correction": ("rollout.vllm_importance_sampling_correction", _bool),
    "vllm_importance_sampling_mode": ("rollout.vllm_importance_sampling_mode", lambda v: str(_first(v))),
    "vllm_importance_sampling_clip_max": ("rollout.vllm_importance_sampling_clip_max", _num),
    "vllm_importance_sampling_cap": ("rollout.vllm_importance_sampling_clip_max", _num),  # TRL < 1.6's name
    "beta": ("algorithm.beta", _num),
    "epsilon": ("algorithm.epsilon", _num),
    "epsilon_high": ("algorithm.epsilon_high", _off_if_none),  # None: the same as epsilon, 0 here
    "num_iterations": ("algorithm.num_iterations", _int),
    "loss_type": ("algorithm.loss_type", lambda v: str(_first(v)).lower()),
    "scale_rewards": ("algorithm.scale_rewards", _scale_rewards),
    "delta": ("algorithm.delta", _off_if_none),
    "sapo_temperature_pos": ("algorithm.sapo_temperature_pos", _num),
    "sapo_temperature_neg": ("algorithm.sapo_temperature_neg", _num),
    "tau_pos": ("algorithm.sapo_temperature_pos", _num),  # ms-swift's names for the SAPO temperatures
    "tau_neg": ("algorithm.sapo_temperature_neg", _num),
    "vespo_k_pos": ("algorithm.vespo_k_pos", _num),  # TRL
    "vespo_lambda_pos": ("algorithm.vespo_lambda_pos", _num),
    "vespo_k_neg": ("algorithm.vespo_k_neg", _num),
    "vespo_lambda_neg": ("algorithm.vespo_lambda_neg", _num),
    "advantage_estimator": ("algorithm.advantage_estimator", lambda v: str(_first(v)).lower()),  # ms-swift
    "kl_in_reward": ("algorithm.kl_in_reward", _bool),  # ms-swift (read in _map_common: beta 0, gdpo turn it off)
    "multi_objective_aggregation": ("algorithm.multi_objective_aggregation", lambda v: str(_first(v)).lower()),  # TRL
    "use_bias_correction_kl": ("algorithm.use_bias_correction_kl", _bool),
    "off_policy_mask_threshold": ("algorithm.off_policy_mask_threshold", _off_if_none),
    "off_policy_sequence_mask_delta": ("algorithm.off_policy_mask_threshold", _off_if_none),  # ms-swift's name
    "top_entropy_quantile": ("algorithm.top_entropy_quantile", _num),
    "entropy_coef": ("algorithm.entropy_coef", _num),
    "use_adaptive_entropy": ("algorithm.use_adaptive_entropy", _bool),
    "entropy_target": ("algorithm.entropy_target", _num),
    "entropy_coef_min": ("algorithm.entropy_coef_min", _num),
    "entropy_coef_max": ("algorithm.entropy_coef_max", _num),
    "entropy_coef_delta": ("algorithm.entropy_coef_delta", _num),
    "disable_dropout": ("algorithm.disable_dropout", _bool),
    "importance_sampling_level": ("algorithm.importance_sampling_level", lambda v: str(_first(v)).lower()),
    "mask_truncated_completions": ("algorithm.mask_truncated_completions", _bool),
    "overlong_filter": ("algorithm.mask_truncated_completions", _bool),  # ms-swift's name
    "dynamic_sample": ("algorithm.dynamic_sampling", _bool),
    "max_resample_times": ("algorithm.dynamic_sampling_max_retries", _int),
    "learning_rate": ("algorithm.learning_rate", _num),
    "lr": ("algorithm.learning_rate", _num),  # Megatron's name
    "warmup_steps": ("algorithm.warmup_steps", _int),
    "lr_warmup_iters": ("algorithm.warmup_steps", _int),
    "weight_decay": ("algorithm.weight_decay", _num),
    "max_grad_norm": ("algorithm.max_grad_norm", _num),
    "clip_grad": ("algorithm.max_grad_norm", _num),
    "gradient_accumulation_steps": ("algorithm.gradient_accumulation_steps", _int),
    "seed": ("algorithm.seed", _int),
    "save_steps": ("output.save_steps", _int),
    "save_total_limit": ("output.save_total_limit", lambda v: 0 if _is_null(v) else _int(v)),
    "eval_steps": ("output.eval_steps", _int),
    "run_name": ("output.run_name", lambda v: str(_first(v))),
    "dataset_prompt_column": ("data.prompt_column", lambda v: str(_first(v))),
    "system_prompt": ("data.system_prompt", _text),
}
# options whose null means something (off, the same as another option): passed on as None; every other null is
# read as "not given", so the source's default applies
_NULL_MEANS = {"epsilon_high", "delta", "off_policy_mask_threshold", "off_policy_sequence_mask_delta", "top_k",
               "save_total_limit", "max_prompt_length", "max_length", "steps_per_generation", "generation_batch_size",
               "chat_template_kwargs", "vllm_max_model_len", "vllm_max_model_length", "reward_weights"}
# options read later, in the whole-config steps (batch, steps, rewards, launch)
_LATER = {"per_device_train_batch_size", "micro_batch_size", "global_batch_size", "warmup_ratio",
          "lr_warmup_fraction", "num_train_epochs", "max_steps", "train_iters", "generation_batch_size",
          "steps_per_generation", "reward_funcs", "reward_weights", "reward_model", "reward_model_name_or_path",
          "num_processes"} | {k for table in _REWARD_PARAMS.values() for k in table}


# ----------------------------------------------------------------------------- one import in progress

class _Ctx:
    """The result being built, and where each value came from."""

    def __init__(self, source: str, tool: str, opts: dict[str, Any], shown: Callable[[str], str],
                 base_dir: Path | None):
        self.res = ImportResult(source=source)
        self.tool = tool  # 'swift', 'megatron', 'trl', 'open-r1'
        self.opts = opts  # option -> value (CLI: a str, a list of str, or 'true' for a bare flag)
        self.shown = shown  # how the source spells an option: '--beta' or 'beta'
        self.base_dir = base_dir
        self.defaulted: set[str] = set()  # options filled from the source's defaults table

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.opts:
            return self.opts[key]
        return DEFAULTS[self.res.source].get(key, default)

    def given(self, key: str) -> bool:
        return key in self.opts and key not in self.defaulted

    def set(self, path: str, value: Any, key: str) -> None:
        self.res.values[path] = value
        self.res.origin[path] = key
        self.done(key)

    def done(self, key: str) -> None:
        """`key` is applied (set a field, or asked for what happens here anyway)."""
        if key in self.defaulted:
            self.res.defaults[key] = self.opts[key]
        elif key not in self.res.applied:
            self.res.applied.append(key)

    def skip(self, key: str, reason: str, value: Any = None) -> None:
        v = self.opts.get(key) if value is None else value
        shown = v if isinstance(v, str) else json.dumps(v, default=str)
        if key in self.defaulted:
            reason = f"the source's default, not honoured here: {reason}"
        self.res.unmapped.append(Unmapped(self.shown(key), shown, reason))

    def note(self, text: str) -> None:
        self.res.notes.append(text)


def _map_common(ctx: _Ctx, key: str, value: Any) -> bool:
    """The options both tools share; True when handled (applied or listed as unmapped)."""
    if key in ("off_policy_mask_threshold", "off_policy_sequence_mask_delta") and not _is_null(value) \
            and _num(value) == 0:
        ctx.skip(key, "a threshold of exactly 0 is 'off' here: use a small positive value")
        return True
    if key == "scale_rewards" and str(_first(value)).strip().lower() == "gdpo":
        # ms-swift's GDPO: each reward normalised within its group, the weighted sum over the batch
        ctx.set("algorithm.multi_objective_aggregation", "normalize_then_sum", key)
        ctx.set("algorithm.scale_rewards", "group", key)
        ctx.note(f"{ctx.shown(key)} gdpo -> multi_objective_aggregation normalize_then_sum, TRL's form of it: the "
                 "stds get + 1e-4 (ms-swift: + 1e-8), and a completion no reward scored gets advantage 0")
        return True
    if key == "kl_in_reward":  # ms-swift's: its rewards are charged beta x the KL only with beta != 0, not in gdpo
        on = _bool(value)
        if on and _num(ctx.get("beta", 0.0)) == 0.0:
            ctx.done(key)  # nothing to charge, in the source too
        elif on and str(_first(ctx.get("scale_rewards", ""))).lower() == "gdpo":
            ctx.done(key)
            ctx.note("ms-swift turns kl_in_reward off with scale_rewards gdpo: the KL stays a loss term here")
        else:
            ctx.set("algorithm.kl_in_reward", on, key)
        return True
    if key in _COMMON:
        path, conv = _COMMON[key]
        ctx.set(path, conv(value), key)
        return True
    if key in ("torch_dtype", "dtype"):
        d = _DTYPES.get(str(_first(value)).lower())
        if d:
            ctx.set("model.dtype", d, key)
        else:
            ctx.skip(key, "dtypes here: float32, bfloat16, float16, auto")
        return True
    if key in ("bf16", "fp16"):
        if _bool(value):
            ctx.set("model.dtype", "bfloat16" if key == "bf16" else "float16", key)
        elif not ctx.given("torch_dtype") and not ctx.given("dtype") and "model.dtype" not in ctx.res.values:
            ctx.set("model.dtype", "float32", key)  # TRL without bf16: fp32 training
        else:
            ctx.done(key)
        return True
    if key in ("lr_scheduler_type", "lr_decay_style"):
        s = _SCHEDULERS.get(str(_first(value)).lower())
        if s:
            ctx.set("algorithm.lr_scheduler", s, key)
        else:
            ctx.skip(key, "schedules here: constant, linear, cosine")
        return True
    if key == "report_to":
        vals = [v for v in _list(value) if v not in ("none", "all")]
        ctx.set("output.report_to", [v for v in vals if v in _REPORT], key)
        for v in vals:
            if v not in _REPORT:
                ctx.skip(key, f"{v}: sinks here: tensorboard, wandb, swanlab", v)
        return True
    if key == "deepspeed":
        _deepspeed(ctx, key, value)
        return True
    if key == "use_vllm":
        if _bool(value):
            ctx.set("rollout.engine", "vllm", key)
        else:
            ctx.done(key)
        return True
    if key == "vllm_mode":
        mode = str(_first(value)).lower()
        if _bool(ctx.get("use_vllm", False)):
            ctx.set("rollout.placement", "separate" if mode == "server" else "colocate", key)
            if mode == "server":
                ctx.note("vllm_mode server -> placement separate: set resources.rollout_gpus to the GPUs the vLLM "
                         "server used")
        else:
            ctx.done(key)  # without vLLM it has no effect
        return True
    if key == "log_completions":
        ctx.set("output.log_samples_steps", 1 if _bool(value) else 0, key)
        return True
    if key == "sync_ref_model":
        ctx.set("algorithm.sync_ref_model", _bool(value), key)
        return True
    if key in ("ref_model_mixup_alpha", "ref_model_sync_steps"):
        if _bool(ctx.get("sync_ref_model", False)):
            ctx.set(f"algorithm.{key}", _num(value) if key == "ref_model_mixup_alpha" else _int(value), key)
        else:
            ctx.done(key)  # no effect without sync_ref_model, in the source too
        return True
    if key in ("max_prompt_length", "max_length", "truncation_strategy", "chat_template_kwargs", "enable_thinking"):
        return _prompt_options(ctx, key, value)
    if key.endswith("parallel_size") and not key.startswith("vllm_") and str(_first(value)) == "1":
        ctx.done(key)  # no model parallelism: as here
        return True
    if key == "split_dataset_ratio" and _num(value) == 0:
        ctx.done(key)  # no held-out split: as here
        return True
    if key in ("offload_model", "offload_optimizer") and not _bool(value):
        ctx.done(key)
        return True
    if (key == "repetition_penalty" and _num(value) == 1.0) or (key == "min_p" and (_is_null(value) or _num(value) == 0)):
        ctx.done(key)  # the neutral value: sampling as here
        return True
    return False


def _prompt_options(ctx: _Ctx, key: str, value: Any) -> bool:
    """How prompts are built and bounded: TRL's (< 1.0) and open-r1's max_prompt_length cuts from the left;
    ms-swift's max_length bounds the prompt in GRPO, cut as its truncation_strategy says (left, its GRPO default,
    or delete); chat_template_kwargs (TRL) and --enable_thinking (ms-swift) go to the chat template."""
    if key in ("max_prompt_length", "max_length"):
        if _is_null(value):
            ctx.done(key)  # None: prompts are not cut, as here
            return True
        how = "left" if key == "max_prompt_length" else str(_first(ctx.get("truncation_strategy", "left"))).lower()
        if how not in ("left", "delete"):
            ctx.skip(key, f"truncation_strategy {how!r}: prompts here are cut from the left or dropped")
            return True
        n = _int(value)
        if not 16 <= n <= 262_144:  # RunSpec's bounds: neither field is set, so nothing is cut by another bound
            ctx.skip(key, f"{n} tokens: prompts are bounded by 16 to 262,144 tokens here")
            return True
        ctx.set("data.max_prompt_tokens", n, key)
        ctx.set("data.prompt_truncation", how, key)
        if key == "max_prompt_length" and ctx.tool in ("trl", "open-r1") and _bool(ctx.get("use_vllm", False)):
            ctx.note(f"{ctx.shown(key)} {n}: prompts are cut from the left before sampling here; TRL before 0.19 "
                     "cut them for the loss only and sent vLLM the whole prompt")
    elif key == "truncation_strategy":
        if _is_null(ctx.get("max_length")):
            ctx.done(key)  # without max_length nothing is cut, in the source too
        elif str(_first(value)).lower() in ("left", "delete"):
            ctx.done(key)  # read with max_length
        else:
            ctx.skip(key, "prompts here are cut from the left or dropped (left, delete)")
    elif key == "chat_template_kwargs":
        kwargs = value
        if isinstance(value, (str, list)):
            try:
                kwargs = json.loads(_text(value))
            except json.JSONDecodeError:
                kwargs = None
        if _is_null(value):
            ctx.done(key)
        elif isinstance(kwargs, dict):
            ctx.set("data.chat_template_kwargs", {**ctx.res.values.get("data.chat_template_kwargs", {}), **kwargs},
                    key)
        else:
            ctx.skip(key, "not a JSON mapping of chat-template arguments")
    else:  # enable_thinking (ms-swift): the template argument of the same name
        kwargs = {**ctx.res.values.get("data.chat_template_kwargs", {}), "enable_thinking": _bool(value)}
        ctx.set("data.chat_template_kwargs", kwargs, key)
    return True


def _deepspeed(ctx: _Ctx, key: str, value: Any) -> None:
    s = str(_first(value)).lower()
    m = re.search(r"zero[_-]?(\d)", s)
    if m and not s.endswith(".json"):
        ctx.set("resources.deepspeed_stage", int(m.group(1)), key)
        if "offload" in s:  # ms-swift's and TRL's zero3_offload offload parameters too
            ctx.set("resources.offload", True, key)
            if m.group(1) == "3":
                ctx.set("resources.offload_params", True, key)
    elif s.endswith(".json"):
        ctx.set("resources.deepspeed_config", str(_first(value)), key)
        if m:
            ctx.set("resources.deepspeed_stage", int(m.group(1)), key)
        else:
            ctx.note(f"{ctx.shown(key)} {value}: set resources.deepspeed_stage to the file's ZeRO stage")
    else:
        ctx.skip(key, "a DeepSpeed config name not known here: set resources.deepspeed_config and deepspeed_stage")


# ----------------------------------------------------------------------------- files the source names

def _read_confined(ref: str, base_dir: Path | None) -> str | None:
    """The text of `ref` when base_dir is given and the file lies inside it; None otherwise."""
    if base_dir is None:
        return None
    try:
        base = base_dir.resolve()
        p = (base / ref).resolve()
        if not p.is_relative_to(base) or not p.is_file() or p.stat().st_size > 1_000_000:
            return None
        return p.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None


def _looks_like_file(v: str) -> bool:
    return bool(re.fullmatch(r"[\w./~-]+\.(txt|md|jinja|prompt)", v.strip()))


def _system(ctx: _Ctx, key: str, value: Any) -> None:
    """ms-swift's --system is the prompt, or a .txt file it reads."""
    v = _text(value)
    if _looks_like_file(v):
        text = _read_confined(v, ctx.base_dir)
        if text is None:
            ctx.skip(key, "ms-swift reads this file as the system prompt; it is not in the project folder here: "
                          "paste its text into data.system_prompt")
            return
        ctx.set("data.system_prompt", text.strip(), key)
        ctx.note(f"{ctx.shown(key)} {v}: the file's text is the system prompt")
        return
    ctx.set("data.system_prompt", v, key)


# ----------------------------------------------------------------------------- data, rewards, batch, steps

_MODELSCOPE_ORGS = {"AI-ModelScope", "modelscope", "swift", "LLM-Research", "iic", "damo", "ZhipuAI", "okwinds",
                    "tastelikefeet", "AI-MO-ModelScope", "OpenGVLab-ModelScope"}


def _sources(ctx: _Ctx, key: str, value: Any, path: str) -> None:
    """Dataset references: ms-swift's 'id:subset#N' is kept as written (a hub subset loads as that config);
    TRL's dataset_config becomes the id's subset; ModelScope ids are flagged."""
    out = []
    use_hf = _bool(ctx.opts.get("use_hf", "false")) or ctx.opts.get("_env_USE_HF", "0") == "1"
    for ref in _list(value):
        name, hash_, count = ref.partition("#")
        base, colon, subset = name.partition(":")
        looks_local = base.startswith((".", "/", "~")) or base.endswith((".jsonl", ".json", ".csv", ".parquet"))
        config = ctx.opts.get("dataset_config") if key == "dataset_name" else None
        if not colon and not looks_local and not _is_null(config):
            name = f"{name}:{_first(config)}"
        out.append(name + hash_ + count)
        org = base.split("/")[0]
        if ctx.tool in ("swift", "megatron") and not looks_local and "/" in name and not use_hf:
            if org in _MODELSCOPE_ORGS:
                ctx.note(f"{name}: a ModelScope id (ms-swift reads ModelScope unless --use_hf true); hub ids here are "
                         f"Hugging Face ids: give the dataset's Hugging Face id or a local copy")
    ctx.set(path, out, key)


def _model(ctx: _Ctx, key: str, value: Any) -> None:
    ref = str(_first(value))
    ctx.set("model.name_or_path", ref, key)
    if ctx.tool in ("swift", "megatron") and ref.split("/")[0] in _MODELSCOPE_ORGS and not _bool(ctx.opts.get("use_hf", "0")):
        ctx.note(f"{ref}: a ModelScope id; hub ids here are Hugging Face ids: give the model's Hugging Face id")


def _rewards(ctx: _Ctx, names: list[str], weights: list[float] | None, models: list[str],
             models_first: bool) -> None:
    """Reward functions with their weights (reward models included, where the source puts them), built-in
    aliases resolved and their options made params."""
    aliases = _REWARD_ALIASES[ctx.tool if ctx.tool != "megatron" else "swift"]
    # (our name, params, the source's name), in the source's order: its weights follow that order
    rm: list[tuple[str, dict[str, Any], str]] = [("reward_model", {"path": m}, m) for m in models]
    funcs: list[tuple[str, dict[str, Any], str]] = [(aliases.get(n, n), dict(_ALIAS_PARAMS.get(n, {})), n)
                                                     for n in names]
    entries = rm + funcs if models_first else funcs + rm
    if weights is not None and len(weights) != len(entries):
        ctx.skip("reward_weights", f"{len(weights)} weights for {len(entries)} rewards: the source would refuse "
                                   f"this; weights set to 1.0", weights)
        weights = None
    w = weights or [1.0] * len(entries)
    out = []
    for (name, params, src), weight in zip(entries, w, strict=True):
        if src in _REWARDS_LACKING and src not in aliases:
            ctx.skip("reward_funcs", f"{src}: {_REWARDS_LACKING[src]}; no built-in here: left out (write a plugin "
                                     f"defining {src!r})", src)
            continue
        if name not in _OURS and name != "reward_model":
            ctx.note(f"reward {src!r} keeps its name: unless it is a built-in here, a plugin file must define it "
                     f"(rewards.plugins)")
        out.append({"name": name, "weight": float(weight), "params": dict(params)})
    by_name = {e["name"]: e for e in out}
    for key, (reward, param) in _REWARD_PARAMS[ctx.tool if ctx.tool != "megatron" else "swift"].items():
        value = ctx.get(key)
        if reward not in by_name:
            if key in ctx.opts and ctx.given(key):
                ctx.done(key)  # a parameter of a reward this config does not use: no effect in the source either
            continue
        if _is_null(value):
            value = ctx.opts.get("max_completion_length", ctx.get("max_completion_length")) \
                if param in ("max_len", "max_completion_len") else None
            if value is None:
                continue
        kind = _PARAM_TYPES.get(param, float)
        by_name[reward]["params"][param] = str(_first(value)) if kind is str else kind(_num(value))
        if key in ctx.opts:
            ctx.done(key)
        else:
            ctx.res.defaults[key] = value
    if "cosine" in by_name and ctx.tool == "open-r1":
        ctx.note("open-r1's cosine reward measures length in characters; here in tokens: max_len may need scaling "
                 "(about 3-4 characters a token)")
    if "soft_overlong" in by_name and ctx.tool in ("swift", "megatron"):
        ctx.note("ms-swift's soft_overlong keeps falling below -1 past soft_max_length; here it stops at -1 (the "
                 "same wherever completions stop at max_completion_length)")
    if out:
        ctx.res.values["rewards.functions"] = out
        ctx.res.origin["rewards.functions"] = "reward_funcs"


def _rows_known(sources: list[str]) -> int | None:
    """Training rows when every source carries a sample count ('id#5000'); None when unknown."""
    total = 0
    for s in sources:
        _, sep, count = s.rpartition("#")
        if not sep or not count.isdigit():
            return None
        total += int(count)
    return total or None


def _steps(ctx: _Ctx, max_steps_key: str) -> None:
    """max_steps; -1 (train by epochs) becomes steps where the data size is known, else it is reported."""
    raw = ctx.get(max_steps_key)
    if not _is_null(raw) and _int(raw) > 0:
        ctx.set("algorithm.max_steps", _int(raw), max_steps_key)
        if ctx.given("num_train_epochs"):
            ctx.done("num_train_epochs")  # max_steps wins over epochs, in the source too
        return
    if max_steps_key in ctx.opts:
        ctx.done(max_steps_key)
    epochs = ctx.get("num_train_epochs")
    if _is_null(epochs):
        return
    rows = _rows_known(ctx.res.values.get("data.sources", []))
    pps = ctx.res.values.get("algorithm.prompts_per_step", RunSpec().algorithm.prompts_per_step)
    if rows:
        steps = max(1, math.ceil(rows * _num(epochs) / pps))
        ctx.set("algorithm.max_steps", steps, "num_train_epochs")
        ctx.note(f"num_train_epochs {epochs} x {rows} rows / {pps} prompts per step -> max_steps {steps}")
    else:
        ctx.skip("num_train_epochs", f"training by epochs needs the data size, which is not known here: max_steps "
                                     f"stays {RunSpec().algorithm.max_steps}; set algorithm.max_steps")


def _batch(ctx: _Ctx, world: int) -> None:
    """TRL and ms-swift count completions per device per micro-batch; RunSpec counts prompts per optimizer step:
    prompts_per_step = per-device batch x data-parallel processes x accumulation / num_generations."""
    g = ctx.res.values.get("rollout.num_generations", RunSpec().rollout.num_generations)
    sp = _int(ctx.opts.get("sequence_parallel_size", 1) or 1) if not _is_null(ctx.opts.get("sequence_parallel_size")) else 1
    dp = max(1, world // max(1, sp))
    if ctx.tool == "megatron":
        tp = _int(ctx.opts.get("tensor_model_parallel_size", 1) or 1)
        pp = _int(ctx.opts.get("pipeline_model_parallel_size", 1) or 1)
        cp = _int(ctx.opts.get("context_parallel_size", 1) or 1)
        dp = max(1, world // (tp * pp * cp))
        completions = _int(ctx.get("global_batch_size"))
        micro = _int(ctx.get("micro_batch_size"))
        ga = max(1, completions // max(1, micro * dp))
        ctx.set("algorithm.gradient_accumulation_steps", ga, "micro_batch_size")
        ctx.done("global_batch_size")
        how = f"global_batch_size {completions}"
        step_completions = completions
    else:
        per_device = _int(ctx.get("per_device_train_batch_size"))
        ga = ctx.res.values.get("algorithm.gradient_accumulation_steps", 1)
        completions = per_device * dp * ga
        ctx.done("per_device_train_batch_size")
        how = (f"per_device_train_batch_size {per_device} x {dp} data-parallel process(es) x "
               f"gradient_accumulation_steps {ga}")
        step_completions = per_device * dp
    if completions % g:
        ctx.note(f"{completions} completions per step are not a multiple of num_generations={g}; prompts_per_step "
                 f"rounded down")
    pps = max(1, completions // g)
    ctx.set("algorithm.prompts_per_step", pps, "per_device_train_batch_size" if ctx.tool != "megatron"
            else "global_batch_size")
    ctx.note(f"prompts_per_step = {how} / num_generations {g} = {pps}")
    # a generation batch: the source counts it in micro-batches (TRL, ms-swift), global batches (Megatron) or
    # completions (generation_batch_size); rollout.steps_per_generation counts optimizer steps
    spg, gbs = ctx.opts.get("steps_per_generation"), ctx.opts.get("generation_batch_size")
    unit = step_completions if ctx.tool != "megatron" else completions
    per_step = ga if ctx.tool != "megatron" else 1
    for key, raw, per in (("steps_per_generation", spg, per_step), ("generation_batch_size", gbs, unit * per_step)):
        if raw is None:
            continue
        if _is_null(raw):
            ctx.done(key)  # None: one generation per optimizer step, as here by default
        elif _int(raw) < per or _int(raw) % per:
            ctx.skip(key, f"{_int(raw)} is not a whole number of optimizer steps ({per} per step): a rollout here "
                          f"serves whole steps (rollout.steps_per_generation)")
        else:
            ctx.set("rollout.steps_per_generation", _int(raw) // per, key)
            if _int(raw) != per:
                ctx.note(f"{key} {_int(raw)} / {per} per optimizer step = rollout.steps_per_generation "
                         f"{_int(raw) // per}")


def _warmup(ctx: _Ctx, key: str) -> None:
    ratio = ctx.get(key)
    if _is_null(ratio):
        if key in ctx.opts:
            ctx.done(key)
        return
    ratio = _num(ratio)
    steps = ctx.res.values.get("algorithm.max_steps")
    if ratio == 0:
        ctx.done(key)
    elif steps:
        ctx.set("algorithm.warmup_steps", int(round(ratio * steps)), key)
        ctx.note(f"warmup_ratio {ratio} x max_steps {steps} -> warmup_steps {ctx.res.values['algorithm.warmup_steps']}")
    else:
        ctx.skip(key, "no max_steps to convert it with: set algorithm.warmup_steps")


def _finish_dropout(ctx: _Ctx) -> None:
    """TRL and ms-swift keep dropout unless told; a LoRA dropout the config asks for is kept."""
    if ctx.res.values.get("model.lora_dropout", 0) > 0 and ctx.res.values.get("model.finetune") == "lora" \
            and not ctx.given("disable_dropout"):
        ctx.res.values["algorithm.disable_dropout"] = False


def _settle(ctx: _Ctx) -> None:
    """Move every value RunSpec refuses into `unmapped`, with the spec's message, so apply() succeeds."""
    res = ctx.res
    for _ in range(len(res.values) + 1):
        try:
            res.apply()
            return
        except SpecError as err:
            moved = False
            for issue in err.issues:
                path = next((p for p in res.values if issue.field == p or issue.field.startswith(p + ".")), None)
                if path is None:
                    continue
                value = res.values.pop(path)
                opt = res.origin.get(path, path)
                res.unmapped.append(Unmapped(ctx.shown(opt), json.dumps(value, default=str), f"{path}: {issue.message}"))
                if opt in res.applied:
                    res.applied.remove(opt)
                moved = True
            if not moved:
                res.error = "; ".join(str(i) for i in err.issues)
                return


def _map_all(ctx: _Ctx, special: Callable[[_Ctx, str, Any], bool]) -> None:
    """Every option through the tool's own handling, then the shared table; nothing raises out of it."""
    for key, value in list(ctx.opts.items()):
        if key.startswith("_") or key in _LATER:
            continue
        try:
            if not (special(ctx, key, value) or _map_common(ctx, key, value)):
                ctx.skip(key, _reason(key))
        except (TypeError, ValueError, AttributeError) as err:
            ctx.skip(key, f"could not read {value!r}: {err}")


# a default is not filled when the config gives an option that sets the same thing under another name
_SAME_THING = {"tuner_type": {"train_type"}, "bf16": {"torch_dtype", "dtype", "fp16"},
               "torch_dtype": {"bf16", "fp16", "dtype"}, "lr_scheduler_type": {"lr_decay_style"},
               "gradient_checkpointing": {"recompute_granularity"}}


def _fill_defaults(ctx: _Ctx) -> None:
    """Options the config omits get the source's defaults (aliases of a given option count as given)."""
    given_fields = {_COMMON[k][0] for k in ctx.opts if k in _COMMON}
    for key, value in DEFAULTS[ctx.res.source].items():
        if key in ctx.opts or (key in _COMMON and _COMMON[key][0] in given_fields):
            continue
        if _SAME_THING.get(key, set()) & set(ctx.opts):
            continue
        if (key.startswith("vllm_") or key == "sleep_level") and not _bool(ctx.opts.get("use_vllm", False)):
            continue  # engine settings of an engine the config does not use
        ctx.opts[key] = value
        ctx.defaulted.add(key)
    finetune = ctx.opts.get("tuner_type", ctx.opts.get("train_type", "lora" if _bool(ctx.opts.get("use_peft")) else "full"))
    if str(_first(finetune)).lower() == "full":
        for key in [k for k in ctx.defaulted if k.startswith("lora_") or k == "target_modules"]:
            ctx.defaulted.discard(key)  # LoRA settings of a full fine-tune: nothing to fill
            del ctx.opts[key]


def _finish_advantages(ctx: _Ctx) -> None:
    """How the sources combine advantage options, once all are read: ms-swift's gdpo replaces the rloo baseline and
    is no scaling of reinforce_plus_plus; TRL's normalize_then_sum does not apply scale_rewards."""
    v, origin = ctx.res.values, ctx.res.origin
    if v.get("algorithm.multi_objective_aggregation") != "normalize_then_sum":
        return
    if origin.get("algorithm.multi_objective_aggregation") == "scale_rewards":  # ms-swift's gdpo
        estimator = v.get("algorithm.advantage_estimator", "grpo")
        if estimator == "reinforce_plus_plus":
            v["algorithm.multi_objective_aggregation"], v["algorithm.scale_rewards"] = "sum_then_normalize", "none"
            ctx.note("ms-swift runs reinforce_plus_plus with scale_rewards gdpo unscaled (reward - group mean): "
                     "scale_rewards none here")
        elif estimator == "rloo":
            v["algorithm.advantage_estimator"] = "grpo"
            ctx.note("ms-swift's gdpo advantages replace the rloo baseline: advantage_estimator grpo here")
    elif v.get("algorithm.scale_rewards", "group") != "group":
        ctx.note(f"scale_rewards {v['algorithm.scale_rewards']}: TRL does not apply it with normalize_then_sum "
                 "(the sum is normalised over the batch), so it is left at group")
        v["algorithm.scale_rewards"] = "group"


def _finish_level(ctx: _Ctx) -> None:
    """VESPO forms its sequence weight from the token ratios whatever importance_sampling_level says (TRL warns and
    goes on), so a source's 'sequence' there means the run that 'token' means here. (LUSPO at token level is a
    different run in TRL: it stays as given, and the check says what LUSPO needs.)"""
    v = ctx.res.values
    if v.get("algorithm.loss_type") == "vespo" and v.get("algorithm.importance_sampling_level", "token") != "token":
        ctx.note(f"importance_sampling_level {v['algorithm.importance_sampling_level']}: VESPO computes its sequence "
                 "weight from the token ratios either way (TRL warns): token here")
        v["algorithm.importance_sampling_level"] = "token"


def _finish_context(ctx: _Ctx) -> None:
    """An engine context (vllm_max_model_len) bounds the prompt in the source too, where vLLM refuses a longer one
    mid-run: without a prompt bound of its own, the prompt bound here is what the context leaves beside the
    completion, so the check before launch holds the data to it."""
    v = ctx.res.values
    context = v.get("rollout.max_model_len") or 0
    if not context or "data.max_prompt_tokens" in v:
        return
    room = context - v.get("rollout.max_completion_length", RunSpec().rollout.max_completion_length)
    if room >= 16:
        v["data.max_prompt_tokens"] = min(room, RunSpec().data.max_prompt_tokens)
        ctx.note(f"the engine's context of {context} tokens leaves {room} for the prompt: data.max_prompt_tokens "
                 f"{v['data.max_prompt_tokens']}")
    if ctx.res.values.get("rollout.placement") == "separate" or _text(ctx.get("vllm_mode", "")) == "server":
        ctx.note("the source's vLLM server sets its own context: vllm_max_model_len applies to the engine here")


def _finish(ctx: _Ctx, world: int) -> ImportResult:
    """The whole-config steps every tool shares."""
    try:
        _batch(ctx, world)
    except (TypeError, ValueError) as err:
        ctx.skip("per_device_train_batch_size", f"could not derive the batch: {err}")
    _steps(ctx, "train_iters" if ctx.tool == "megatron" and "train_iters" in ctx.opts else "max_steps")
    _warmup(ctx, "lr_warmup_fraction" if ctx.tool == "megatron" else "warmup_ratio")
    _finish_dropout(ctx)
    _finish_advantages(ctx)
    _finish_context(ctx)
    _finish_level(ctx)
    if ctx.res.values.get("rollout.engine") == "vllm" and "rollout.placement" not in ctx.res.values:
        ctx.res.values["rollout.placement"] = "colocate"
    _settle(ctx)
    return ctx.res


# ----------------------------------------------------------------------------- shell text

_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)  # re.S: a quoted value may span lines
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _scan(line: str, quote: str = "") -> tuple[str, int]:
    """The shell quote still open at the end of `line` ('' = none), starting inside `quote`, and where a comment
    starts (-1 = none): a '#' outside quotes at the start of a word ('ds#5000' is data)."""
    i = 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif quote == '"':
            if c == "\\":
                i += 1
            elif c == '"':
                quote = ""
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return quote, i
        i += 1
    return quote, -1


def _physical_lines(text: str) -> list[str]:
    """The text's lines, a newline inside a quoted word kept in its line (a multi-line `--system '...'`, as the
    exporter writes it). A quote still open at the end is malformed: then the plain lines, as the shell's error."""
    out: list[str] = []
    quote = ""
    for raw in text.split("\n"):
        if quote:
            out[-1] += "\n" + raw
        else:
            out.append(raw)
        quote = _scan(raw, quote)[0]
    return text.split("\n") if quote else out


def _logical_lines(text: str) -> list[str]:
    """Continuation lines joined, whole-line comments dropped; a trailing ' \\' on the last line is harmless;
    newlines inside quotes kept."""
    lines, buf = [], ""
    for raw in _physical_lines(text.replace("\r\n", "\n")):
        stripped = raw.strip()
        if stripped.startswith("#") and not buf:
            continue
        if stripped.startswith("#"):  # a comment between continuation lines
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        if buf.strip():
            lines.append(buf.strip())
        buf = ""
    if buf.strip():
        lines.append(buf.strip())
    return lines


def _split(line: str) -> list[str]:
    """shlex, forgiving: an unbalanced quote or a stray escape falls back to white-space splitting."""
    # a trailing '#...' comment after white space is the shell's; '#' inside a word or a quote is data
    comment = _scan(line)[1]
    line = line[:comment] if comment >= 0 else line
    for attempt in (line, line + '"', line + "'"):
        try:
            return shlex.split(attempt)
        except ValueError:
            continue
    return line.split()


def _expand(tok: str, env: dict[str, str], missing: set[str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        if m.group(2) is not None:
            return m.group(2)
        missing.add(name)
        return m.group(0)
    return _VAR.sub(sub, tok)


@dataclass
class _Command:
    env: dict[str, str]  # exports and assignments in effect, the line's own prefix included
    launcher: dict[str, str]  # torchrun / accelerate options
    kind: str  # 'swift', 'megatron', 'trl'
    opts: dict[str, Any]
    stray: list[str]
    missing: set[str]  # $VARs not set earlier in the script
    exported: set[str]  # variables the command's environment gets (export, or its own prefix), not just the shell's


_TRAIN_MARKERS = ("swift/cli/rlhf.py", "swift.cli.rlhf", "swift/cli/_megatron/rlhf.py")


def _command_kind(words: list[str]) -> tuple[str, int] | None:
    """Which trainer a command runs, and where its options start."""
    for i, w in enumerate(words):
        base = w.rsplit("/", 1)[-1]
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if base in ("swift", "megatron") and nxt == "rlhf":
            return ("megatron" if base == "megatron" else "swift"), i + 2
        if any(w.endswith(m) for m in _TRAIN_MARKERS):
            return ("megatron" if "megatron" in w else "swift"), i + 1
        if base == "trl" and nxt == "grpo":
            return "trl", i + 2
        if re.search(r"grpo\w*\.py$", base) or w in ("open_r1.grpo", "trl.scripts.grpo"):
            return "trl", i + 1
    return None


def _parse_opts(tokens: list[str]) -> tuple[dict[str, Any], list[str]]:
    """`--opt v1 v2 --flag --k=v` -> {opt: [v1, v2] as a list, or one str; flag: 'true'}, and stray tokens."""
    raw: dict[str, list[str]] = {}
    stray: list[str] = []
    current: str | None = None
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            name, eq, val = tok[2:].partition("=")
            current = name.replace("-", "_")
            raw[current] = [val] if eq else []
        elif tok in (">", ">>", "2>&1", "&", "|", "&&", ";", "2>") or tok.startswith((">", "2>")):
            current = None
            break
        elif current is not None:
            raw[current].append(tok)
        else:
            stray.append(tok)
    opts: dict[str, Any] = {}
    for k, vals in raw.items():
        opts[k] = "true" if not vals else vals[0] if len(vals) == 1 else vals
    return opts, stray


def _launcher_opts(words: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            name, eq, val = w[2:].partition("=")
            name = name.replace("-", "_")
            if not eq and i + 1 < len(words) and not words[i + 1].startswith("-"):
                val = words[i + 1]
            out[name] = val
    return out


def parse_script(text: str) -> _Command | None:
    """The training command of a pasted shell script, with the environment its earlier lines set."""
    env: dict[str, str] = {}
    exported: set[str] = set()
    found: _Command | None = None
    for line in _logical_lines(text):
        words = _split(line)
        export = bool(words) and words[0] == "export"
        while words and words[0] in ("export", "nohup", "env", "exec", "time", "sudo"):
            words = words[1:]
        local: dict[str, str] = {}
        missing: set[str] = set()
        while words and _ASSIGN.fullmatch(words[0]):
            k, _, v = words.pop(0).partition("=")
            local[k] = _expand(v, {**env, **local}, missing)
        if not words:
            env.update(local)  # 'export A=1' or 'A=1' on its own line
            if export:
                exported.update(local)
            continue
        kind = _command_kind(words)
        if kind is None:
            continue
        name, start = kind
        scope = {**env, **local}
        words = [_expand(w, scope, missing) for w in words]
        opts, stray = _parse_opts(words[start:])
        rlhf = str(_first(opts.get("rlhf_type", "grpo")))
        cmd = _Command(scope, _launcher_opts(words[:start]), name, opts, stray, missing, exported | set(local))
        if found is None or (rlhf == "grpo" and str(_first(found.opts.get("rlhf_type", "grpo"))) != "grpo"):
            found = cmd
    return found


def parse_swift_args(cmdline: str) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """`ENV=1 swift rlhf --opt v1 v2 --flag ...` -> (environment, options, stray tokens); options hold one str,
    a list of str, or 'true' for a bare flag."""
    cmd = parse_script(cmdline)
    if cmd is None:  # bare options
        opts, stray = _parse_opts(_split(" ".join(_logical_lines(cmdline))))
        return {}, opts, stray
    return cmd.env, cmd.opts, cmd.stray


# ----------------------------------------------------------------------------- launch context

def _launch(ctx: _Ctx, env: dict[str, str], launcher: dict[str, str]) -> int:
    """Processes per node and nodes from the environment and the launcher; sets resources; the world size."""
    def num(v: str | None) -> int | None:
        return int(v) if v is not None and str(v).strip().isdigit() else None

    gpus = [int(g) for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip().isdigit()]
    acc = _accelerate_config(ctx, launcher.get("config_file"))
    nproc = (num(launcher.get("nproc_per_node")) or num(env.get("NPROC_PER_NODE"))
             or num(launcher.get("num_processes")) or acc.get("num_processes"))
    nnodes = num(launcher.get("nnodes")) or num(env.get("NNODES")) or num(launcher.get("num_machines")) \
        or acc.get("num_machines") or 1
    if launcher.get("num_processes") or (acc.get("num_processes") and not launcher.get("nproc_per_node")):
        if nproc and nnodes > 1:
            nproc = max(1, nproc // nnodes)  # accelerate counts processes over all machines
    if nproc is None and ctx.tool in ("swift", "megatron"):
        nproc = 1  # ms-swift without NPROC_PER_NODE runs one process (several visible GPUs: device_map)
    if nproc is None:
        nproc = _int(ctx.get("num_processes", 1))
        if "num_processes" in ctx.opts:
            ctx.done("num_processes")
    elif ctx.given("num_processes"):
        ctx.done("num_processes")
    if gpus:
        ctx.set("resources.train_gpus", gpus[:nproc] if len(gpus) > nproc else gpus, "CUDA_VISIBLE_DEVICES")
        ctx.set("resources.device", "cuda", "CUDA_VISIBLE_DEVICES")
        if len(gpus) > nproc:
            ctx.note(f"CUDA_VISIBLE_DEVICES has {len(gpus)} GPUs for {nproc} training process(es): the first "
                     f"{nproc} train; the rest are the source's rollout GPUs (resources.rollout_gpus)")
    if nproc * nnodes > 1 and ctx.tool in ("swift", "megatron"):
        ctx.res.values["resources.device"] = "cuda"  # ms-swift's ranks are GPU processes, not CPU ones
        ctx.res.origin["resources.device"] = "NPROC_PER_NODE"
    if nproc > 1 and len(gpus) != nproc:
        ctx.res.values["resources.nproc_per_node"] = nproc
        ctx.res.origin["resources.nproc_per_node"] = "NPROC_PER_NODE"
    if nnodes > 1:
        ctx.res.values["resources.nnodes"] = nnodes
        ctx.res.origin["resources.nnodes"] = "NNODES"
    for var, path in (("NODE_RANK", "resources.node_rank"), ("MASTER_PORT", "resources.master_port")):
        if num(env.get(var)) is not None:
            ctx.res.values[path] = int(env[var])
            ctx.res.origin[path] = var
    if env.get("MASTER_ADDR") and "$" not in env["MASTER_ADDR"]:
        ctx.res.values["resources.master_addr"] = env["MASTER_ADDR"]
        ctx.res.origin["resources.master_addr"] = "MASTER_ADDR"
    return nproc * nnodes


def _accelerate_config(ctx: _Ctx, ref: str | None) -> dict[str, int]:
    if not ref:
        return {}
    text = _read_confined(ref, ctx.base_dir)
    try:
        data = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        data = None
    if not isinstance(data, dict):
        ctx.note(f"accelerate --config_file {ref}: not readable here; its process count is taken from "
                 f"--num_processes or the source's default")
        return {}
    out = {k: int(data[k]) for k in ("num_processes", "num_machines") if isinstance(data.get(k), int)}
    if isinstance(data.get("deepspeed_config"), dict) and "zero_stage" in data["deepspeed_config"]:
        ctx.res.values["resources.deepspeed_stage"] = int(data["deepspeed_config"]["zero_stage"])
        ctx.res.origin["resources.deepspeed_stage"] = "config_file"
    return out


# environment variables of the source's stack, by prefix -> why they have no effect here
_ENV_REASONS = {
    "ASCEND_": "Ascend NPUs are not supported here: runs train on CUDA GPUs or the CPU",
    "VLLM_ASCEND": "Ascend NPUs are not supported here: runs train on CUDA GPUs or the CPU",
    "PYTORCH_NPU": "Ascend NPUs are not supported here: runs train on CUDA GPUs or the CPU",
    "TASK_QUEUE": "Ascend NPUs are not supported here: runs train on CUDA GPUs or the CPU",
    "MAX_PIXELS": "ms-swift's image resolution limit: images reach the processor at its own defaults here",
    "MIN_PIXELS": "ms-swift's image resolution limit: images reach the processor at its own defaults here",
    "VIDEO_": "ms-swift's video sampling limit: data.max_video_frames sets the frames here",
    "FPS": "ms-swift's video sampling limit: data.max_video_frames sets the frames here",
    "PYTORCH_CUDA_ALLOC_CONF": "an allocator setting of the source's stack: the trainer here chooses its own",
    "WANDB_": "bookkeeping of the source: the studio's run directory covers it (wandb reads its own variables)",
}
_ENV_KNOWN = {"CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
              "USE_HF", "WORLD_SIZE", "RANK", "LOCAL_RANK"}


# ----------------------------------------------------------------------------- ms-swift

def _swift_special(ctx: _Ctx, key: str, value: Any) -> bool:
    if key == "model":
        _model(ctx, key, value)
    elif key in ("tuner_type", "train_type"):
        t = str(_first(value)).lower()
        if t in ("lora", "full"):
            ctx.set("model.finetune", t, key)
        elif t in ("qlora", "longlora", "adalora", "dora", "lora_llm"):
            ctx.set("model.finetune", "lora", key)
            ctx.skip(key, f"{t} is trained as plain LoRA here", t)
        else:
            ctx.skip(key, "tuners here: lora or full")
    elif key == "dataset":
        _sources(ctx, key, value, "data.sources")
    elif key == "val_dataset":
        _sources(ctx, key, value, "data.eval_sources")
    elif key == "external_plugins":
        ctx.set("rewards.plugins", _list(value), key)
        ctx.note("ms-swift plugins register rewards through its orms registry; here a plugin file's top-level "
                 "functions are the reward names")
    elif key == "system":
        _system(ctx, key, value)
    elif key == "rlhf_type":
        if str(_first(value)) == "grpo":
            ctx.done(key)
        else:
            ctx.skip(key, "only GRPO maps onto a RunSpec")
    elif key == "columns":
        _columns(ctx, key, value)
    elif key in ("use_hf", "finetune"):
        ctx.done(key)  # read with the ids; Megatron's --finetune: start from the weights, as every run here does
    elif key == "recompute_granularity":
        ctx.set("model.gradient_checkpointing", str(_first(value)) != "none", key)
    else:
        return False
    return True


# ms-swift's column roles (--columns '{"problem": "query"}') -> the field naming that column here
SWIFT_COLUMNS = {"solution": "data.solution_column", "query": "data.prompt_column", "prompt": "data.prompt_column",
                 "images": "data.images_column", "videos": "data.videos_column", "audios": "data.audios_column"}


def _columns(ctx: _Ctx, key: str, value: Any) -> None:
    """ms-swift's --columns renames dataset columns to its own ('query' the prompt, 'solution' the answer)."""
    raw = _text(value)
    try:
        mapping = json.loads(raw)
    except json.JSONDecodeError:
        mapping = None
    if not isinstance(mapping, dict):
        ctx.skip(key, "not a JSON mapping of column names")
        return
    for col, target in mapping.items():
        if target in SWIFT_COLUMNS:
            ctx.set(SWIFT_COLUMNS[target], str(col), key)
        else:
            ctx.skip(key, f"column {col!r} -> {target!r}: no such role here", f"{col}: {target}")


def import_swift(text: str, base_dir: str | Path | None = None) -> ImportResult:
    """An ms-swift command line or script (swift rlhf, megatron rlhf, torchrun/accelerate ... swift/cli/rlhf.py)."""
    cmd = parse_script(text)
    if cmd is None:
        env: dict[str, str] = {}
        opts, stray = _parse_opts(_split(" ".join(_logical_lines(text))))
        cmd = _Command(env, {}, "swift", opts, stray, set(), set())
    source = MEGATRON_SOURCE if cmd.kind == "megatron" else SWIFT_SOURCE
    ctx = _Ctx(source, cmd.kind, dict(cmd.opts), lambda k: k if k.isupper() else f"--{k}",
               Path(base_dir) if base_dir is not None else None)
    if cmd.env.get("USE_HF") == "1":
        ctx.opts["_env_USE_HF"] = "1"
    for name in sorted(cmd.missing):
        ctx.res.unmapped.append(Unmapped(f"${name}", "", "not set earlier in the pasted script (the cluster or the "
                                                         "shell sets it at run time): what uses it was read without it"))
    words = [s for s in cmd.stray if s not in ("swift", "rlhf", "megatron")]
    if words:
        ctx.res.unmapped.append(Unmapped("positional", " ".join(words), _NO_EQUIVALENT))
    _fill_defaults(ctx)
    if "learning_rate" not in ctx.opts and "lr" not in ctx.opts:
        tuner = str(_first(ctx.opts.get("tuner_type", ctx.opts.get("train_type", "lora")))).lower()
        ctx.opts["learning_rate"] = _SWIFT_LR.get(tuner, 1e-4)
        ctx.defaulted.add("learning_rate")
    estimator = str(_first(ctx.opts.get("advantage_estimator", "grpo"))).lower()
    if cmd.kind == "swift" and "scale_rewards" in ctx.defaulted and estimator in _SWIFT_SCALE:
        ctx.opts["scale_rewards"] = _SWIFT_SCALE[estimator]
    if cmd.kind == "swift" and estimator in _SWIFT_KL_IN_REWARD and "kl_in_reward" not in ctx.opts:
        ctx.opts["kl_in_reward"] = True  # ms-swift's default with this estimator (Megatron's: false)
        ctx.defaulted.add("kl_in_reward")
    if cmd.kind == "megatron":
        for a, b in (("train_iters", "max_steps"),):
            if a in ctx.opts:
                ctx.opts.pop(b, None)
                ctx.defaulted.discard(b)
    for k, v in cmd.env.items():
        if k not in _ENV_KNOWN and k in cmd.exported:
            reason = next((r for prefix, r in _ENV_REASONS.items() if k.startswith(prefix)),
                          "an environment variable of the source's stack, not read here")
            ctx.res.unmapped.append(Unmapped(f"{k}={v}", "", reason))
    if "rlhf_type" not in ctx.opts:
        ctx.note("no --rlhf_type: ms-swift would run its default (dpo); read as GRPO here")
    _map_all(ctx, _swift_special)
    if _bool(ctx.opts.get("use_vllm", False)) and "vllm_mode" not in cmd.opts and (
            "vllm_server_host" in cmd.opts or "vllm_server_base_url" in cmd.opts):
        ctx.set("rollout.placement", "separate", "vllm_server_host")  # ms-swift: a server address means server mode
    world = _launch(ctx, cmd.env, cmd.launcher)
    _swift_rewards(ctx)
    return _finish(ctx, world)


def _swift_rewards(ctx: _Ctx) -> None:
    names = _list(ctx.opts.get("reward_funcs", []))
    models = _list(ctx.opts.get("reward_model", []))
    raw = ctx.opts.get("reward_weights")
    try:
        weights = None if _is_null(raw) else _floats(raw)
    except ValueError:
        ctx.skip("reward_weights", "not numbers: weights set to 1.0")
        weights = None
    for key in ("reward_funcs", "reward_model", "reward_weights"):
        if key in ctx.opts:
            ctx.done(key)
    _rewards(ctx, names, weights, models, models_first=False)


# ----------------------------------------------------------------------------- TRL and open-r1

_OPENR1_KEYS = {"dataset_prompt_column", "system_prompt", "dataset_mixture", "hub_model_revision",
                "push_to_hub_revision", "benchmarks", "callbacks", "wandb_entity", "wandb_project",
                "parallel_code_exec_per_proc", "code_language", "code_provider", "ioi_provider", "e2b_router_url",
                "max_completion_len", "soft_punish_cache", "chat_template", "overwrite_hub_revision"}  # TRL has dataset_config
_OPENR1_REWARDS = {"reasoning_steps", "repetition_penalty", "soft_overlong_punishment", "code", "binary_code",
                   "ioi_code", "cf_code", "code_format", "tag_count", "cosine", "length"}


def _trl_special(ctx: _Ctx, key: str, value: Any) -> bool:
    if key == "model_name_or_path":
        _model(ctx, key, value)
    elif key == "use_peft":
        ctx.set("model.finetune", "lora" if _bool(value) else "full", key)
    elif key in ("dataset_name", "dataset_path"):
        _sources(ctx, key, value, "data.sources")
    elif key == "dataset_train_split":
        if str(_first(value)) == "train":
            ctx.done(key)
        else:
            ctx.skip(key, "the 'train' split is read here")
    elif key == "dataset_config":
        if _is_null(value) or "dataset_name" in ctx.opts:
            ctx.done(key)  # read with dataset_name, as its subset
        else:
            ctx.skip(key, "a dataset config without dataset_name")
    elif key == "dataset_mixture" and isinstance(value, dict):
        ds = value.get("datasets") or []
        ids = [str(d["id"]) + (f":{d['config']}" if d.get("config") else "")
               for d in ds if isinstance(d, dict) and d.get("id")]
        if ids:
            ctx.set("data.sources", ids, key)
        ctx.skip(key, "a mixture's per-dataset splits, columns and weights are not read: the ids (with their "
                      "configs) are mixed in equal parts")
    elif key in ("system_prompt",) and _is_null(value):
        ctx.done(key)
    elif key == "datasets" and isinstance(value, list):  # TRL's mixture: [{path: id, ...}]
        ids = [str(d.get("path")) for d in value if isinstance(d, dict) and d.get("path")]
        ctx.set("data.sources", ids, key)
        if any(set(d) - {"path"} for d in value if isinstance(d, dict)):
            ctx.skip(key, "a mixture entry's name/split/columns are not read: the ids are mixed in equal parts")
    elif key == "vllm_device":  # TRL < 0.17: vLLM in the trainer's process, on a GPU of its own
        if not _bool(ctx.get("use_vllm", False)):
            ctx.done(key)
            return True
        dev = str(_first(value)).lower()
        ctx.set("rollout.placement", "separate", key)
        m = re.fullmatch(r"cuda:(\d+)", dev)
        if m:
            ctx.set("resources.rollout_gpus", [int(m.group(1))], key)
        elif dev != "auto":
            ctx.skip(key, "devices here are CUDA GPU indices (resources.rollout_gpus)")
    elif key == "accelerate_config":
        _deepspeed(ctx, key, value)
    elif key == "config":
        ctx.skip(key, "a config file: paste its text, or import from the project folder")
    else:
        return False
    return True


def _detect_trl_source(opts: dict[str, Any]) -> str:
    """open-r1's recipes run on its pinned TRL (0.18.0), whose defaults differ from TRL's current ones."""
    names = set(_list(opts.get("reward_funcs", [])))
    if _OPENR1_KEYS & set(opts) or names & _OPENR1_REWARDS:
        return OPENR1_SOURCE
    return TRL_SOURCE


def import_trl(text: str | dict[str, Any], base_dir: str | Path | None = None,
               launcher: dict[str, str] | None = None, env: dict[str, str] | None = None) -> ImportResult:
    """A TRL GRPOConfig (plus the ScriptArguments/ModelConfig keys TRL's grpo script reads) as YAML or JSON, or its
    mapping; open-r1 recipes are recognised by their own keys and get open-r1's defaults."""
    opts = text if isinstance(text, dict) else parse_config_text(text)
    if not isinstance(opts, dict):
        return ImportResult(error="expected a mapping of GRPOConfig options")
    opts = {str(k): v for k, v in opts.items()}
    source = _detect_trl_source(opts)
    ctx = _Ctx(source, "open-r1" if source == OPENR1_SOURCE else "trl", {}, str,
               Path(base_dir) if base_dir is not None else None)
    for k, v in opts.items():
        if v is None and k not in _NULL_MEANS:
            ctx.res.applied.append(k)  # null: "not given", so the source's default below applies
            ctx.note(f"{k}: null read as the source's default")
            continue
        ctx.opts[k] = v
    _fill_defaults(ctx)
    _map_all(ctx, _trl_special)
    world = _launch(ctx, env or {}, launcher or {})
    if str(_first(ctx.opts.get("vllm_device", ""))).lower() == "auto" and _bool(ctx.get("use_vllm", False)):
        ctx.set("resources.rollout_gpus", [world], "vllm_device")  # TRL's 'auto': the GPU after the trainers'
    if world == 1 and not ctx.given("num_processes") and not launcher:
        ctx.note("1 training process assumed (TRL's own launch default; add num_processes: N, or paste the "
                 "accelerate launch line, to convert for N GPUs)")
    names = _list(ctx.opts.get("reward_funcs", []))
    models = [str(_first(ctx.opts["reward_model_name_or_path"]))] if not _is_null(
        ctx.opts.get("reward_model_name_or_path")) else []
    raw = ctx.opts.get("reward_weights")
    try:
        weights = None if _is_null(raw) else _floats(raw)  # a scalar weight is a list of one
    except ValueError:
        ctx.skip("reward_weights", "not numbers: weights set to 1.0")
        weights = None
    for key in ("reward_funcs", "reward_model_name_or_path", "reward_weights"):
        if key in ctx.opts:
            ctx.done(key)
    _rewards(ctx, names, weights, models, models_first=True)  # TRL's grpo script puts the reward model first
    return _finish(ctx, world)


def _trl_command(cmd: _Command, base_dir: str | Path | None) -> ImportResult:
    """`trl grpo --config x.yaml --opt v` or `accelerate launch ... grpo.py --config x.yaml`: the file (read when it
    lies in base_dir) with the command's options over it."""
    opts: dict[str, Any] = {}
    ref = cmd.opts.pop("config", None)
    unread = None
    if ref:
        text = _read_confined(str(_first(ref)), Path(base_dir) if base_dir is not None else None)
        data = None
        if text is not None:
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                data = None
        if isinstance(data, dict):
            opts.update(data)
        else:
            unread = str(_first(ref))
    opts.update({k: _yaml_scalar(v) for k, v in cmd.opts.items()})
    res = import_trl(opts, base_dir, cmd.launcher, cmd.env)
    if unread:
        res.unmapped.insert(0, Unmapped("--config", unread, "a config file not in the project folder here: paste "
                                                            "its text to import it"))
    return res


def _yaml_scalar(v: Any) -> Any:
    if isinstance(v, list):
        return [_yaml_scalar(x) for x in v]
    try:
        return yaml.safe_load(v) if isinstance(v, str) else v
    except yaml.YAMLError:
        return v


def parse_config_text(text: str) -> Any:
    """JSON or YAML; None when it is neither."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def parse_python_config(text: str) -> tuple[dict[str, Any], list[Unmapped]] | None:
    """The literal keywords of a `GRPOConfig(...)` call in a Python snippet (TRL's docs write configs so), with
    `GRPOTrainer(model="id")` and `load_dataset("id")` as the model and dataset; None without a GRPOConfig call."""
    if "GRPOConfig(" not in text:
        return None
    # the docs elide arguments with '...': drop it so the call parses
    text = re.sub(r",\s*\.\.\.\s*(?=[,)])", "", text)
    text = re.sub(r"\(\s*\.\.\.\s*,", "(", text)
    text = re.sub(r"^\s*\.\.\.,?\s*(#.*)?$", "", text, flags=re.M)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        start = text.index("GRPOConfig(")
        depth, end = 0, len(text)
        for i in range(start + len("GRPOConfig"), len(text)):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                end = i + 1
                break
        try:
            tree = ast.parse(text[start:end])
        except SyntaxError:
            return None
    opts: dict[str, Any] = {}
    odd: list[Unmapped] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if name == "GRPOConfig":
            for kw in node.keywords:
                if kw.arg is None:
                    continue
                try:
                    opts[kw.arg] = ast.literal_eval(kw.value)
                except (ValueError, SyntaxError, TypeError):
                    odd.append(Unmapped(kw.arg, ast.unparse(kw.value), "not a literal value in the snippet"))
        elif name == "LoraConfig":  # a peft_config: the run is LoRA
            opts["use_peft"] = True
            for kw in node.keywords:
                key = {"r": "lora_r", "target_modules": "lora_target_modules"}.get(kw.arg or "", kw.arg)
                if key in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
                    try:
                        opts[key] = ast.literal_eval(kw.value)
                    except (ValueError, SyntaxError, TypeError):
                        odd.append(Unmapped(f"LoraConfig.{kw.arg}", ast.unparse(kw.value), "not a literal value"))
                elif kw.arg not in ("task_type", "bias") or ast.unparse(kw.value) not in ("'CAUSAL_LM'", "'none'"):
                    odd.append(Unmapped(f"LoraConfig.{kw.arg}", ast.unparse(kw.value), _reason("use_rslora")))
        elif name == "GRPOTrainer":
            for kw in node.keywords:
                if kw.arg == "model" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    opts.setdefault("model_name_or_path", kw.value.value)
        elif name == "load_dataset" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            opts.setdefault("dataset_name", node.args[0].value)
    return opts, odd


# ----------------------------------------------------------------------------- entry point

def import_any(text: str, base_dir: str | Path | None = None) -> ImportResult:
    """An ms-swift or TRL command line / script, or a TRL config; never raises."""
    try:
        return _import_any(text, base_dir)
    except Exception as err:  # the contract: nothing escapes; a bug here is reported, not raised  # noqa: BLE001
        return ImportResult(error=f"could not import ({type(err).__name__}: {err})")


def _import_any(text: str, base_dir: str | Path | None) -> ImportResult:
    stripped = (text or "").strip()
    if not stripped:
        return ImportResult(error="nothing to import")
    cmd = parse_script(stripped)
    if cmd is not None:
        return import_swift(stripped, base_dir) if cmd.kind in ("swift", "megatron") else _trl_command(cmd, base_dir)
    if stripped.startswith("--"):
        return import_swift(stripped, base_dir)
    python = parse_python_config(stripped)
    if python is not None:
        res = import_trl(python[0], base_dir)
        res.unmapped[:0] = python[1]
        return res
    data = parse_config_text(stripped)
    if isinstance(data, dict):
        return import_trl(data, base_dir)
    return ImportResult(error="not an ms-swift command (swift rlhf / megatron rlhf ...) nor a TRL config (a YAML "
                              "or JSON mapping of GRPOConfig options)")


# ----------------------------------------------------------------------------- the tables, for the exporters
# backend/exporters.py writes a RunSpec out as these tools' configs from these same tables, so a mapping is
# declared once: an option added to a table above is exported too.

@dataclass(frozen=True)
class Tables:
    options: dict[str, tuple[str, Callable[[Any], Any]]]  # option -> (field, converter), both tools
    defaults: dict[str, dict[str, Any]]  # source -> its defaults
    null_means: frozenset[str]  # options whose null means off / the same as another option
    reward_aliases: dict[str, dict[str, str]]  # tool -> its reward name -> ours
    reward_params: dict[str, dict[str, tuple[str, str]]]  # tool -> its option -> (our reward, its param)
    param_types: dict[str, type]
    rewards_lacking: dict[str, str]  # the sources' rewards with no equivalent here
    openr1_keys: frozenset[str]  # keys and reward names that make a TRL config read as open-r1's
    openr1_rewards: frozenset[str]
    swift_columns: dict[str, str]  # ms-swift's column role -> our field
    swift_lr: dict[str, float]  # ms-swift's learning-rate default by tuner


TABLES = Tables(_COMMON, DEFAULTS, frozenset(_NULL_MEANS), _REWARD_ALIASES, _REWARD_PARAMS, _PARAM_TYPES,
                _REWARDS_LACKING, frozenset(_OPENR1_KEYS), frozenset(_OPENR1_REWARDS), SWIFT_COLUMNS, _SWIFT_LR)


def options_for(path: str) -> list[str]:
    """The shared table's options that set the field `path` ('algorithm.beta' -> ['beta']), in its order: the
    inverse of the table."""
    return [key for key, (field_path, _) in _COMMON.items() if field_path == path]
