"""RunSpec: the one definition of a GRPO run.

Every option is declared here once, with its help text, default and bounds, and beside its English
help the studio's labels and Chinese help (`_ui`), so a translation is edited where its English is. The CLI
(`--set section.field=value`), the YAML presets and the studio's forms are all derived from
these declarations (see `iter_fields`). This module is the bottom of the backend: it imports
nothing from data, rewards or engines. Whether a spec can run (cross-field rules, files, columns,
rewards' needs, engines, GPUs) is decided one floor up, by `backend.checks`.

Runtime predicates that more than one place asks (whether the engine runs in worker processes, whether
training is on GPUs, how weights reach the engine) are derived properties here, written once, so the
checks, the planner and the trainer cannot disagree. `LOSS_TYPES` is the one table of per-objective
properties (clipped or not, how the loss is normalised, what it reads) that the checks, the ranks and
the loss math read.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


def _ui(label: str, label_zh: str, help_zh: str, advanced: bool = False) -> dict[str, Any]:
    """What the studio shows of a field beside its English help (the `description`): its label in English and
    Chinese, its Chinese help, and whether it is advanced (shown in a collapsed group). Kept here, next to the
    English, so a change to one is seen next to the other; `iter_fields` hands them out."""
    return {"label": label, "label_zh": label_zh, "help_zh": help_zh, "advanced": advanced}


# ----------------------------------------------------------------------------- loss types
# One table of what the code outside the loss math knows about each objective: the checks, the ranks (dist.py)
# and the trainer read it; backend/train/grpo.py registers one per-token term under each name (a test holds the
# registry's keys to this table's). A new objective is one row here and one function there.

# How a step's token losses become one number (grpo.aggregate):
#   sequence_mean       mean over the step's sequences of each sequence's token mean
#   sequence_sum        mean over the step's sequences of each sequence's token sum
#   global_tokens       token sum / tokens in the whole step
#   constant            token sum / (the step's sequences x max_completion_length)
#   micro_batch_tokens  token mean within each micro-batch, averaged over the micro-batches
Normaliser = Literal["sequence_mean", "sequence_sum", "global_tokens", "constant", "micro_batch_tokens"]


@dataclass(frozen=True)
class LossTypeInfo:
    clipped: bool  # the PPO-style clipped surrogate: `delta` and the clip_ratio/* metrics apply
    normaliser: Normaliser
    skip_zero_advantage: bool = False  # zero-advantage rows may be left out exactly (AlgorithmSection.zero_advantage_skippable)
    options: tuple[str, ...] = ()  # algorithm options only this objective reads
    importance_sampling_level: Literal["token", "sequence"] | None = None  # the ratio level it is defined on (None: either)
    weight_cap: bool = False  # epsilon_high caps the importance weight itself, not the ratio at 1 + epsilon_high
    folds_is_weights: bool = False  # takes per-token truncated IS weights into its own term instead of being multiplied

    @property
    def global_normaliser(self) -> bool:
        """Normalised by counts of the whole step, so the ranks' gradients sum to the one-rank gradient; a
        per-micro-batch mean (bnpo) is averaged over ranks instead."""
        return self.normaliser != "micro_batch_tokens"


LOSS_TYPES: dict[str, LossTypeInfo] = {
    "grpo": LossTypeInfo(clipped=True, normaliser="sequence_mean", skip_zero_advantage=True),
    "bnpo": LossTypeInfo(clipped=True, normaliser="micro_batch_tokens"),
    "dr_grpo": LossTypeInfo(clipped=True, normaliser="constant", skip_zero_advantage=True),
    "dapo": LossTypeInfo(clipped=True, normaliser="global_tokens", skip_zero_advantage=True),
    "cispo": LossTypeInfo(clipped=False, normaliser="global_tokens", weight_cap=True),
    "sapo": LossTypeInfo(clipped=False, normaliser="sequence_mean",
                         options=("sapo_temperature_pos", "sapo_temperature_neg")),
    "luspo": LossTypeInfo(clipped=True, normaliser="sequence_sum", importance_sampling_level="sequence"),
    "vespo": LossTypeInfo(clipped=False, normaliser="global_tokens", importance_sampling_level="token",
                          options=("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"),
                          folds_is_weights=True),
}
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]  # spelled out for type checkers
if get_args(LossType) != tuple(LOSS_TYPES):
    raise AssertionError("LossType and LOSS_TYPES name different loss types")
CLIPPED_LOSS_TYPES: tuple[str, ...] = tuple(name for name, info in LOSS_TYPES.items() if info.clipped)


# apply_chat_template's own arguments, which the prompt renderer sets (data.chat_template_kwargs may not)
CHAT_TEMPLATE_OWN_ARGS = frozenset({"conversation", "messages", "tools", "documents", "chat_template", "tokenize",
                                    "add_generation_prompt", "continue_final_message", "return_dict", "padding",
                                    "truncation", "max_length", "return_tensors", "return_assistant_tokens_mask"})


class Section(BaseModel):
    # NaN and infinity are never a setting: refused by name rather than as a failed bound ("should be <= 1")
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelSection(Section):
    name_or_path: str = Field(
        "assets/tiny-add", description="Local model directory or hub id (org/name).",
        json_schema_extra=_ui("Model (path or hub id)", "模型（路径或 Hub ID）",
                              "本地模型目录或 Hub ID（组织/名称）。"))
    finetune: Literal["full", "lora"] = Field(
        "full", description="Train all weights, or a LoRA adapter (peft).",
        json_schema_extra=_ui("Fine-tuning", "微调方式", "训练全部权重，或训练 LoRA 适配器（peft）。"))
    lora_rank: int = Field(16, ge=1, le=1024, description="LoRA rank r.",
                           json_schema_extra=_ui("LoRA rank", "LoRA 秩", "LoRA 的秩 r。"))
    lora_alpha: int = Field(32, ge=1, le=4096, description="LoRA alpha (scale = alpha / r).",
                            json_schema_extra=_ui("LoRA alpha", "LoRA alpha", "LoRA alpha（缩放 = alpha / r）。"))
    lora_dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA branch.",
        json_schema_extra=_ui("LoRA dropout", "LoRA dropout", "LoRA 分支上的 dropout。", advanced=True))
    lora_targets: list[str] = Field(
        ["all-linear"], description="Module names LoRA wraps; 'all-linear' = every linear layer but the head.",
        json_schema_extra=_ui("LoRA target modules", "LoRA 目标模块",
                              "LoRA 包装的模块名；'all-linear' = 除输出头外的所有线性层。"))
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="Weights and compute dtype. bfloat16 with full fine-tuning keeps fp32 master weights "
                               "under bf16 autocast: fast on GPUs, and on CPUs with AVX512-BF16 or AMX at large "
                               "batches (small ones: float32 is faster).",
        json_schema_extra=_ui("dtype", "数据类型",
                              "权重与计算的精度。全参数微调时 bfloat16 保留 fp32 主权重、在 bf16 autocast 下计算："
                              "在 GPU 上快，在支持 AVX512-BF16 或 AMX 的 CPU 上大批次时也快"
                              "（小批次时 float32 更快）。"))
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory.",
        json_schema_extra=_ui("Gradient checkpointing", "梯度检查点",
                              "反向传播时重新计算激活以节省显存。", advanced=True))
    trust_remote_code: bool = Field(
        False, description="Allow model code from the model directory.",
        json_schema_extra=_ui("Trust remote code", "信任远程代码", "允许运行模型目录中的代码。", advanced=True))


class DataSection(Section):
    sources: list[str] = Field(
        ["assets/data/add_train.jsonl"], description="Training data: JSONL, JSON, CSV or Parquet files, saved "
                                                     "datasets directories or hub dataset ids (a subset as "
                                                     "'org/name:subset'), each optionally with a sample count "
                                                     "('train.jsonl#1800'); mixed by the seed.",
        json_schema_extra=_ui("Training data", "训练数据",
                              "训练数据：JSONL、JSON、CSV 或 Parquet 文件，已保存的 datasets 目录或 Hub 数据集 ID"
                              "（子集写作 'org/name:subset'），可带样本数（'train.jsonl#1800'）；按随机种子混合。"))
    prompt_column: str = Field("prompt", description="Column with the prompt: a string or a list of chat messages.",
                               json_schema_extra=_ui("Prompt column", "提示列", "提示所在的列：字符串或对话消息列表。"))
    solution_column: str = Field(
        "solution", description="Column with the reference answer, passed to rewards as 'solution'.",
        json_schema_extra=_ui("Solution column", "答案列", "参考答案所在的列，以 'solution' 传给奖励函数。"))
    images_column: str = Field(
        "", description="Column with image paths for multimodal models ('' = none).",
        json_schema_extra=_ui("Images column", "图片列", "多模态模型的图片路径列（'' = 无）。", advanced=True))
    videos_column: str = Field(
        "", description="Column with videos for vision-language models: an animated GIF/WebP, or a list of frame "
                        "images ('' = none).",
        json_schema_extra=_ui("Videos column", "视频列",
                              "视觉语言模型的视频列：动图 GIF/WebP，或帧图片列表（'' = 无）。", advanced=True))
    max_video_frames: int = Field(
        64, ge=0, le=4096, description="Frames per video at most: longer videos keep this many, evenly spaced from "
                                       "the first to the last (0 = every frame).",
        json_schema_extra=_ui("Max video frames", "视频最多帧数",
                              "每个视频最多取这么多帧：更长的视频从首帧到末帧均匀抽取（0 = 全部帧）。", advanced=True))
    audios_column: str = Field(
        "", description="Column with WAV audio for models whose processor takes audio ('' = none).",
        json_schema_extra=_ui("Audios column", "音频列",
                              "处理器能接收音频的模型的 WAV 音频列（'' = 无）。", advanced=True))
    prompt_template: str = Field(
        "", description="Build the prompt from columns, e.g. 'Make {target} from {nums}.' ('' = use prompt_column).",
        json_schema_extra=_ui("Prompt template", "提示模板",
                              "用列拼出提示，例如 'Make {target} from {nums}.'（'' = 使用提示列）。"))
    system_prompt: str = Field(
        "", description="System message prepended to every prompt ('' = none).",
        json_schema_extra=_ui("System prompt", "系统提示", "加在每个提示前的系统消息（'' = 无）。"))
    chat_template: Literal["auto", "on", "off"] = Field(
        "auto", description="Apply the tokenizer's chat template: auto = when the tokenizer has one.",
        json_schema_extra=_ui("Chat template", "对话模板", "是否应用分词器的对话模板：auto = 分词器有模板时应用。"))
    chat_template_kwargs: dict[str, str | int | float | bool | None] = Field(
        {}, description="Extra arguments to the chat template, e.g. {\"enable_thinking\": false} for Qwen3 "
                        "(TRL's chat_template_kwargs, ms-swift's --enable_thinking).",
        json_schema_extra=_ui("Chat template arguments", "对话模板参数",
                              "传给对话模板的额外参数，例如 Qwen3 的 {\"enable_thinking\": false}"
                              "（即 TRL 的 chat_template_kwargs、ms-swift 的 --enable_thinking）。", advanced=True))
    max_prompt_tokens: int = Field(
        8192, ge=16, le=262_144, description="Longest prompt in tokens (as the model sees it, chat template "
                                             "applied); what happens to a longer one is data.prompt_truncation.",
        json_schema_extra=_ui("Max prompt tokens", "提示最多词元数",
                              "提示的最大词元数（按模型所见、套用对话模板后计）；更长的提示如何处理见“超长提示”。",
                              advanced=True))
    prompt_truncation: Literal["refuse", "left", "delete"] = Field(
        "refuse", description="A prompt longer than max_prompt_tokens: refuse = the run is refused before launch "
                              "(local sources); left = keep its last max_prompt_tokens tokens (TRL's "
                              "max_prompt_length); delete = drop the row when the data loads (ms-swift's "
                              "truncation_strategy delete).",
        json_schema_extra=_ui("Long prompts", "超长提示",
                              "长于“提示最多词元数”的提示：refuse = 启动前拒绝该运行（本地数据）；left = 只保留最后 "
                              "max_prompt_tokens 个词元（即 TRL 的 max_prompt_length）；delete = 加载数据时删去该行"
                              "（即 ms-swift 的 truncation_strategy delete）。", advanced=True))
    limit: int = Field(0, ge=0, description="Use at most this many training rows after mixing (0 = all).",
                       json_schema_extra=_ui("Row limit", "行数上限", "混合后最多使用这么多训练行（0 = 全部）。"))
    eval_sources: list[str] = Field(
        [], description="Held-out data for evaluation, same format as sources.",
        json_schema_extra=_ui("Evaluation data", "评估数据", "用于评估的留出数据，格式同训练数据。", advanced=True))

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_arguments(cls, v: dict[str, Any]) -> dict[str, Any]:
        # the renderer sets these itself: given here they would clash with its call or change what it returns
        taken = sorted(set(v) & CHAT_TEMPLATE_OWN_ARGS)
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by the studio when it renders a prompt, not a template "
                             f"argument")
        return v


class RewardFunction(Section):
    name: str = Field(description="Built-in reward name or a function from a plugin file.")
    weight: float = Field(1.0, ge=-100.0, le=100.0, description="Weight in the summed reward.")
    params: dict[str, Any] = Field({}, description="Parameters of this reward function.")


class RewardsSection(Section):
    functions: list[RewardFunction] = Field(
        [RewardFunction(name="exact_match"), RewardFunction(name="digit_match")],
        description="Reward functions, weighted and summed.",
        json_schema_extra=_ui("Reward functions", "奖励函数", "奖励函数，按权重加总。"))
    plugins: list[str] = Field(
        [], description="Python files whose reward functions may be named above.",
        json_schema_extra=_ui("Plugin files", "插件文件", "其中的奖励函数可在上表按名称使用的 Python 文件。"))
    on_error: Literal["fail", "skip"] = Field(
        "fail", description="When a reward function raises or times out: fail the run, or score the batch None.",
        json_schema_extra=_ui("On reward error", "奖励出错时",
                              "奖励函数报错或超时时：让训练失败，或将该批次记为 None。", advanced=True))
    timeout_s: float = Field(
        120.0, gt=0, le=3600, description="Per-batch timeout of a reward function (seconds).",
        json_schema_extra=_ui("Reward timeout (s)", "奖励超时（秒）",
                              "单个奖励函数每批次的超时时间（秒）。", advanced=True))


class ToolsSection(Section):
    """Agentic rollouts (docs/agent.md): tools or an environment answer the model between its turns."""

    functions: list[str] = Field(
        [], description="Tools the model may call: built-ins (python: run code in the sandbox) or functions "
                        "defined in the tool files. Empty, with no environment, is a single-turn run.",
        json_schema_extra=_ui("Tools", "工具",
                              "模型可以调用的工具：内置工具（python：在沙箱中运行代码）或工具文件中定义的函数。"
                              "为空且没有环境时为单轮训练。"))
    files: list[str] = Field(
        [], description="Python files defining the tools (functions with type hints and a docstring) or the "
                        "environment class.",
        json_schema_extra=_ui("Tool files", "工具文件",
                              "定义工具（带类型注解和文档字符串的函数）或环境类的 Python 文件。"))
    environment: str = Field(
        "", description="Name of an environment class in the tool files (reset(row), step(message)); empty = "
                        "the tools above answer the model's tool calls.",
        json_schema_extra=_ui("Environment class", "环境类",
                              "工具文件中环境类的名称（reset(row)、step(message)）；为空时由上面的工具响应模型的工具调用。"))
    parser: Literal["auto", "hermes", "llama3"] = Field(
        "auto", description="Tool-call format: auto (from the model's chat template), hermes "
                            "(<tool_call>{json}</tool_call>, Qwen), llama3 (a bare JSON object).",
        json_schema_extra=_ui("Tool-call format", "工具调用格式",
                              "工具调用格式：auto（根据模型的对话模板）、hermes（<tool_call>{json}</tool_call>，Qwen）、"
                              "llama3（单独的 JSON 对象）。", advanced=True))
    timeout_s: float = Field(
        10.0, gt=0, le=3600, description="Timeout of one tool call or environment step (seconds); a call that "
                                         "passes it is a tool error returned to the model.",
        json_schema_extra=_ui("Tool timeout (s)", "工具超时（秒）",
                              "单次工具调用或环境步骤的超时时间（秒）；超时的调用作为工具错误返回给模型。", advanced=True))
    max_result_chars: int = Field(
        2000, ge=16, le=1_000_000, description="A tool result or observation longer than this is cut (and says so).",
        json_schema_extra=_ui("Max tool result chars", "工具结果最大字符数",
                              "超过此长度的工具结果或观察会被截断（并注明）。", advanced=True))

    @property
    def enabled(self) -> bool:
        """Rollouts are episodes (tools or an environment answer the model)."""
        return bool(self.functions or self.environment)


class RolloutSection(Section):
    engine: Literal["hf", "vllm", "lmdeploy"] = Field(
        "hf", description="Sampling engine: hf (transformers, CPU or GPU), vllm, lmdeploy (GPU).",
        json_schema_extra=_ui("Engine", "推理引擎",
                              "采样引擎：hf（transformers，CPU 或 GPU）、vllm、lmdeploy（GPU）。"))
    placement: Literal["colocate", "separate"] = Field(
        "colocate", description="colocate: engine shares the training devices (sleeps during training); "
                                "separate: engine runs in its own rollout worker process(es), on its own rollout GPUs "
                                "(on CPU: its own process and cores).",
        json_schema_extra=_ui("Placement", "部署方式",
                              "colocate：引擎与训练共用设备（训练时休眠）；separate：引擎运行在独立的采样进程中，"
                              "使用独立的采样 GPU（CPU 上：独立的进程和核心）。"))
    num_generations: int = Field(
        8, ge=2, le=1024, description="Completions per prompt (the group size G).",
        json_schema_extra=_ui("Generations per prompt (G)", "每个提示的生成数（G）",
                              "每个提示生成的回答数（组大小 G）。"))
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Sampling temperature.",
                               json_schema_extra=_ui("Temperature", "温度", "采样温度。"))
    top_p: float = Field(
        1.0, gt=0.0, le=1.0, description="Nucleus sampling: keep the smallest set of tokens with this mass.",
        json_schema_extra=_ui("top_p", "top_p", "核采样：保留累计概率达到该值的最小 token 集合。"))
    top_k: int = Field(0, ge=0, le=100000, description="Keep the k most likely tokens (0 = off).",
                       json_schema_extra=_ui("top_k", "top_k", "只保留概率最高的 k 个 token（0 = 关闭）。"))
    max_completion_length: int = Field(
        8, ge=1, le=131072, description="Maximum new tokens per completion.",
        json_schema_extra=_ui("Max completion tokens", "最大生成长度", "每个回答最多生成的 token 数。"))
    max_turns: int = Field(
        5, ge=1, le=100, description="Most assistant turns in an episode, with tools or an environment (TRL's "
                                     "max_tool_calling_iterations + 1); single-turn runs have one.",
        json_schema_extra=_ui("Max turns", "最大轮数",
                              "使用工具或环境时，每个回合中助手最多的轮数（TRL 的 max_tool_calling_iterations + 1）；"
                              "单轮训练只有一轮。"))
    async_generation: bool = Field(
        False, description="Sample the next batches with the newest weights the engine has while training on this one "
                           "(off-policy by at most max_staleness updates).",
        json_schema_extra=_ui("Async generation", "异步生成",
                              "训练本批时用引擎已有的最新权重提前采样后续批次（最多偏离策略 max_staleness 次更新）。"))
    max_staleness: int = Field(
        1, ge=1, le=16, description="Async: most policy updates between sampling a batch and "
                                    "training on it (1 = one step off-policy).",
        json_schema_extra=_ui("Max staleness", "最大陈旧度",
                              "异步时，采样一批到用它训练之间最多相隔的策略更新次数"
                              "（1 = 偏离策略一步）。", advanced=True))
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="Fraction of GPU memory the engine may take.",
        json_schema_extra=_ui("GPU memory fraction", "显存占用比例", "引擎可占用的显存比例。", advanced=True))
    max_model_len: int = Field(
        0, ge=0, le=1_048_576, description="The engine's context in tokens, prompt and completion together "
                                           "(vLLM's max_model_len, LMDeploy's session_len; 0 = the model's own): "
                                           "a smaller one leaves more memory to the KV cache.",
        json_schema_extra=_ui("Engine context length", "引擎上下文长度",
                              "引擎的上下文词元数，提示与生成合计（vLLM 的 max_model_len、LMDeploy 的 session_len；"
                              "0 = 模型自身的）：设小一些可把更多显存留给 KV 缓存。", advanced=True))
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="GPUs per engine instance (tensor parallel).",
        json_schema_extra=_ui("Tensor parallel size", "张量并行数",
                              "每个引擎实例使用的 GPU 数（张量并行）。", advanced=True))
    data_parallel_size: int = Field(
        1, ge=1, le=64, description="Engine instances sampling in parallel.",
        json_schema_extra=_ui("Engine instances (DP)", "引擎实例数（数据并行）",
                              "并行采样的引擎实例数。", advanced=True))
    sleep: bool = Field(
        True, description="Colocated engines release memory while the trainer updates.",
        json_schema_extra=_ui("Sleep while training", "训练时休眠",
                              "共置的引擎在训练更新期间释放显存。", advanced=True))
    lmdeploy_backend: Literal["pytorch", "turbomind"] = Field(
        "pytorch", description="LMDeploy engine backend.",
        json_schema_extra=_ui("LMDeploy backend", "LMDeploy 后端", "LMDeploy 引擎后端。", advanced=True))
    worker_urls: list[str] = Field(
        [], description="host:port of rollout workers started by hand "
                        "(python -m backend.rollout.worker); empty = the trainer starts them. "
                        "The key comes from GRPO_WORKER_AUTHKEY.",
        json_schema_extra=_ui("Worker URLs", "采样进程地址",
                              "手动启动的采样进程的 host:port（python -m backend.rollout.worker）；空 = 由训练器启动。"
                              "密钥取自 GRPO_WORKER_AUTHKEY。", advanced=True))
    worker_python: str = Field(
        "", description="Python interpreter for rollout workers, e.g. the LMDeploy or vLLM "
                        "environment's bin/python (empty = the trainer's).",
        json_schema_extra=_ui("Worker Python", "采样进程 Python",
                              "采样进程使用的 Python 解释器，例如 LMDeploy 或 vLLM 环境的 "
                              "bin/python（空 = 与训练器相同）。", advanced=True))
    worker_threads: int = Field(
        1, ge=1, le=1024, description="torch threads per rollout worker on CPU.",
        json_schema_extra=_ui("Worker threads", "采样进程线程数", "CPU 上每个采样进程的 torch 线程数。", advanced=True))
    worker_timeout_s: float = Field(
        900.0, ge=10.0, le=86400.0, description="A rollout worker that takes longer than "
                                                "this for one request counts as hung: the run fails naming it.",
        json_schema_extra=_ui("Worker timeout (s)", "采样进程超时（秒）",
                              "采样进程单次请求超过此时间即视为卡死：运行失败并给出该进程的名字。", advanced=True))
    weight_sync: Literal["auto", "file", "collective"] = Field(
        "auto", description="How new weights reach rollout workers after each update. file: one shared-memory "
                            "file that local workers keep mapped and copy from (inline bytes to a worker reached by "
                            "URL); collective: a process group of the trainer and the workers (NCCL on GPUs, gloo on "
                            "CPU) broadcasting buckets; auto: collective when trainer and workers are on GPUs, file on "
                            "CPU. In-process engines take the weights directly.",
        json_schema_extra=_ui("Weight sync", "权重同步方式",
                              "每次更新后新权重如何送到采样进程。file：本地采样进程保持映射并从中复制的一个共享内存文件"
                              "（对按地址连接的进程则随请求发送字节）；collective：训练器与采样进程组成进程组"
                              "（GPU 上 NCCL，CPU 上 gloo）分桶广播；auto：训练和采样都在 GPU 上时用 collective，"
                              "CPU 上用 file。训练进程内的引擎直接取权重。", advanced=True))
    weight_sync_bucket_mb: int = Field(
        256, ge=1, le=16384, description="Collective weight sync: bucket size in MB "
                                         "(one broadcast each; bigger = fewer calls, more memory).",
        json_schema_extra=_ui("Weight sync bucket (MB)", "权重同步分桶（MB）",
                              "collective 权重同步的分桶大小（MB），每桶一次广播；越大调用越少、"
                              "占用内存越多。", advanced=True))
    # Names as TRL's GRPOConfig (its clip_max replaced the deprecated _cap); off by default because the default
    # engines compute sampling logprobs with the trainer's own weights and code.
    vllm_importance_sampling_correction: bool = Field(
        False, description="Truncated importance sampling: weight the loss by pi_trainer / pi_sampler to correct for "
                           "engine/trainer mismatch and async staleness (any engine, despite the TRL name).",
        json_schema_extra=_ui("Importance sampling correction", "重要性采样校正",
                              "截断重要性采样：按 训练策略/采样策略 的概率比加权损失，"
                              "校正引擎与训练器的差异和异步陈旧度（TRL 的名字，适用于所有引擎）。", advanced=True))
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field(
        "sequence_mask",
        description="Per token or per sequence ratio; truncate = clip at the cap, mask = zero above it.",
        json_schema_extra=_ui("Importance sampling mode", "重要性采样方式",
                              "按 token 或按序列计算比值；truncate = 在上限处截断，"
                              "mask = 超过上限置零。", advanced=True))
    vllm_importance_sampling_clip_max: float = Field(
        3.0, gt=1.0, le=1000.0, description="Importance sampling cap C.",
        json_schema_extra=_ui("Importance sampling cap", "重要性采样上限", "重要性采样比值的上限 C。", advanced=True))
    steps_per_generation: int = Field(
        1, ge=1, le=1024, description="Optimizer steps one rollout serves (TRL's steps_per_generation, counted here in "
                                      "optimizer steps, not micro-batches): the engine samples prompts_per_step x this "
                                      "many prompts at once, advantages are taken over them all, and each of the next "
                                      "steps trains on the next slice of prompts_per_step prompts (num_iterations > 1 "
                                      "passes over the slices again). 1 = a rollout per step.",
        json_schema_extra=_ui("Steps per generation", "每次生成的训练步数",
                              "一次采样供给的优化步数（TRL 的 steps_per_generation，这里按优化步计，而非微批次）："
                              "引擎一次为 prompts_per_step × 该值 个提示采样，优势在全部样本上计算，随后每步训练下一片 "
                              "prompts_per_step 个提示（num_iterations > 1 时再依次遍历各片）。1 = 每步采样一次。",
                              advanced=True))

    @property
    def engine_context(self) -> int:
        """The context max_model_len gives the engine, 0 where it is the model's own (engine hf has no cache to
        size and ignores it)."""
        return self.max_model_len if self.engine != "hf" else 0


class ResourcesSection(Section):
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Training device; auto = cuda if present, else cpu.",
        json_schema_extra=_ui("Device", "设备", "训练设备；auto = 有 CUDA 就用 GPU，否则用 CPU。"))
    train_gpus: list[int] = Field(
        [], description="GPU indices for training, one rank each (empty = one GPU, or cpu).",
        json_schema_extra=_ui("Training GPUs", "训练 GPU",
                              "用于训练的 GPU 编号，每个一个进程（空 = 一个 GPU，或 CPU）。"))
    rollout_gpus: list[int] = Field(
        [], description="GPU indices for the rollout engines when placement is separate.",
        json_schema_extra=_ui("Rollout GPUs", "采样 GPU", "placement 为 separate 时采样引擎使用的 GPU 编号。"))
    nproc_per_node: int = Field(
        0, ge=0, le=1024, description="Training ranks on each node (0 = one per train_gpus entry, at least 1). On "
                                      "cpu, >1 runs data-parallel ranks with the gloo backend.",
        json_schema_extra=_ui("Ranks per node", "每节点进程数",
                              "每个节点上的训练进程（rank）数（0 = 每个训练 GPU 一个，至少 1）。"
                              "CPU 上 >1 时用 gloo 后端数据并行。", advanced=True))
    nnodes: int = Field(
        1, ge=1, le=4096, description="Nodes that run training ranks (torchrun --nnodes).",
        json_schema_extra=_ui("Nodes", "节点数", "运行训练进程的节点数（torchrun --nnodes）。", advanced=True))
    node_rank: int = Field(
        0, ge=0, le=4095, description="This node's index among nnodes (0 writes the run directory).",
        json_schema_extra=_ui("Node rank", "节点序号",
                              "本节点在所有节点中的序号（0 号节点写运行目录）。", advanced=True))
    master_addr: str = Field(
        "127.0.0.1", description="Address of node 0, where the ranks meet (torchrun --master_addr).",
        json_schema_extra=_ui("Master address", "主节点地址",
                              "0 号节点的地址，各进程在此会合（torchrun --master_addr）。", advanced=True))
    master_port: int = Field(
        0, ge=0, le=65535, description="Port of node 0 for the ranks to meet (0 = a free port; "
                                       "set one for several nodes).",
        json_schema_extra=_ui("Master port", "主节点端口",
                              "0 号节点上用于会合的端口（0 = 自动选空闲端口；多节点时请指定）。", advanced=True))
    deepspeed_stage: int = Field(
        0, ge=0, le=3, description="DeepSpeed ZeRO stage: 0 = plain PyTorch (torch.distributed), 1/2 = shard "
                                   "optimizer states (and gradients), 3 = shard parameters too.",
        json_schema_extra=_ui("DeepSpeed ZeRO stage", "DeepSpeed ZeRO 阶段",
                              "DeepSpeed ZeRO 阶段：0 = 纯 PyTorch（torch.distributed），1/2 = 切分优化器状态"
                              "（和梯度），3 = 参数也切分。", advanced=True))
    offload: bool = Field(
        False, description="Offload optimizer states to CPU memory (DeepSpeed, stage >= 1).",
        json_schema_extra=_ui("Offload optimizer", "优化器卸载",
                              "将优化器状态卸载到 CPU 内存（DeepSpeed，阶段 >= 1）。", advanced=True))
    offload_params: bool = Field(
        False, description="Offload parameters to CPU memory (DeepSpeed ZeRO-3).",
        json_schema_extra=_ui("Offload parameters", "参数卸载",
                              "将参数卸载到 CPU 内存（DeepSpeed ZeRO-3）。", advanced=True))
    deepspeed_config: str = Field(
        "", description="A DeepSpeed JSON file merged over the generated config (keys it sets win; batch sizes stay "
                        "the trainer's).",
        json_schema_extra=_ui("DeepSpeed config override", "DeepSpeed 配置覆盖",
                              "合并到自动生成配置之上的 DeepSpeed JSON 文件（其中的键优先；"
                              "批大小仍由训练器决定）。", advanced=True))
    num_threads: int = Field(
        0, ge=0, le=1024, description="CPU threads for torch (0 = torch's default).",
        json_schema_extra=_ui("CPU threads", "CPU 线程数",
                              "torch 使用的 CPU 线程数（0 = torch 默认）。", advanced=True))

    @property
    def ranks_per_node(self) -> int:
        return self.nproc_per_node or max(1, len(self.train_gpus))

    @property
    def world_size(self) -> int:
        """Training ranks in all: nnodes x ranks per node."""
        return self.nnodes * self.ranks_per_node


class AlgorithmSection(Section):
    loss_type: LossType = Field(
        "grpo", description="Objective and its aggregation: grpo = mean per sequence then over sequences; bnpo = mean "
                            "over the micro-batch's tokens; dr_grpo = token sum / (sequences x max_completion_length); "
                            "dapo = token mean over the whole accumulated batch; cispo = clipped, detached IS weight x "
                            "advantage x logprob, token mean over the batch (MiniMax-M1; the cap is epsilon_high); "
                            "sapo = soft sigmoid gate instead of the hard clip (SAPO); luspo = mean over sequences of "
                            "each sequence's token sum, with importance_sampling_level sequence (LUSPO); vespo = "
                            "detached Gamma weight of the sequence's importance ratio x advantage x logprob, token "
                            "mean over the batch (VESPO).",
        json_schema_extra=_ui("Loss type", "损失类型",
                              "目标与聚合方式：grpo = 先按序列平均再跨序列平均；bnpo = 对微批次全部 token 平均；"
                              "dr_grpo = token 求和 / (序列数 × 最大生成长度)；dapo = 对整个累积批次的 token 平均；"
                              "cispo = 截断并停止梯度的重要性权重 × 优势 × 对数概率，按批次 token 平均（MiniMax-M1，"
                              "上限为 epsilon_high）；sapo = 用平滑的 sigmoid 门控代替硬裁剪（SAPO）；"
                              "luspo = 每个序列 token 求和后跨序列平均，配合序列级重要性采样（LUSPO）；"
                              "vespo = 序列重要性比率的 Gamma 权重（停止梯度）× 优势 × 对数概率，"
                              "按批次 token 平均（VESPO）。"))
    beta: float = Field(
        0.0, ge=0.0, le=100.0, description="KL coefficient to the reference model (0 = no reference loaded).",
        json_schema_extra=_ui("KL coefficient (beta)", "KL 系数（beta）",
                              "相对参考模型的 KL 系数（0 = 不加载参考模型）。"))
    use_bias_correction_kl: bool = Field(
        True, description="Multiply the k3 KL term by the importance ratio, the unbiased reverse-KL gradient "
                          "(DeepSeek-V3.2); only matters with beta > 0.",
        json_schema_extra=_ui("Bias-corrected KL", "KL 偏差校正",
                              "将 k3 KL 项乘以重要性比率，得到无偏的反向 KL 梯度（DeepSeek-V3.2）；"
                              "仅在 beta > 0 时有效。", advanced=True))
    # reference-model sync (TR-DPO; TRL's sync_ref_model): backend/train/ref_sync.py
    sync_ref_model: bool = Field(
        False, description="Move the KL reference toward the policy every ref_model_sync_steps optimizer steps: "
                           "ref = alpha x policy + (1 - alpha) x ref (TR-DPO, TRL's sync_ref_model). Needs beta > 0 "
                           "and full fine-tuning; the synced reference is kept in checkpoints.",
        json_schema_extra=_ui("Sync reference model", "同步参考模型",
                              "每 ref_model_sync_steps 个优化步把 KL 参考模型向策略移动："
                              "ref = alpha × 策略 + (1 - alpha) × ref（TR-DPO，TRL 的 sync_ref_model）。"
                              "需要 beta > 0 且全参数微调；同步后的参考模型保存在检查点中。", advanced=True))
    ref_model_mixup_alpha: float = Field(
        0.6, ge=0.0, le=1.0, description="Reference sync: the policy's share alpha in the mix (1 = copy the policy).",
        json_schema_extra=_ui("Reference mix alpha", "参考模型混合系数",
                              "参考模型同步时策略所占的比例 alpha（1 = 直接复制策略）。", advanced=True))
    ref_model_sync_steps: int = Field(
        512, ge=1, le=10_000_000, description="Reference sync: optimizer steps between syncs (TR-DPO's tau).",
        json_schema_extra=_ui("Reference sync every N steps", "参考模型同步间隔",
                              "参考模型同步：两次同步之间的优化步数（TR-DPO 的 tau）。", advanced=True))
    epsilon: float = Field(0.2, gt=0.0, lt=1.0, description="Lower clip range of the ratio: 1 - epsilon.",
                           json_schema_extra=_ui("Clip epsilon", "裁剪 epsilon", "比率的下裁剪范围：1 - epsilon。"))
    epsilon_high: float = Field(
        0.0, ge=0.0, le=10.0, description="Upper clip range: 1 + epsilon_high (0 = same as epsilon; DAPO uses 0.28). "
                                          "With loss_type cispo it is the cap of the IS weight itself (ScaleRL: 5.0).",
        json_schema_extra=_ui("Clip epsilon high", "上裁剪 epsilon_high",
                              "上裁剪范围：1 + epsilon_high（0 = 与 epsilon 相同；DAPO 用 0.28）。"
                              "loss_type 为 cispo 时它就是重要性权重的上限本身（ScaleRL：5.0）。"))
    delta: float = Field(
        0.0, ge=0.0, le=100.0, description="Two-sided clipping (INTELLECT-2): cap the unclipped ratio term at delta, "
                                           "so a negative advantage cannot push a huge ratio further; "
                                           "> 1 + epsilon_high, e.g. 4 (0 = off).",
        json_schema_extra=_ui("Two-sided clip (delta)", "双侧裁剪（delta）",
                              "双侧裁剪（INTELLECT-2）：把未裁剪的比率项限制在 delta 以内，须大于 1 + epsilon_high，"
                              "例如 4（0 = 关闭）。", advanced=True))
    sapo_temperature_pos: float = Field(
        1.0, gt=0.0, le=100.0, description="SAPO gate temperature for tokens with positive advantage.",
        json_schema_extra=_ui("SAPO temperature (A > 0)", "SAPO 温度（正优势）",
                              "正优势 token 的 SAPO 门控温度。", advanced=True))
    sapo_temperature_neg: float = Field(
        1.05, gt=0.0, le=100.0, description="SAPO gate temperature for tokens with non-positive advantage "
                                            "(the paper: a little above the positive one).",
        json_schema_extra=_ui("SAPO temperature (A <= 0)", "SAPO 温度（非正优势）",
                              "非正优势 token 的 SAPO 门控温度（论文建议略高于正优势温度）。", advanced=True))
    # VESPO (TRL's names and defaults): phi(w) = exp(lambda) w^k exp(-lambda w) of the sequence's importance ratio w
    vespo_k_pos: float = Field(
        2.0, ge=0.0, le=100.0, description="VESPO power k for A >= 0: how strongly sequences whose importance ratio "
                                           "is below 1 are down-weighted.",
        json_schema_extra=_ui("VESPO k (A >= 0)", "VESPO k（非负优势）",
                              "VESPO 中优势 A >= 0 时的幂指数 k：重要性比率小于 1 的序列被降权的程度。", advanced=True))
    vespo_lambda_pos: float = Field(
        3.0, ge=0.0, le=100.0, description="VESPO decay lambda for A >= 0: how strongly sequences whose importance "
                                           "ratio is above 1 are down-weighted.",
        json_schema_extra=_ui("VESPO lambda (A >= 0)", "VESPO lambda（非负优势）",
                              "VESPO 中优势 A >= 0 时的衰减系数 lambda：重要性比率大于 1 的序列被降权的程度。", advanced=True))
    vespo_k_neg: float = Field(
        3.0, ge=0.0, le=100.0, description="VESPO power k for A < 0 (ratio below 1).",
        json_schema_extra=_ui("VESPO k (A < 0)", "VESPO k（负优势）",
                              "VESPO 中优势 A < 0 时的幂指数 k（比率小于 1 时）。", advanced=True))
    vespo_lambda_neg: float = Field(
        2.0, ge=0.0, le=100.0, description="VESPO decay lambda for A < 0 (ratio above 1).",
        json_schema_extra=_ui("VESPO lambda (A < 0)", "VESPO lambda（负优势）",
                              "VESPO 中优势 A < 0 时的衰减系数 lambda（比率大于 1 时）。", advanced=True))
    num_iterations: int = Field(
        1, ge=1, le=64, description="Optimizer steps per rollout batch (the paper's mu).",
        json_schema_extra=_ui("Updates per batch (mu)", "每批更新次数（mu）",
                              "每个采样批次做的优化步数（论文中的 mu）。"))
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Divide advantages by the group's reward std, the batch's, or not at all (Dr. GRPO).",
        json_schema_extra=_ui("Scale rewards", "奖励缩放",
                              "用组内、批内奖励标准差归一化优势，或不归一化（Dr. GRPO）。"))
    advantage_estimator: Literal["grpo", "rloo", "reinforce_plus_plus"] = Field(
        "grpo", description="Baseline of the advantage (ms-swift's names): grpo = reward - group mean; rloo = reward - "
                            "mean of the group's other completions (leave-one-out); reinforce_plus_plus = reward - "
                            "group mean, whose std scale_rewards divides by (batch: the batch's, REINFORCE++).",
        json_schema_extra=_ui("Advantage estimator", "优势估计",
                              "优势的基线（ms-swift 的名称）：grpo = 奖励 - 组均值；rloo = 奖励 - 组内其他回答的均值"
                              "（留一法）；reinforce_plus_plus = 奖励 - 组均值，再按 scale_rewards 除以其标准差"
                              "（batch：全批次的，REINFORCE++）。", advanced=True))
    multi_objective_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = Field(
        "sum_then_normalize", description="Several reward functions: sum the weighted rewards, then form advantages "
                                          "(scale_rewards); or normalise each function's rewards within the group "
                                          "first, sum them by weight, and normalise the sum over the batch (GDPO).",
        json_schema_extra=_ui("Multi-reward aggregation", "多奖励聚合",
                              "多个奖励函数时：先按权重求和再计算优势（scale_rewards）；或先在组内分别归一化"
                              "每个函数的奖励，按权重求和后再在全批次归一化（GDPO）。", advanced=True))
    kl_in_reward: bool = Field(
        False, description="Put the KL to the reference in the reward instead of the loss (ms-swift's kl_in_reward; "
                           "its default for rloo and reinforce_plus_plus): each completion's reward gets -beta x the "
                           "sum over its tokens of log pi_old - log pi_ref before the baseline, and the loss has no "
                           "KL term. Needs beta > 0.",
        json_schema_extra=_ui("KL in reward", "KL 并入奖励",
                              "把相对参考模型的 KL 放进奖励而不是损失（ms-swift 的 kl_in_reward；rloo 与 "
                              "reinforce_plus_plus 的默认做法）：在计算基线之前，每个回答的奖励减去 beta × 其各 token "
                              "的 log pi_old - log pi_ref 之和，损失中不再有 KL 项。需要 beta > 0。", advanced=True))
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="Ratio per token (GRPO) or one per sequence, the mean log-ratio (GSPO).",
        json_schema_extra=_ui("Importance sampling level", "重要性采样粒度",
                              "按 token 计算比率（GRPO），或每个序列一个比率，即平均对数比（GSPO）。"))
    mask_truncated_completions: bool = Field(
        False, description="Exclude completions that hit max length from the loss.",
        json_schema_extra=_ui("Mask truncated completions", "屏蔽被截断的回答", "将达到最大长度的回答排除在损失之外。"))
    off_policy_mask_threshold: float = Field(
        0.0, ge=0.0, le=100.0, description="Off-policy sequence mask (DeepSeek-V3.2): leave out negative-advantage "
                                           "completions whose mean per-token log pi_sampling - log pi_theta exceeds "
                                           "this, against the engine's sampling logprobs where it gives them (else "
                                           "the old policy's), e.g. 0.5 (0 = off).",
        json_schema_extra=_ui("Off-policy mask threshold", "离策略序列屏蔽阈值",
                              "离策略序列屏蔽（DeepSeek-V3.2）：优势为负且与采样策略的平均逐 "
                              "token log 概率差超过该值的回答不参与损失；有引擎采样对数概率时用之，"
                              "例如 0.5（0 = 关闭）。", advanced=True))
    top_entropy_quantile: float = Field(
        1.0, ge=0.0, le=1.0, description="Train only on this top fraction of tokens by entropy, the 'forking' tokens "
                                         "(Beyond the 80/20 rule: 0.2; 1 = all tokens).",
        json_schema_extra=_ui("Top-entropy token fraction", "高熵 token 比例",
                              "只在熵最高的这部分 token（分叉 token）上训练（80/20 规则：0.2；"
                              "1 = 全部 token）。", advanced=True))
    entropy_coef: float = Field(
        0.0, ge=0.0, le=10.0, description="Entropy bonus: subtract coef x mean token entropy from the loss, the same "
                                          "for every loss type (0 = off; the start value when adaptive).",
        json_schema_extra=_ui("Entropy bonus", "熵奖励系数",
                              "熵奖励：从损失中减去 系数 × 平均 token 熵，对所有损失类型含义相同（0 = 关闭；"
                              "自适应时为初始值）。", advanced=True))
    use_adaptive_entropy: bool = Field(
        False, description="Adaptive entropy control (Skywork-OR1): apply the bonus only while entropy is at or "
                           "below entropy_target; raise the coefficient by entropy_coef_delta each step it is, "
                           "lower it otherwise.",
        json_schema_extra=_ui("Adaptive entropy control", "自适应熵控制",
                              "自适应熵控制（Skywork-OR1）：仅当熵不高于 entropy_target 时施加熵奖励；"
                              "每步熵不高于目标则系数加 entropy_coef_delta，否则减小。", advanced=True))
    entropy_target: float = Field(
        0.2, ge=0.0, le=100.0, description="Target mean token entropy (nats) of adaptive entropy control; set it "
                                           "near the entropy logged early in training.",
        json_schema_extra=_ui("Entropy target", "目标熵",
                              "自适应熵控制的目标平均 token 熵（nats），可设为训练初期记录的熵附近。", advanced=True))
    entropy_coef_min: float = Field(
        0.0, ge=0.0, le=10.0, description="Lower bound of the adaptive entropy coefficient.",
        json_schema_extra=_ui("Entropy coef min", "熵系数下限", "自适应熵系数的下限。", advanced=True))
    entropy_coef_max: float = Field(
        1.0, ge=0.0, le=10.0, description="Upper bound of the adaptive entropy coefficient.",
        json_schema_extra=_ui("Entropy coef max", "熵系数上限", "自适应熵系数的上限。", advanced=True))
    entropy_coef_delta: float = Field(
        0.005, ge=0.0, le=10.0, description="Step of the adaptive entropy coefficient per optimizer step.",
        json_schema_extra=_ui("Entropy coef step", "熵系数步长", "每个优化步自适应熵系数的调整量。", advanced=True))
    disable_dropout: bool = Field(
        True, description="Turn dropout off in the policy and reference, so the ratio to the sampling policy is "
                          "exactly 1 on the first update and the reference is deterministic.",
        json_schema_extra=_ui("Disable dropout", "关闭 dropout",
                              "关闭策略与参考模型中的 dropout，使首次更新时与采样策略的比率恰为 1，"
                              "参考模型输出确定。", advanced=True))
    dynamic_sampling: bool = Field(
        False, description="Drop groups whose rewards are all equal and sample more prompts (DAPO).",
        json_schema_extra=_ui("Dynamic sampling", "动态采样", "丢弃奖励全相同的组并补采更多提示（DAPO）。"))
    dynamic_sampling_max_retries: int = Field(
        3, ge=0, le=100, description="Extra sampling rounds to refill the batch.",
        json_schema_extra=_ui("Dynamic sampling retries", "动态采样重试次数",
                              "为补满批次而额外采样的轮数。", advanced=True))
    skip_solved_prompts: float = Field(
        0.0, ge=0.0, le=0.99, description="Probability of passing over a prompt whose last group was solved (every "
                                          "completion's reward >= solved_reward) when the data order reaches it "
                                          "again: its group would likely score all alike, with no advantage, so the "
                                          "rollout goes to prompts that still teach (GRESO-style selective rollout). "
                                          "Prompts scored all wrong are never skipped. 0 = off.",
        json_schema_extra=_ui("Skip solved prompts", "跳过已解出的提示",
                              "上次整组都答对的提示再次轮到时以此概率跳过（其组多半奖励全同、无优势），"
                              "把采样留给仍能学习的提示；全错的提示从不跳过。0 = 关闭。"))
    advantage_calibration: bool = Field(
        False, description="Advantage calibration (NGRPO): count a virtual completion scoring solved_reward in every "
                           "group's reward mean and std, so a group whose completions all fail gets negative "
                           "advantages and pushes its wrong answers down, where plain GRPO learns nothing from it; a "
                           "group that all reach solved_reward still gets none.",
        json_schema_extra=_ui("Advantage calibration", "优势校准",
                              "优势校准（NGRPO）：每组的奖励均值与标准差计入一个得分为“解出奖励”的虚拟补全，"
                              "使全错的组得到负优势、压低其错误答案（普通 GRPO 从中学不到东西）；"
                              "全部解出的组仍无优势。"))
    replay_solved: bool = Field(
        False, description="Success replay: when no completion of a prompt's group reaches solved_reward, put the "
                           "last solved completion sampled for that prompt in place of the group's last one, so a "
                           "prompt the policy drifted away from still shows a right answer with a positive advantage "
                           "(as ExGRPO and RLEP replay successes). That completion is off-policy: it keeps the "
                           "sampling logprobs of the policy that drew it.",
        json_schema_extra=_ui("Replay solved completions", "重放已解出的补全",
                              "成功重放：某提示的一组补全都没达到“解出奖励”时，"
                              "用该提示上次解出的补全替换组内最后一个，使策略已偏离的提示仍有一个正优势的正确答案"
                              "（同 ExGRPO、RLEP 的做法）。该补全是离策略的：保留采样它的策略的 logprob。"))
    solved_reward: float = Field(
        1.0, ge=-1e6, le=1e6, description="The (weighted) reward at which a completion counts as solved: the top "
                                          "score (1.0 for the 0/1 correctness rewards), for skip_solved_prompts, "
                                          "replay_solved and advantage_calibration.",
        json_schema_extra=_ui("Solved reward", "解出奖励",
                              "补全的（加权）奖励达到此值即算解出（最高分，0/1 正确性奖励为 1.0），"
                              "供“跳过已解出的提示”“重放已解出的补全”与“优势校准”使用。", advanced=True))
    learning_rate: float = Field(1e-4, gt=0.0, le=1.0, description="Peak learning rate (AdamW).",
                                 json_schema_extra=_ui("Learning rate", "学习率", "峰值学习率（AdamW）。"))
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning-rate schedule after warmup.",
        json_schema_extra=_ui("LR schedule", "学习率调度", "预热之后的学习率调度方式。"))
    warmup_steps: int = Field(0, ge=0, le=1000000, description="Linear warmup steps.",
                              json_schema_extra=_ui("Warmup steps", "预热步数", "线性预热的步数。"))
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.",
                                json_schema_extra=_ui("Weight decay", "权重衰减", "AdamW 权重衰减。", advanced=True))
    max_grad_norm: float = Field(1.0, ge=0.0, le=1e6, description="Gradient clipping norm (0 = off).",
                                 json_schema_extra=_ui("Max grad norm", "最大梯度范数", "梯度裁剪范数（0 = 关闭）。"))
    prompts_per_step: int = Field(
        8, ge=1, le=65536, description="Prompts per optimizer step; each yields num_generations completions.",
        json_schema_extra=_ui("Prompts per step", "每步提示数",
                              "每个优化步使用的提示数；每个提示生成 num_generations 个回答。"))
    gradient_accumulation_steps: int = Field(
        1, ge=1, le=4096, description="Micro-batches per optimizer step.",
        json_schema_extra=_ui("Gradient accumulation", "梯度累积", "每个优化步的微批次数。"))
    logprob_chunk_tokens: int = Field(
        0, ge=0, le=1 << 20,
        description="Tokens per slice of the LM head when computing logprobs and entropies: only a slice's [tokens x "
                    "vocabulary] logits exist at a time, and the backward recomputes them (one extra head product) "
                    "instead of keeping them. 0 = sized from the vocabulary (a slice with its softmax and gradient "
                    "within about 256 MB: 147 tokens at 151,936).",
        json_schema_extra=_ui("Logprob slice (tokens)", "对数概率分片（token 数）",
                              "计算对数概率与熵时输出头每片处理的 token 数：同一时刻只存在一片的 [token × 词表] "
                              "logits，反向时重新计算（多一次输出头乘法）而不保存。0 = 按词表大小自动设定"
                              "（每片及其 softmax 与梯度约 256 MB：词表 151,936 时为 147 个 token）。", advanced=True))
    max_steps: int = Field(200, ge=1, le=10_000_000, description="Optimizer steps to train.",
                           json_schema_extra=_ui("Max steps", "最大步数", "训练的优化步数。"))
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for data order, sampling and initialisation.",
                      json_schema_extra=_ui("Seed", "随机种子", "数据顺序、采样和初始化的随机种子。"))

    @property
    def upper_clip(self) -> float:
        """The upper clip range in effect: epsilon_high, or epsilon when epsilon_high is 0."""
        return self.epsilon_high or self.epsilon

    @property
    def zero_advantage_skippable(self) -> bool:
        """Whether completions with zero advantage may be left out of the loss pass without changing the step.

        Their clipped-surrogate term is exactly zero (-min(r * 0, clip(r) * 0)) and so is its gradient. Leaving
        them out is exact when nothing else depends on them: no KL term (beta = 0), a normalisation that counts the
        step's sequences or tokens globally (grpo, dr_grpo, dapo), not per micro-batch (bnpo), token-level ratios
        (the clip metrics are token means), and none of the options that look at other rows or tokens (entropy
        bonus, top-entropy mask, off-policy mask) or change the term (delta). Objectives whose table row does not
        say skip_zero_advantage are not skipped until shown to be zero at zero advantage."""
        return (self.beta == 0.0 and LOSS_TYPES[self.loss_type].skip_zero_advantage
                and self.importance_sampling_level == "token" and self.entropy_coef == 0.0
                and not self.use_adaptive_entropy and self.top_entropy_quantile == 1.0
                and not self.off_policy_mask_threshold and not self.delta)


class OutputSection(Section):
    runs_dir: str = Field("runs", description="Folder that holds run directories.",
                          json_schema_extra=_ui("Runs folder", "运行目录", "存放运行目录的文件夹。"))
    run_name: str = Field("", description="Name in the run id ('' = from the preset or model).",
                          json_schema_extra=_ui("Run name", "运行名称", "运行 ID 中的名称（'' = 取自预设或模型）。"))
    save_steps: int = Field(
        50, ge=0, le=10_000_000, description="Save a checkpoint every N steps (0 = only at the end).",
        json_schema_extra=_ui("Save every N steps", "每 N 步保存", "每 N 步保存一次检查点（0 = 仅在结束时）。"))
    save_total_limit: int = Field(
        0, ge=0, le=10000, description="Keep only the newest N checkpoints (0 = keep all).",
        json_schema_extra=_ui("Checkpoints to keep", "保留检查点数",
                              "只保留最新的 N 个检查点（0 = 全部保留）。", advanced=True))
    log_samples_steps: int = Field(
        1, ge=0, le=10_000_000, description="Log all completions every N steps (0 = never).",
        json_schema_extra=_ui("Log samples every N steps", "每 N 步记录样本", "每 N 步记录全部生成结果（0 = 从不）。"))
    eval_steps: int = Field(
        0, ge=0, le=10_000_000, description="Evaluate on eval_sources every N steps (0 = never).",
        json_schema_extra=_ui("Evaluate every N steps", "每 N 步评估",
                              "每 N 步在评估数据上评估（0 = 从不）。", advanced=True))
    report_to: list[Literal["tensorboard", "wandb", "swanlab"]] = Field(
        [], description="Extra metric sinks beside metrics.jsonl.",
        json_schema_extra=_ui("Also report to", "同时上报到", "除 metrics.jsonl 外的指标记录目标。"))


class RunSpec(Section):
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    rewards: RewardsSection = RewardsSection()
    tools: ToolsSection = ToolsSection()
    rollout: RolloutSection = RolloutSection()
    resources: ResourcesSection = ResourcesSection()
    algorithm: AlgorithmSection = AlgorithmSection()
    output: OutputSection = OutputSection()

    @property
    def completions_per_step(self) -> int:
        return self.algorithm.prompts_per_step * self.rollout.num_generations

    @property
    def prompts_per_rollout(self) -> int:
        """Prompts one rollout samples: prompts_per_step for each of the rollout.steps_per_generation steps it serves."""
        return self.algorithm.prompts_per_step * self.rollout.steps_per_generation

    @property
    def completions_per_rollout(self) -> int:
        return self.prompts_per_rollout * self.rollout.num_generations

    @property
    def updates_per_rollout(self) -> int:
        """Optimizer steps taken on one rollout: each of its steps_per_generation slices, num_iterations times."""
        return self.algorithm.num_iterations * self.rollout.steps_per_generation

    # -- runtime predicates: each written once here, read by the checks, the planner, the builders and the loop

    @property
    def rollout_in_workers(self) -> bool:
        """The engine runs in rollout worker processes: separate placement, workers reached by URL, an engine in
        another environment (worker_python), and LMDeploy always (it pins its own torch). Otherwise (colocated hf
        or vLLM) it runs in the trainer process."""
        r = self.rollout
        return bool(r.worker_urls or r.worker_python) or r.placement == "separate" or r.engine == "lmdeploy"

    def on_gpu(self, gpus_visible: bool) -> bool:
        """Training runs on CUDA GPUs: device cuda, or auto where GPUs are visible. The caller says whether they
        are (torch in the trainer, nvidia-smi's list in the studio, which never imports torch)."""
        return self.resources.device == "cuda" or (self.resources.device == "auto" and gpus_visible)

    def weight_sync_mode(self, on_gpu: bool) -> str:
        """rollout.weight_sync resolved: auto = collective when training and rollout run on GPUs (NCCL), file on
        CPU, where the shared-memory file measured faster than a gloo broadcast (python -m bench.weight_sync)."""
        if self.rollout.weight_sync != "auto":
            return self.rollout.weight_sync
        return "collective" if on_gpu else "file"

    @property
    def adapter_push(self) -> bool:
        """LoRA runs push only the adapter to engines that take one: vLLM (GPU, and its CPU build, which runs LoRA
        here and is tested). The hf engine (worker or in-process copy) and LoRA with LMDeploy get the adapter
        merged into the base weights."""
        return self.model.finetune == "lora" and self.rollout.engine == "vllm"

    @property
    def engine_sleeps(self) -> bool:
        """The engine gives its GPU memory back while the trainer updates: colocated with rollout.sleep, not the hf
        engine (it samples with the policy's own weights or a copy), and not async (it samples during training)."""
        r = self.rollout
        return r.placement == "colocate" and r.sleep and r.engine != "hf" and not r.async_generation

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


SECTIONS: tuple[str, ...] = tuple(RunSpec.model_fields)


# ----------------------------------------------------------------------------- errors

@dataclass(frozen=True)
class SpecIssue:
    field: str  # "section.field", or "" for the whole spec
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class SpecError(ValueError):
    def __init__(self, issues: list[SpecIssue]):
        self.issues = issues
        super().__init__("invalid run spec:\n" + "\n".join(f"  - {i}" for i in issues))


def _pydantic_issues(err: ValidationError) -> list[SpecIssue]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown option"
        out.append(SpecIssue(loc, msg))
    return out


# ----------------------------------------------------------------------------- load / save / overrides

# options that were removed: a spec that still sets one (an older run's spec.yaml, a saved config) loads without
# it, with a warning that says why, instead of failing on an unknown field
RETIRED: dict[str, str] = {
    "resources.activation_reuse_mb": "the activation tape was removed: it paid under 10% (bench/RESULTS.md)",
}


def drop_retired(data: dict[str, Any]) -> dict[str, Any]:
    """`data` without the RETIRED options it sets (a shallow copy; each dropped key warned once per call)."""
    out = dict(data)
    for path, why in RETIRED.items():
        section, name = path.split(".")
        if isinstance(out.get(section), dict) and name in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != name}
            warnings.warn(f"{path} is ignored: {why}", stacklevel=3)
    return out


def spec_from_dict(data: dict[str, Any] | None) -> RunSpec:
    try:
        return RunSpec.model_validate(drop_retired(data or {}))
    except ValidationError as err:
        raise SpecError(_pydantic_issues(err)) from None


def load_spec(path: str | Path, overrides: list[str] | None = None) -> RunSpec:
    p = Path(path)
    if not p.is_file():
        raise SpecError([SpecIssue("", f"config file not found: {p}")])
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as err:
        raise SpecError([SpecIssue("", f"{p} is not valid YAML: {err}")]) from None
    if not isinstance(data, dict):
        raise SpecError([SpecIssue("", f"{p} must hold a mapping of sections")])
    return spec_from_dict(apply_overrides(data, overrides or []))


def save_spec(spec: RunSpec, path: str | Path) -> None:
    Path(path).write_text(spec.to_yaml())


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.field=value` strings; values are parsed as YAML (lists, numbers, booleans)."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    issues = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) != 2:
            issues.append(SpecIssue(key.strip(), f"expected section.field=value, got {item!r}"))
            continue
        section, name = parts
        if section not in SECTIONS:
            issues.append(SpecIssue(key, f"unknown section {section!r} (sections: {', '.join(SECTIONS)})"))
            continue
        if key.strip() in RETIRED:
            warnings.warn(f"{key.strip()} is ignored: {RETIRED[key.strip()]}", stacklevel=3)
            continue
        if name not in RunSpec.model_fields[section].annotation.model_fields:  # type: ignore[union-attr]
            issues.append(SpecIssue(key, "unknown option"))
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        sec = data.get(section) or {}
        if not isinstance(sec, dict):
            sec = {}
        sec[name] = value
        data[section] = sec
    if issues:
        raise SpecError(issues)
    return data


# ----------------------------------------------------------------------------- field catalogue

@dataclass(frozen=True)
class FieldDoc:
    path: str  # "section.field"
    kind: str  # "bool" | "int" | "float" | "str" | "choice" | "list" | "dict" | "rewards"
    default: Any
    help: str
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    exclusive_min: bool = False
    exclusive_max: bool = False
    advanced: bool = False
    label: str = ""  # the studio's label, English ("" = none given: the studio shows the field's name)
    label_zh: str = ""  # ... and Chinese
    help_zh: str = ""  # the Chinese of `help` ("" = none: the studio shows the English)


def _kind(annotation: Any) -> tuple[str, tuple[Any, ...]]:
    origin = get_origin(annotation)
    if origin is Literal:
        return "choice", get_args(annotation)
    if origin is list:
        (inner,) = get_args(annotation)
        if get_origin(inner) is Literal:
            return "multichoice", get_args(inner)
        if inner is RewardFunction:
            return "rewards", ()
        return "list", ()
    if origin is dict:
        return "dict", ()
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(annotation, "str"), ()


def iter_fields() -> list[FieldDoc]:
    """Every option of RunSpec with its help (English and Chinese), labels, default and bounds, in declaration
    order."""
    docs = []
    for section, sfield in RunSpec.model_fields.items():
        for name, f in sfield.annotation.model_fields.items():  # type: ignore[union-attr]
            kind, choices = _kind(f.annotation)
            lo = hi = None
            xlo = xhi = False
            for m in f.metadata:
                if getattr(m, "ge", None) is not None:
                    lo = m.ge
                if getattr(m, "gt", None) is not None:
                    lo, xlo = m.gt, True
                if getattr(m, "le", None) is not None:
                    hi = m.le
                if getattr(m, "lt", None) is not None:
                    hi, xhi = m.lt, True
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            default = f.get_default(call_default_factory=True)
            if isinstance(default, list):
                default = [d.model_dump() if isinstance(d, BaseModel) else d for d in default]
            docs.append(FieldDoc(f"{section}.{name}", kind, default, f.description or "", choices,
                                 lo, hi, xlo, xhi, bool(extra.get("advanced")),
                                 str(extra.get("label", "")), str(extra.get("label_zh", "")),
                                 str(extra.get("help_zh", ""))))
    return docs


def get_field(spec: RunSpec, path: str) -> Any:
    section, name = path.split(".")
    return getattr(getattr(spec, section), name)
