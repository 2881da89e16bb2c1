"""Map other tools' GRPO configurations onto RunSpec fields: an ms-swift `swift rlhf --rlhf_type grpo ...`
command line, or a TRL GRPOConfig as YAML/JSON.

Pure functions. Each returns an `ImportResult`: the mapped values ('section.field' -> value), the options
that have no equivalent here (listed so nothing is dropped silently), and notes on conversions that
needed an assumption (batch sizes, warmup ratios).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from backend.spec import RunSpec, SpecError, SpecIssue, spec_from_dict


@dataclass
class ImportResult:
    values: dict[str, Any] = field(default_factory=dict)
    unmapped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def apply(self, base: RunSpec | None = None) -> RunSpec:
        """`base` (default: RunSpec defaults) with the imported values set; SpecError names bad fields."""
        data = (base or RunSpec()).model_dump(mode="json")
        for path, value in self.values.items():
            section, name = path.split(".")
            data[section][name] = value
        return spec_from_dict(data)


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes", "on", "y")


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) and v else v


def _num(v: Any) -> float:
    return float(_first(v))


def _int(v: Any) -> int:
    return int(float(_first(v)))


def _list(v: Any) -> list[str]:
    if isinstance(v, list):
        out = []
        for x in v:
            out += [p for p in str(x).split(",") if p] if "," in str(x) else [str(x)]
        return out
    return [p.strip() for p in str(v).split(",") if p.strip()] if v not in (None, "") else []


_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
           "fp32": "float32", "float32": "float32", "float": "float32", "auto": "auto"}
_SCHEDULERS = {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine",
               "cosine_with_min_lr": "cosine"}
_REPORT = {"tensorboard", "wandb", "swanlab"}


def _off_if_none(v: Any) -> float:
    """An optional number (None = off in TRL) as RunSpec's 0 = off."""
    v = _first(v)
    return 0.0 if v is None or str(v).strip().lower() in ("none", "null", "") else float(v)


def _scale_rewards(v: Any) -> str:
    s = str(_first(v)).strip().lower()
    if s in ("group", "batch", "none"):
        return s
    return "group" if _bool(s) else "none"


def _deepspeed(v: Any, res: ImportResult, opt: str) -> None:
    s = str(_first(v)).lower()
    m = re.search(r"zero[_-]?(\d)", s)
    if m and not s.endswith(".json"):
        res.values["resources.deepspeed_stage"] = int(m.group(1))
        if "offload" in s:  # ms-swift's and TRL's zero3_offload offload parameters too
            res.values["resources.offload"] = True
            if m.group(1) == "3":
                res.values["resources.offload_params"] = True
    elif s.endswith(".json"):
        res.values["resources.deepspeed_config"] = str(_first(v))
        if m:
            res.values["resources.deepspeed_stage"] = int(m.group(1))
        else:
            res.unmapped.append(f"{opt} {v} (set resources.deepspeed_stage to the file's ZeRO stage)")
    else:
        res.unmapped.append(f"{opt} {v} (a DeepSpeed config file: set resources.deepspeed_config and deepspeed_stage)")


# ----------------------------------------------------------------------------- shared option table

# option name (the same in ms-swift and TRL) -> (field, converter)
_COMMON: dict[str, tuple[str, Any]] = {
    "lora_rank": ("model.lora_rank", _int),
    "lora_r": ("model.lora_rank", _int),
    "lora_alpha": ("model.lora_alpha", _int),
    "lora_dropout": ("model.lora_dropout", _num),
    "target_modules": ("model.lora_targets", _list),
    "lora_target_modules": ("model.lora_targets", _list),
    "gradient_checkpointing": ("model.gradient_checkpointing", lambda v: _bool(_first(v))),
    "trust_remote_code": ("model.trust_remote_code", lambda v: _bool(_first(v))),
    "system": ("data.system_prompt", lambda v: " ".join(v) if isinstance(v, list) else str(v)),
    "num_generations": ("rollout.num_generations", _int),
    "temperature": ("rollout.temperature", _num),
    "top_p": ("rollout.top_p", _num),
    "top_k": ("rollout.top_k", lambda v: max(0, _int(v))),  # -1 (off) in vLLM terms is 0 here
    "max_completion_length": ("rollout.max_completion_length", _int),
    "vllm_gpu_memory_utilization": ("rollout.gpu_memory_utilization", _num),
    "vllm_tensor_parallel_size": ("rollout.tensor_parallel_size", _int),
    "vllm_data_parallel_size": ("rollout.data_parallel_size", _int),
    "vllm_enable_sleep_mode": ("rollout.sleep", lambda v: _bool(_first(v))),
    "sleep_level": ("rollout.sleep", lambda v: _int(v) > 0),
    "async_generate": ("rollout.async_generation", lambda v: _bool(_first(v))),
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
    "use_bias_correction_kl": ("algorithm.use_bias_correction_kl", lambda v: _bool(_first(v))),
    "off_policy_mask_threshold": ("algorithm.off_policy_mask_threshold", _off_if_none),
    "off_policy_sequence_mask_delta": ("algorithm.off_policy_mask_threshold", _off_if_none),  # ms-swift's name
    "top_entropy_quantile": ("algorithm.top_entropy_quantile", _num),
    "entropy_coef": ("algorithm.entropy_coef", _num),
    "use_adaptive_entropy": ("algorithm.use_adaptive_entropy", lambda v: _bool(_first(v))),
    "entropy_target": ("algorithm.entropy_target", _num),
    "entropy_coef_min": ("algorithm.entropy_coef_min", _num),
    "entropy_coef_max": ("algorithm.entropy_coef_max", _num),
    "entropy_coef_delta": ("algorithm.entropy_coef_delta", _num),
    "disable_dropout": ("algorithm.disable_dropout", lambda v: _bool(_first(v))),
    "importance_sampling_level": ("algorithm.importance_sampling_level", lambda v: str(_first(v)).lower()),
    "mask_truncated_completions": ("algorithm.mask_truncated_completions", lambda v: _bool(_first(v))),
    "overlong_filter": ("algorithm.mask_truncated_completions", lambda v: _bool(_first(v))),
    "dynamic_sample": ("algorithm.dynamic_sampling", lambda v: _bool(_first(v))),
    "max_resample_times": ("algorithm.dynamic_sampling_max_retries", _int),
    "learning_rate": ("algorithm.learning_rate", _num),
    "warmup_steps": ("algorithm.warmup_steps", _int),
    "weight_decay": ("algorithm.weight_decay", _num),
    "max_grad_norm": ("algorithm.max_grad_norm", _num),
    "gradient_accumulation_steps": ("algorithm.gradient_accumulation_steps", _int),
    "max_steps": ("algorithm.max_steps", _int),
    "seed": ("algorithm.seed", _int),
    "save_steps": ("output.save_steps", _int),
    "save_total_limit": ("output.save_total_limit", _int),
    "eval_steps": ("output.eval_steps", _int),
}


def _map_common(key: str, value: Any, res: ImportResult, shown: str) -> bool:
    """Map the options both tools share; True when handled (mapped or listed as unmapped)."""
    if key in ("off_policy_mask_threshold", "off_policy_sequence_mask_delta") and str(_first(value)) in ("0", "0.0"):
        res.unmapped.append(f"{shown} (a threshold of exactly 0 is 'off' here: use a small positive value)")
        return True
    if key in _COMMON:
        path, conv = _COMMON[key]
        try:
            res.values[path] = conv(value)
        except (TypeError, ValueError):
            res.unmapped.append(f"{shown} (could not read {value!r})")
        return True
    if key in ("torch_dtype", "dtype"):
        d = _DTYPES.get(str(_first(value)).lower())
        if d:
            res.values["model.dtype"] = d
        else:
            res.unmapped.append(shown)
        return True
    if key in ("bf16", "fp16") and _bool(_first(value)):
        res.values["model.dtype"] = "bfloat16" if key == "bf16" else "float16"
        return True
    if key == "lr_scheduler_type":
        s = _SCHEDULERS.get(str(_first(value)).lower())
        if s:
            res.values["algorithm.lr_scheduler"] = s
        else:
            res.unmapped.append(f"{shown} (schedules here: constant, linear, cosine)")
        return True
    if key == "report_to":
        vals = [v for v in _list(value) if v not in ("none", "all")]
        res.values["output.report_to"] = [v for v in vals if v in _REPORT]
        for v in vals:
            if v not in _REPORT:
                res.unmapped.append(f"{shown}: {v}")
        return True
    if key == "deepspeed":
        _deepspeed(value, res, shown.split(" ")[0])
        return True
    if key == "use_vllm":
        if _bool(_first(value)):
            res.values["rollout.engine"] = "vllm"
        return True
    if key == "vllm_mode":
        mode = str(_first(value)).lower()
        res.values["rollout.placement"] = "separate" if mode == "server" else "colocate"
        if mode == "server":
            res.notes.append("vllm_mode server -> placement separate: set resources.rollout_gpus to the GPUs "
                             "the vLLM server used")
        return True
    if key in ("log_completions",):
        res.values["output.log_samples_steps"] = 1 if _bool(_first(value)) else 0
        return True
    return False


def _finish_batch(res: ImportResult, per_device: int | None, nproc: int, opts: dict[str, Any]) -> None:
    """TRL and ms-swift count completions per device per micro-batch; RunSpec counts prompts per step."""
    if per_device is None:
        return
    g = res.values.get("rollout.num_generations", RunSpec().rollout.num_generations)
    ga = res.values.get("algorithm.gradient_accumulation_steps", 1)
    gen_bs = opts.get("generation_batch_size")
    completions = int(gen_bs) if gen_bs else per_device * nproc * ga
    if completions % g:
        res.notes.append(f"{completions} completions per step are not a multiple of num_generations={g}; "
                         f"prompts_per_step rounded down")
    res.values["algorithm.prompts_per_step"] = max(1, completions // g)
    res.notes.append(f"prompts_per_step = per_device_train_batch_size {per_device} x {nproc} process(es) x "
                     f"gradient_accumulation_steps {ga} / num_generations {g} = {max(1, completions // g)}")


def _finish_warmup(res: ImportResult, ratio: float | None) -> None:
    if ratio is None:
        return
    steps = res.values.get("algorithm.max_steps")
    if steps:
        res.values["algorithm.warmup_steps"] = int(round(ratio * steps))
        res.notes.append(f"warmup_ratio {ratio} x max_steps {steps} -> warmup_steps {res.values['algorithm.warmup_steps']}")
    else:
        res.unmapped.append(f"warmup_ratio {ratio} (no max_steps to convert it with: set algorithm.warmup_steps)")


def _finish_dropout(res: ImportResult) -> None:
    """TRL and ms-swift keep dropout unless told (disable_dropout defaults to False there, True here): a LoRA
    dropout the config asks for is kept by turning disable_dropout off."""
    if res.values.get("model.lora_dropout", 0) > 0 and "algorithm.disable_dropout" not in res.values:
        res.values["algorithm.disable_dropout"] = False
        res.notes.append("lora_dropout > 0 and no disable_dropout: dropout kept (algorithm.disable_dropout false)")


def _rewards(names: list[str], weights: list[float] | None, res: ImportResult) -> None:
    if not names:
        return
    weights = weights or [1.0] * len(names)
    if len(weights) != len(names):
        res.notes.append(f"{len(weights)} reward weights for {len(names)} reward functions: weights set to 1.0")
        weights = [1.0] * len(names)
    res.values["rewards.functions"] = [{"name": n, "weight": float(w), "params": {}} for n, w in zip(names, weights)]
    res.notes.append("reward functions keep their names; a name that is not a built-in here needs a plugin file "
                     "defining it (rewards.plugins)")


# ----------------------------------------------------------------------------- ms-swift

def parse_swift_args(cmdline: str) -> tuple[dict[str, str], dict[str, list[str]], list[str]]:
    """Split `ENV=1 swift rlhf --opt v1 v2 --flag ...` into env assignments, options and stray tokens."""
    text = re.sub(r"\\\r?\n", " ", cmdline)
    # whole-line comments only: '#' inside a word is data ('NuminaMath-TIR#5000' is a sample count)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    tokens = shlex.split(text)
    env: dict[str, str] = {}
    opts: dict[str, list[str]] = {}
    stray: list[str] = []
    i = 0
    while i < len(tokens) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[i]):
        k, _, v = tokens[i].partition("=")
        env[k] = v
        i += 1
    while i < len(tokens) and not tokens[i].startswith("--"):
        stray.append(tokens[i])  # 'swift', 'rlhf' (or 'python', 'cli/rlhf.py', ...)
        i += 1
    current: str | None = None
    for tok in tokens[i:]:
        if tok.startswith("--"):
            name, eq, val = tok[2:].partition("=")
            current = name.replace("-", "_")
            opts[current] = [val] if eq else []
        elif current is not None:
            opts[current].append(tok)
        else:
            stray.append(tok)
    return env, opts, stray


def import_swift(cmdline: str) -> ImportResult:
    env, opts, stray = parse_swift_args(cmdline)
    res = ImportResult()
    words = [s for s in stray if s not in ("swift", "rlhf")]
    if words:
        res.unmapped.append("positional: " + " ".join(words))
    rtype = opts.pop("rlhf_type", ["grpo"])
    if rtype and rtype[0] != "grpo":
        res.notes.append(f"--rlhf_type {rtype[0]}: only GRPO maps onto a RunSpec")
    if "CUDA_VISIBLE_DEVICES" in env:
        gpus = [int(g) for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip().isdigit()]
        if gpus:
            res.values["resources.train_gpus"] = gpus
            res.values["resources.device"] = "cuda"
    nproc = int(env.get("NPROC_PER_NODE", "1") or 1) if env.get("NPROC_PER_NODE", "1").isdigit() else 1
    for k, v in env.items():
        if k not in ("CUDA_VISIBLE_DEVICES", "NPROC_PER_NODE"):
            res.unmapped.append(f"{k}={v}")
    per_device = None
    warmup_ratio = None
    reward_names: list[str] = []
    reward_weights: list[float] | None = None
    for key, vals in opts.items():
        shown = f"--{key} {' '.join(vals)}".strip()
        value: Any = vals if len(vals) != 1 else vals[0]
        if vals == []:
            value = "true"  # a bare flag
        if key == "model":
            res.values["model.name_or_path"] = str(_first(value))
        elif key == "train_type":
            t = str(_first(value)).lower()
            if t in ("lora", "full"):
                res.values["model.finetune"] = t
            else:
                res.unmapped.append(f"{shown} (here: lora or full)")
        elif key == "dataset":
            res.values["data.sources"] = list(vals)
        elif key == "val_dataset":
            res.values["data.eval_sources"] = list(vals)
        elif key == "reward_funcs":
            reward_names = list(vals)
        elif key == "reward_weights":
            reward_weights = [float(w) for w in vals]
        elif key == "external_plugins":
            res.values["rewards.plugins"] = list(vals)
            res.notes.append("ms-swift plugins register rewards through its orms registry; here a plugin file's "
                             "top-level functions are the reward names")
        elif key == "per_device_train_batch_size":
            per_device = _int(value)
        elif key == "warmup_ratio":
            warmup_ratio = _num(value)
        elif key == "dataset_num_proc" or key == "split_dataset_ratio":
            res.unmapped.append(shown)
        elif not _map_common(key, value, res, shown):
            res.unmapped.append(shown)
    if res.values.get("rollout.engine") == "vllm" and "rollout.placement" not in res.values:
        res.values["rollout.placement"] = "colocate"
    _rewards(reward_names, reward_weights, res)
    _finish_dropout(res)
    _finish_batch(res, per_device, nproc, {})
    _finish_warmup(res, warmup_ratio)
    return res


# ----------------------------------------------------------------------------- TRL

def parse_config_text(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise SpecError([SpecIssue("", f"not JSON or YAML: {err}")]) from None
    if not isinstance(data, dict):
        raise SpecError([SpecIssue("", "expected a mapping of GRPOConfig options")])
    return data


def import_trl(text: str) -> ImportResult:
    """A TRL GRPOConfig (plus the ScriptArguments/ModelConfig keys TRL's grpo script reads) as YAML or JSON."""
    opts = parse_config_text(text)
    res = ImportResult()
    per_device = None
    warmup_ratio = None
    reward_names: list[str] = []
    reward_weights = None
    nproc = 1
    for key, value in opts.items():
        shown = f"{key}: {json.dumps(value, default=str)}"
        if key == "model_name_or_path":
            res.values["model.name_or_path"] = str(value)
        elif key == "use_peft":
            res.values["model.finetune"] = "lora" if _bool(value) else "full"
        elif key in ("dataset_name", "dataset_path"):
            res.values["data.sources"] = _list(value) if not isinstance(value, list) else [str(v) for v in value]
        elif key == "dataset_train_split" and value != "train":
            res.unmapped.append(shown)
        elif key == "dataset_train_split":
            continue
        elif key == "reward_funcs":
            reward_names = _list(value) if not isinstance(value, list) else [str(v) for v in value]
        elif key == "reward_weights":
            reward_weights = [float(w) for w in (value or [])] if value else None
        elif key == "per_device_train_batch_size":
            per_device = int(value)
        elif key == "num_processes":
            nproc = int(value)
        elif key == "warmup_ratio":
            warmup_ratio = float(value)
        elif key == "generation_batch_size":
            continue  # used by _finish_batch
        elif key == "steps_per_generation":
            res.notes.append(f"steps_per_generation {value}: here one rollout batch serves num_iterations updates")
            res.unmapped.append(shown)
        elif not _map_common(key, value, res, shown):
            res.unmapped.append(shown)
    if res.values.get("rollout.engine") == "vllm" and "rollout.placement" not in res.values:
        res.values["rollout.placement"] = "colocate"  # TRL's default vllm_mode is server; colocate is the safe guess
        res.notes.append("use_vllm without vllm_mode: TRL defaults to server mode; mapped to colocate here")
    _rewards(reward_names, reward_weights, res)
    _finish_dropout(res)
    _finish_batch(res, per_device, nproc, opts)
    _finish_warmup(res, warmup_ratio)
    if per_device is not None and nproc == 1:
        res.notes.append("assumed 1 training process (add num_processes: N to the text to convert for N GPUs)")
    return res


def import_any(text: str) -> ImportResult:
    """An ms-swift command line when the text mentions swift or starts with options, else a TRL config."""
    stripped = text.strip()
    if re.search(r"(^|\s)swift\s+rlhf\b", stripped) or stripped.startswith("--") or re.match(
            r"^([A-Z_]+=\S+\s+)+swift\b", stripped):
        return import_swift(stripped)
    return import_trl(stripped)
