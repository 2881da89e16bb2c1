"""A RunSpec written out as an ms-swift command and a TRL config: the importers' other way.

`export_swift(spec)` writes `swift rlhf --rlhf_type grpo ...` with its launch environment before it;
`export_trl(spec)` the YAML config of `trl grpo --config grpo.yaml` (GRPOConfig, ModelConfig and the grpo
script's keys; TRL's launcher reads `num_processes` and `accelerate_config` from it too). Each goes as far as its
tool can express the spec.

The contract (tests/test_exporters.py holds it for every preset and a set of varied specs):
- importing the export gives the spec back on every field but those in `inexpressible`, and those come back
  different: each is listed with the reason, nothing is lost silently;
- the mapping is the importers' (backend/importers.py: TABLES): an option the importer maps onto a field is
  written from that table, in the tool's own spelling, through the inverse of its converter, so an option added
  there is exported too; only what the importer reads in code (model, data, rewards, the batch, the launch) is
  written here;
- an option is left out only where the source's defaults table holds its value (the import fills it back, which
  is checked by importing), or where its null, the tool's own default, is the value (off);
- every word is quoted for the shell, so a system prompt with quotes or newlines survives.
Pure functions; the only import they run is that check.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from backend.data import is_hub_dataset, split_subset
from backend.importers import (
    SWIFT_SOURCE,
    TABLES,
    TRL_SOURCE,
    ImportResult,
    import_swift,
    import_trl,
    options_for,
)
from backend.spec import LOSS_TYPES, RunSpec

SWIFT = "ms-swift"
TRL = "TRL"


@dataclass(frozen=True)
class Inexpressible:
    field: str  # 'section.field'
    value: str  # the spec's value, as JSON
    reason: str

    def __str__(self) -> str:
        return f"{self.field} = {self.value} ({self.reason})"


@dataclass
class ExportResult:
    tool: str  # SWIFT or TRL
    text: str  # the command / the config
    inexpressible: list[Inexpressible] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the text needs beside it (plugins, a server, GPUs)

    @property
    def fields(self) -> list[str]:
        return [i.field for i in self.inexpressible]


# Names the shared table accepts as aliases but the tool itself does not spell (it has its own name, or none):
# the other tool's names, older names, Megatron's. TRL's are held to its dataclasses by the tests; ms-swift's were
# checked against its arguments at the commit its defaults table was read from (it always trusts remote code).
_NOT_SPELLED: dict[str, frozenset[str]] = {
    SWIFT: frozenset({
        "trust_remote_code",
        "lora_r", "lora_target_modules", "max_tool_calling_iterations", "vllm_enable_sleep_mode",
        "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_cap", "sapo_temperature_pos", "sapo_temperature_neg", "use_bias_correction_kl",
        "off_policy_mask_threshold", "entropy_coef", "use_adaptive_entropy", "entropy_target", "entropy_coef_min",
        "entropy_coef_max", "entropy_coef_delta", "mask_truncated_completions", "lr", "clip_grad", "lr_warmup_iters",
        "max_new_tokens", "dataset_prompt_column", "system_prompt",
        # TRL's GDPO and VESPO (ms-swift spells GDPO as --scale_rewards gdpo, which the importer reads)
        "multi_objective_aggregation", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg",
        "vllm_max_model_length"}),
    TRL: frozenset({
        "advantage_estimator",  # ms-swift's: TRL's GRPOTrainer has the group baseline only
        "kl_in_reward",  # ms-swift's: TRL's GRPOTrainer keeps the KL in the loss (its RLOOTrainer in the reward)
        "vllm_max_model_len",
        "lora_rank", "target_modules", "max_turns", "sleep_level", "async_generate", "vllm_data_parallel_size",
        "vllm_importance_sampling_cap", "tau_pos", "tau_neg", "off_policy_sequence_mask_delta", "overlong_filter",
        "dynamic_sample", "max_resample_times", "lr", "clip_grad", "lr_warmup_iters", "max_new_tokens",
        # open-r1's keys: written, they would make the config read as an open-r1 recipe with its defaults
        "dataset_prompt_column", "system_prompt"}),
}
# the inverse of a table converter that is not the identity (checked: the converter gives the value back)
_INVERSE: dict[str, Callable[[Any], Any]] = {
    "sleep_level": lambda on: 1 if on else 0,
    "max_tool_calling_iterations": lambda turns: turns - 1,
}
# why a field no option carries cannot be written, where it is more than "no such option"
_WHY: dict[str, str] = {
    "model.trust_remote_code": "ms-swift always trusts the model's code",
    "data.prompt_template": "the prompt is built from columns here; the tools read one prompt column",
    "data.chat_template": "the tools always apply the tokenizer's chat template",
    "data.max_prompt_tokens": "a bound this studio checks before launch (TRL 1.x does not cut prompts)",
    "data.prompt_truncation": "TRL 1.x does not cut prompts (its max_prompt_length is gone)",
    "data.limit": "give the dataset a sample count (id#N) instead",
    "rewards.on_error": "a reward error always fails the run in the tools",
    "rewards.timeout_s": "the tools run rewards in the trainer's process, without a timeout",
    "rollout.max_staleness": "the tools' async generation is one step ahead",
    "algorithm.skip_solved_prompts": "a rollout filter of this trainer",
    "algorithm.replay_solved": "a rollout filter of this trainer",
    "algorithm.advantage_calibration": "an advantage variant of this trainer",
    "algorithm.logprob_chunk_tokens": "a memory setting of this trainer",
    "output.runs_dir": "the studio's runs folder",
}
# ... by the start of the field's path
_PREFIX_WHY = {
    "tools.": "tools and environments are Python objects in the tools (passed to the trainer in code)",
    "rollout.worker": "rollout workers of this trainer",
    "rollout.weight_sync": "weight sync of this trainer",
    "rollout.lmdeploy": "an LMDeploy setting: the tools sample with vLLM",
    "resources.num_threads": "the tools take torch's threads",
}
_BASE: dict[str, Any] = {f"{s}.{k}": v for s, sec in RunSpec().model_dump(mode="json").items() for k, v in sec.items()}


class _Out:
    """An export in progress: the options written, the fields handled, what was lost."""

    def __init__(self, spec: RunSpec, tool: str):
        self.spec = spec
        self.tool = tool
        self.source = SWIFT_SOURCE if tool == SWIFT else TRL_SOURCE
        self.data = spec.model_dump(mode="json")
        self.opts: dict[str, Any] = {}  # option -> value, in the order written
        self.env: dict[str, str] = {}  # ms-swift's launch environment
        self.lost: list[Inexpressible] = []
        self.notes: list[str] = []
        self.done: set[str] = set()  # fields handled

    def value(self, path: str) -> Any:
        section, name = path.split(".")
        return self.data[section][name]

    def put(self, path: str, key: str, raw: Any) -> None:
        self.opts[key] = raw
        self.done.add(path)

    def expect(self, path: str, comes_back: Any, reason: str) -> None:
        """The import gives `path` as `comes_back`: listed when that is not the spec's value."""
        self.done.add(path)
        if comes_back != self.value(path) and path not in {i.field for i in self.lost}:
            self.lost.append(Inexpressible(path, json.dumps(self.value(path)), reason))

    def missing(self, path: str) -> None:
        """No option carries `path`: the import leaves RunSpec's default."""
        why = _WHY.get(path) or next((r for p, r in _PREFIX_WHY.items() if path.startswith(p)), "")
        self.expect(path, _BASE[path], f"no {self.tool} option for it" + (f": {why}" if why else ""))


# ----------------------------------------------------------------------------- the parts read in code

def _model(out: _Out) -> None:
    m = out.spec.model
    lora = m.finetune == "lora"
    if out.tool == SWIFT:
        out.put("model.name_or_path", "model", m.name_or_path)
        out.put("model.finetune", "tuner_type", m.finetune)
        out.put("model.dtype", "torch_dtype", m.dtype)
        out.opts["use_hf"] = True  # hub ids here are Hugging Face ids; ms-swift reads ModelScope unless told
        return
    out.put("model.name_or_path", "model_name_or_path", m.name_or_path)
    out.put("model.finetune", "use_peft", lora)
    if m.dtype == "auto":
        out.put("model.dtype", "dtype", "auto")
    else:  # TRL trains in bf16 / fp16 mixed precision or fp32; the import reads the flags so
        out.put("model.dtype", "bf16", m.dtype == "bfloat16")
        if m.dtype == "float16":
            out.opts["fp16"] = True


def _data(out: _Out) -> None:
    d = out.spec.data
    if out.tool == SWIFT:
        out.put("data.sources", "dataset", list(d.sources))
        if d.eval_sources:
            out.put("data.eval_sources", "val_dataset", list(d.eval_sources))
        out.done.add("data.eval_sources")
        _swift_system(out, d.system_prompt)
        roles = {path: role for role, path in reversed(TABLES.swift_columns.items())}  # the first role a field has
        columns: dict[str, str] = {}
        for path, role in roles.items():
            col = out.value(path)
            if col != _BASE[path] and col and col not in columns:
                columns[col] = role
            out.expect(path, col if col in columns else _BASE[path], "ms-swift's --columns maps one role per column")
        if columns:
            out.opts["columns"] = json.dumps(columns)
        if d.prompt_truncation != "refuse":  # ms-swift's GRPO bounds the prompt by max_length
            out.put("data.max_prompt_tokens", "max_length", d.max_prompt_tokens)
            out.put("data.prompt_truncation", "truncation_strategy", d.prompt_truncation)
        kwargs = dict(d.chat_template_kwargs)
        if set(kwargs) == {"enable_thinking"} and isinstance(kwargs["enable_thinking"], bool):
            out.put("data.chat_template_kwargs", "enable_thinking", kwargs["enable_thinking"])
        else:
            out.expect("data.chat_template_kwargs", {}, "ms-swift passes one chat-template argument, "
                                                        "--enable_thinking")
        return
    if d.chat_template_kwargs:
        out.put("data.chat_template_kwargs", "chat_template_kwargs", dict(d.chat_template_kwargs))
    sources = [s.rpartition("#")[0] if re.search(r"#\d+$", s) else s for s in d.sources]
    name, subset = split_subset(sources[0]) if len(sources) == 1 and is_hub_dataset(sources[0]) else (None, None)
    if subset:  # TRL names a hub dataset's config apart
        out.put("data.sources", "dataset_name", name)
        out.opts["dataset_config"] = subset
    elif len(sources) == 1:
        out.put("data.sources", "dataset_name", sources[0])
    else:
        out.put("data.sources", "datasets", [{"path": s} for s in sources])
    out.expect("data.sources", sources, "TRL reads whole datasets: the sample counts (#N) are left out")
    out.expect("data.eval_sources", [], "TRL's grpo script evaluates on a split of the training dataset")
    out.expect("data.system_prompt", "", "TRL has no system prompt: put it in the dataset's prompt messages")
    for path in TABLES.swift_columns.values():
        out.expect(path, _BASE[path], "TRL passes every dataset column to the rewards by its own name, and the "
                                      "prompt is the 'prompt' column")


def _swift_system(out: _Out, text: str) -> None:
    path = "data.system_prompt"
    if not text:
        out.done.add(path)
    elif re.fullmatch(r"[\w./~-]+\.(txt|md|jinja|prompt)", text.strip()):
        out.expect(path, "", "ms-swift reads a --system that names a file as that file")
    elif text.startswith("-") or re.search(r"\$[{A-Za-z_]", text):
        out.expect(path, "", "a --system that starts with '-' or holds $VAR is read as an option or a variable")
    else:
        out.put(path, "system", text)


def _rewards(out: _Out) -> None:
    tool = "swift" if out.tool == SWIFT else "trl"
    theirs = {ours: name for name, ours in reversed(TABLES.reward_aliases[tool].items())}
    params_of = {(reward, param): key for key, (reward, param) in TABLES.reward_params[tool].items()}
    defaults = TABLES.defaults[out.source]
    reasons: list[str] = []
    funcs: list[dict[str, Any]] = []  # what the import gives back, in the export's order
    names: list[str] = []
    models: list[dict[str, Any]] = []
    for f in out.spec.rewards.functions:
        if f.name == "reward_model":
            if set(f.params) != {"path"}:
                reasons.append("a reward_model is its path alone in the tools")
            if out.tool == TRL and models:
                reasons.append("TRL takes one reward model")
                continue
            models.append({"name": f.name, "weight": f.weight, "params": {"path": str(f.params.get("path", ""))}})
            continue
        if f.name not in theirs and (f.name in TABLES.rewards_lacking or f.name in TABLES.reward_aliases[tool] or
                                     (out.tool == TRL and f.name in TABLES.openr1_rewards)):
            reasons.append(f"{f.name}: the import reads this name as the {out.tool} reward it names there")
            continue
        back: dict[str, Any] = {}
        for param, v in f.params.items():
            key = params_of.get((f.name, param))
            if key is None:
                reasons.append(f"{f.name}'s {param}: no {out.tool} option for it")
                continue
            try:
                back[param] = TABLES.param_types.get(param, float)(v)
            except (TypeError, ValueError):
                reasons.append(f"{f.name}'s {param}: {v!r} is not a number")
                continue
            out.opts[key] = v
        for (reward, param), key in params_of.items():  # the import fills the other options from the defaults
            if reward == f.name and param not in f.params:
                d = defaults.get(key)
                if d is None and param in ("max_len", "max_completion_len"):
                    d = out.spec.rollout.max_completion_length
                if d is not None:
                    back[param] = TABLES.param_types.get(param, float)(d)
                    reasons.append(f"{f.name}: {out.tool} sets {key} {d} where the spec leaves it to the reward")
        funcs.append({"name": f.name, "weight": f.weight, "params": back})
        names.append(theirs.get(f.name, f.name))
        if f.name not in theirs:
            out.notes.append(f"reward {f.name!r} is this studio's: " + (
                "ms-swift needs it registered by a plugin (--external_plugins)" if out.tool == SWIFT else
                "TRL's grpo script needs it as an import path (module.function)"))
    entries = funcs + models if out.tool == SWIFT else models + funcs
    if [e["name"] for e in entries] != [f.name for f in out.spec.rewards.functions if f.name in
                                        {e["name"] for e in entries}]:
        reasons.append(f"{out.tool} orders reward models " + ("after" if out.tool == SWIFT else "before") +
                       " the functions")
    if names:
        out.opts["reward_funcs"] = names
    if models:
        if out.tool == SWIFT:
            out.opts["reward_model"] = [m["params"]["path"] for m in models]
        else:
            out.opts["reward_model_name_or_path"] = models[0]["params"]["path"]
    weights = [e["weight"] for e in entries]
    if any(w != 1.0 for w in weights):
        out.opts["reward_weights"] = weights
    out.expect("rewards.functions", entries or _BASE["rewards.functions"], "; ".join(reasons) or
               "the tools need at least one reward")
    if out.tool == SWIFT and out.spec.rewards.plugins:
        out.put("rewards.plugins", "external_plugins", list(out.spec.rewards.plugins))
    out.expect("rewards.plugins", out.spec.rewards.plugins if out.tool == SWIFT else [],
               "TRL names reward functions by import path, not by file")


def _engine(out: _Out) -> None:
    r = out.spec.rollout
    if r.engine == "vllm":
        out.put("rollout.engine", "use_vllm", True)
        out.put("rollout.placement", "vllm_mode", "server" if r.placement == "separate" else "colocate")
        if r.placement == "separate":
            out.notes.append("vllm_mode server: start the vLLM server apart on the rollout GPUs " + (
                "(swift rollout --model ...)" if out.tool == SWIFT else "(trl vllm-serve --model ...)"))
        return
    out.expect("rollout.engine", "hf", f"{out.tool} samples with vLLM or the trainer's own generate")
    out.expect("rollout.placement", "colocate", "without vLLM the tools sample in the trainer's processes")


def _world(out: _Out) -> int:
    """Writes the launch; the training processes in all."""
    r = out.spec.resources
    ranks, gpus = r.ranks_per_node, list(r.train_gpus)
    if out.tool == SWIFT:
        if gpus:
            out.env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        if ranks > 1:
            out.env["NPROC_PER_NODE"] = str(ranks)
        for name, path in (("NNODES", "resources.nnodes"), ("NODE_RANK", "resources.node_rank"),
                           ("MASTER_ADDR", "resources.master_addr"), ("MASTER_PORT", "resources.master_port")):
            if out.value(path) != _BASE[path]:
                out.env[name] = str(out.value(path))
            out.done.add(path)
        out.expect("resources.train_gpus", gpus[:ranks] if len(gpus) > ranks else gpus,
                   "ms-swift trains on the first NPROC_PER_NODE of CUDA_VISIBLE_DEVICES")
        out.expect("resources.device", "cuda" if gpus or ranks * r.nnodes > 1 else _BASE["resources.device"],
                   "ms-swift chooses its device: the import reads cuda from CUDA_VISIBLE_DEVICES or several "
                   "processes")
        out.expect("resources.nproc_per_node", ranks if ranks > 1 and len(gpus) != ranks else 0,
                   "NPROC_PER_NODE and CUDA_VISIBLE_DEVICES give the processes")
        out.expect("resources.rollout_gpus", [], "ms-swift's vLLM server is started apart, on the GPUs given it")
        return ranks * r.nnodes
    world = r.world_size
    if world > 1:
        out.opts["num_processes"] = world
    if gpus:
        out.notes.append(f"launch with CUDA_VISIBLE_DEVICES={','.join(str(g) for g in gpus)}")
    why = "a TRL config counts processes (num_processes, over all machines), not GPUs or nodes"
    out.expect("resources.nproc_per_node", world if world > 1 else 0, why)
    for path in ("resources.train_gpus", "resources.device", "resources.nnodes", "resources.node_rank",
                 "resources.master_addr", "resources.master_port"):
        out.expect(path, _BASE[path], why)
    out.expect("resources.rollout_gpus", [], "TRL's vLLM server (trl vllm-serve) is started apart, on its GPUs")
    return world


def _deepspeed(out: _Out) -> None:
    r = out.spec.resources
    stage, offload, params = r.deepspeed_stage, False, False
    if r.deepspeed_config:
        out.put("resources.deepspeed_config", "deepspeed", r.deepspeed_config)
        m = re.search(r"zero[_-]?(\d)", r.deepspeed_config.lower())
        stage = int(m.group(1)) if m else 0
        why = "the import reads the stage from the file's name (zero2/zero3)"
    elif stage:
        off = r.offload and (stage == 3 or out.tool == SWIFT and stage == 2)
        if out.tool == SWIFT:
            out.opts["deepspeed"] = f"zero{stage}" + ("_offload" if off else "")
            offload, params = off, off and stage == 3
            why = "ms-swift's DeepSpeed configs: zero1, zero2, zero2_offload, zero3, zero3_offload"
        else:
            out.opts["accelerate_config"] = f"zero{stage}"
            why = "TRL's accelerate configs: zero1, zero2, zero3 (no offload)"
    else:
        why = "DeepSpeed options without a stage"
    out.expect("resources.deepspeed_config", r.deepspeed_config, why)
    out.expect("resources.deepspeed_stage", stage, why)
    out.expect("resources.offload", offload, why)
    out.expect("resources.offload_params", params, why)


def _schedule(out: _Out, world: int) -> None:
    a, g = out.spec.algorithm, out.spec.rollout.num_generations
    out.put("algorithm.lr_scheduler", "lr_scheduler_type", a.lr_scheduler)
    out.put("algorithm.max_steps", "max_steps", a.max_steps)
    # the tools count completions per device per micro-batch
    total, per_step = a.prompts_per_step * g, world * a.gradient_accumulation_steps
    per_device = max(1, total // per_step)
    out.put("algorithm.prompts_per_step", "per_device_train_batch_size", per_device)
    out.expect("algorithm.prompts_per_step", max(1, per_device * per_step // g),
               f"{total} completions a step do not split into {world} process(es) x "
               f"{a.gradient_accumulation_steps} accumulation step(s)")
    # a generation batch: the tools count it in micro-batches, N optimizer steps here (absent: one per step)
    n = out.spec.rollout.steps_per_generation
    if n > 1:
        out.put("rollout.steps_per_generation", "steps_per_generation", n * a.gradient_accumulation_steps)
    out.done.add("rollout.steps_per_generation")
    if a.sync_ref_model:  # the two parameters mean nothing without it, in the tools too
        out.put("algorithm.sync_ref_model", "sync_ref_model", True)
        out.put("algorithm.ref_model_mixup_alpha", "ref_model_mixup_alpha", a.ref_model_mixup_alpha)
        out.put("algorithm.ref_model_sync_steps", "ref_model_sync_steps", a.ref_model_sync_steps)
    for path in ("algorithm.sync_ref_model", "algorithm.ref_model_mixup_alpha", "algorithm.ref_model_sync_steps"):
        out.expect(path, out.value(path) if a.sync_ref_model else _BASE[path], "ignored without sync_ref_model")
    o = out.spec.output
    out.put("output.report_to", "report_to", list(o.report_to) or "none")
    out.put("output.log_samples_steps", "log_completions", o.log_samples_steps > 0)
    out.expect("output.log_samples_steps", min(o.log_samples_steps, 1), "the tools log completions every step "
                                                                          "or never")


def _table(out: _Out) -> None:
    """Every field the shared table maps, in the tool's spelling; the rest listed where it differs from what the
    import leaves."""
    for path in _BASE:
        if path in out.done:
            continue
        keys = [k for k in options_for(path) if k not in _NOT_SPELLED[out.tool]]
        if not keys:
            out.missing(path)
            continue
        key, value = keys[0], out.value(path)
        conv = TABLES.options[key][1]
        if key in TABLES.null_means and _gives(conv, None, value):
            out.done.add(path)  # null (off) is the tool's own default: nothing to write
            continue
        raw = _INVERSE.get(key, lambda v: v)(value)
        if (isinstance(raw, list) and not raw) or not _gives(conv, raw, value):
            out.expect(path, _BASE[path], f"{out.tool}'s {key} cannot hold it")
            continue
        out.put(path, key, raw)


def _gives(conv: Callable[[Any], Any], raw: Any, value: Any) -> bool:
    try:
        return conv(raw) == value
    except (TypeError, ValueError, AttributeError):
        return False


# options that take effect only with vLLM or LoRA: left out without them where the import is the same
_VLLM_ONLY = re.compile(r"vllm_.*|sleep_level")
_LORA_ONLY = {"lora_rank", "lora_r", "lora_alpha", "lora_dropout", "target_modules", "lora_target_modules"}


def _omit_defaults(out: _Out, reimport: Callable[[_Out], tuple[dict[str, Any], list[str]]]) -> None:
    """Leave out each option the source's defaults table fills back, that is off (False, 0, '': off is the tools'
    default too, as for RunSpec) or that has no effect in this run, where importing without it gives the same
    spec."""
    # ms-swift's defaults tied to another option: the learning rate (the tuner), kl_in_reward (the estimator)
    table = set(TABLES.defaults[out.source]) | ({"learning_rate", "kl_in_reward"} if out.tool == SWIFT else set())
    no_vllm = out.spec.rollout.engine != "vllm"
    full = out.spec.model.finetune == "full"
    unread = {f"algorithm.{o}" for name, info in LOSS_TYPES.items() if name != out.spec.algorithm.loss_type
              for o in info.options}  # options only another objective reads
    if not out.spec.tools.enabled:
        unread.add("rollout.max_turns")
    whole = reimport(out)
    for key in list(out.opts):
        path = TABLES.options[key][0] if key in TABLES.options else ""
        value = out.opts[key]
        off = value in (False, 0, "", []) and value is not None and _BASE.get(path) == value
        if not (key in table or off or path in unread or (no_vllm and _VLLM_ONLY.fullmatch(key))
                or (full and key in _LORA_ONLY)):
            continue
        kept = dict(out.opts)
        del out.opts[key]
        if reimport(out) != whole:
            out.opts = kept


# ----------------------------------------------------------------------------- text

def _words(v: Any) -> list[str]:
    if isinstance(v, bool):
        return ["true" if v else "false"]
    if isinstance(v, list):
        return [w for x in v for w in _words(x)]
    if isinstance(v, float):
        return [repr(v)]
    return [shlex.quote(str(v))]


def _swift_text(out: _Out) -> str:
    lines = [f"{k}={shlex.quote(v)}" for k, v in out.env.items()] + ["swift rlhf"]
    lines += [" ".join([f"    --{k}", *_words(v)]) for k, v in out.opts.items()]
    return " \\\n".join(lines) + "\n"


def _trl_text(out: _Out) -> str:
    head = "# trl grpo --config grpo.yaml\n"
    return head + yaml.safe_dump(out.opts, sort_keys=False, allow_unicode=True, width=100)


def _back(res: ImportResult) -> tuple[dict[str, Any], list[str]]:
    """What an import of the export gives: the spec, and what it could not apply (a default the tool fills but the
    import cannot honour, e.g. ms-swift's 3 epochs of unknown data, is not the spec's value)."""
    return res.apply().model_dump(mode="json"), sorted(str(u) for u in res.unmapped)


def _swift_back(out: _Out) -> tuple[dict[str, Any], list[str]]:
    return _back(import_swift(_swift_text(out)))


def _trl_back(out: _Out) -> tuple[dict[str, Any], list[str]]:
    return _back(import_trl(json.loads(json.dumps(out.opts))))  # the mapping YAML gives back, without the YAML


def export_swift(spec: RunSpec) -> ExportResult:
    """The spec as an ms-swift `swift rlhf --rlhf_type grpo` command, with its launch environment."""
    out = _Out(spec, SWIFT)
    out.opts["rlhf_type"] = "grpo"
    _export(out)
    _omit_defaults(out, _swift_back)
    return ExportResult(SWIFT, _swift_text(out), out.lost, out.notes)


def export_trl(spec: RunSpec) -> ExportResult:
    """The spec as the YAML config of TRL's `trl grpo --config grpo.yaml`."""
    out = _Out(spec, TRL)
    _export(out)
    _omit_defaults(out, _trl_back)
    return ExportResult(TRL, _trl_text(out), out.lost, out.notes)


def _export(out: _Out) -> None:
    _model(out)
    _data(out)
    _rewards(out)
    _engine(out)
    world = _world(out)
    _deepspeed(out)
    _schedule(out, world)
    _table(out)
