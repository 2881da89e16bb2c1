"""RunSpec: the one definition of a GRPO run.

Every option is declared here once, with its help text, default and bounds. The CLI
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

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


def _adv(**extra: Any) -> dict[str, Any]:
    """Mark a field as advanced: the studio shows it in a collapsed group."""
    return {"advanced": True, **extra}


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
}
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"]  # spelled out for type checkers
if get_args(LossType) != tuple(LOSS_TYPES):
    raise AssertionError("LossType and LOSS_TYPES name different loss types")
CLIPPED_LOSS_TYPES: tuple[str, ...] = tuple(name for name, info in LOSS_TYPES.items() if info.clipped)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSection(Section):
    name_or_path: str = Field("assets/tiny-add", description="Local model directory or hub id (org/name).")
    finetune: Literal["full", "lora"] = Field("full", description="Train all weights, or a LoRA adapter (peft).")
    lora_rank: int = Field(16, ge=1, le=1024, description="LoRA rank r.")
    lora_alpha: int = Field(32, ge=1, le=4096, description="LoRA alpha (scale = alpha / r).")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA branch.",
                                json_schema_extra=_adv())
    lora_targets: list[str] = Field(["all-linear"], description="Module names LoRA wraps; 'all-linear' = every linear layer but the head.")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="Weights and compute dtype. bfloat16 with full fine-tuning keeps fp32 master "
                    "weights under bf16 autocast: fast on GPUs, and on CPUs with AVX512-BF16 or AMX at large "
                    "batches (small ones: float32 is faster).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.",
                                         json_schema_extra=_adv())
    trust_remote_code: bool = Field(False, description="Allow model code from the model directory.",
                                    json_schema_extra=_adv())


class DataSection(Section):
    sources: list[str] = Field(
        ["assets/data/add_train.jsonl"],
        description="Training data: JSONL, JSON, CSV or Parquet files, saved datasets directories or hub "
                    "dataset ids, each optionally with a sample count ('train.jsonl#1800'); mixed by the seed.")
    prompt_column: str = Field("prompt", description="Column with the prompt: a string or a list of chat messages.")
    solution_column: str = Field("solution", description="Column with the reference answer, passed to rewards as 'solution'.")
    images_column: str = Field("", description="Column with image paths for multimodal models ('' = none).",
                               json_schema_extra=_adv())
    videos_column: str = Field(
        "", description="Column with videos for vision-language models: an animated GIF/WebP, or a list of frame "
                        "images ('' = none).", json_schema_extra=_adv())
    max_video_frames: int = Field(
        64, ge=0, le=4096, description="Frames per video at most: longer videos keep this many, evenly spaced from "
                                       "the first to the last (0 = every frame).", json_schema_extra=_adv())
    audios_column: str = Field("", description="Column with WAV audio for models whose processor takes audio ('' = none).",
                               json_schema_extra=_adv())
    prompt_template: str = Field(
        "", description="Build the prompt from columns, e.g. 'Make {target} from {nums}.' ('' = use prompt_column).")
    system_prompt: str = Field("", description="System message prepended to every prompt ('' = none).")
    chat_template: Literal["auto", "on", "off"] = Field(
        "auto", description="Apply the tokenizer's chat template: auto = when the tokenizer has one.")
    limit: int = Field(0, ge=0, description="Use at most this many training rows after mixing (0 = all).")
    eval_sources: list[str] = Field([], description="Held-out data for evaluation, same format as sources.",
                                    json_schema_extra=_adv())


class RewardFunction(Section):
    name: str = Field(description="Built-in reward name or a function from a plugin file.")
    weight: float = Field(1.0, ge=-100.0, le=100.0, description="Weight in the summed reward.")
    params: dict[str, Any] = Field({}, description="Parameters of this reward function.")


class RewardsSection(Section):
    functions: list[RewardFunction] = Field(
        [RewardFunction(name="exact_match"), RewardFunction(name="digit_match")],
        description="Reward functions, weighted and summed.")
    plugins: list[str] = Field([], description="Python files whose reward functions may be named above.")
    on_error: Literal["fail", "skip"] = Field(
        "fail", description="When a reward function raises or times out: fail the run, or score the batch None.",
        json_schema_extra=_adv())
    timeout_s: float = Field(120.0, gt=0, le=3600, description="Per-batch timeout of a reward function (seconds).",
                             json_schema_extra=_adv())


class RolloutSection(Section):
    engine: Literal["hf", "vllm", "lmdeploy"] = Field(
        "hf", description="Sampling engine: hf (transformers, CPU or GPU), vllm, lmdeploy (GPU).")
    placement: Literal["colocate", "separate"] = Field(
        "colocate", description="colocate: engine shares the training devices (sleeps during training); "
                                "separate: engine runs in its own rollout worker process(es), on its own rollout GPUs "
                                "(on CPU: its own process and cores).")
    num_generations: int = Field(8, ge=2, le=1024, description="Completions per prompt (the group size G).")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling: keep the smallest set of tokens with this mass.")
    top_k: int = Field(0, ge=0, le=100000, description="Keep the k most likely tokens (0 = off).")
    max_completion_length: int = Field(8, ge=1, le=131072, description="Maximum new tokens per completion.")
    async_generation: bool = Field(
        False, description="Sample the next batches with the newest weights the engine has while training on this one "
                           "(off-policy by at most max_staleness updates).")
    max_staleness: int = Field(1, ge=1, le=16, description="Async: most policy updates between sampling a batch and "
                                                           "training on it (1 = one step off-policy).",
                               json_schema_extra=_adv())
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="Fraction of GPU memory the engine may take.",
                                          json_schema_extra=_adv())
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs per engine instance (tensor parallel).",
                                      json_schema_extra=_adv())
    data_parallel_size: int = Field(1, ge=1, le=64, description="Engine instances sampling in parallel.",
                                    json_schema_extra=_adv())
    sleep: bool = Field(True, description="Colocated engines release memory while the trainer updates.",
                        json_schema_extra=_adv())
    lmdeploy_backend: Literal["pytorch", "turbomind"] = Field("pytorch", description="LMDeploy engine backend.",
                                                              json_schema_extra=_adv())
    worker_urls: list[str] = Field([], description="host:port of rollout workers started by hand "
                                                   "(python -m backend.rollout.worker); empty = the trainer starts them. "
                                                   "The key comes from GRPO_WORKER_AUTHKEY.", json_schema_extra=_adv())
    worker_python: str = Field("", description="Python interpreter for rollout workers, e.g. the LMDeploy or vLLM "
                                               "environment's bin/python (empty = the trainer's).", json_schema_extra=_adv())
    worker_threads: int = Field(1, ge=1, le=1024, description="torch threads per rollout worker on CPU.",
                                json_schema_extra=_adv())
    worker_timeout_s: float = Field(900.0, ge=10.0, le=86400.0, description="A rollout worker that takes longer than "
                                    "this for one request counts as hung: the run fails naming it.",
                                    json_schema_extra=_adv())
    weight_sync: Literal["auto", "file", "collective"] = Field(
        "auto", description="How new weights reach rollout workers after each update. file: one shared-memory "
                            "file that local workers keep mapped and copy from (inline bytes to a worker reached by "
                            "URL); collective: a process group of the trainer and the workers (NCCL on GPUs, gloo on "
                            "CPU) broadcasting buckets; auto: collective when trainer and workers are on GPUs, file on "
                            "CPU. In-process engines take the weights directly.", json_schema_extra=_adv())
    weight_sync_bucket_mb: int = Field(256, ge=1, le=16384, description="Collective weight sync: bucket size in MB "
                                       "(one broadcast each; bigger = fewer calls, more memory).", json_schema_extra=_adv())
    # Names as TRL's GRPOConfig (its clip_max replaced the deprecated _cap); off by default because the default
    # engines compute sampling logprobs with the trainer's own weights and code.
    vllm_importance_sampling_correction: bool = Field(
        False, description="Truncated importance sampling: weight the loss by pi_trainer / pi_sampler to correct for "
                           "engine/trainer mismatch and async staleness (any engine, despite the TRL name).",
        json_schema_extra=_adv())
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field(
        "sequence_mask", description="Per token or per sequence ratio; truncate = clip at the cap, mask = zero above it.",
        json_schema_extra=_adv())
    vllm_importance_sampling_clip_max: float = Field(3.0, gt=1.0, le=1000.0, description="Importance sampling cap C.",
                                                     json_schema_extra=_adv())


class ResourcesSection(Section):
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Training device; auto = cuda if present, else cpu.")
    train_gpus: list[int] = Field([], description="GPU indices for training, one rank each (empty = one GPU, or cpu).")
    rollout_gpus: list[int] = Field([], description="GPU indices for the rollout engines when placement is separate.")
    nproc_per_node: int = Field(0, ge=0, le=1024, description=(
        "Training ranks on each node (0 = one per train_gpus entry, at least 1). On cpu, >1 runs data-parallel "
        "ranks with the gloo backend."), json_schema_extra=_adv())
    nnodes: int = Field(1, ge=1, le=4096, description="Nodes that run training ranks (torchrun --nnodes).",
                        json_schema_extra=_adv())
    node_rank: int = Field(0, ge=0, le=4095, description="This node's index among nnodes (0 writes the run directory).",
                           json_schema_extra=_adv())
    master_addr: str = Field("127.0.0.1", description="Address of node 0, where the ranks meet (torchrun --master_addr).",
                             json_schema_extra=_adv())
    master_port: int = Field(0, ge=0, le=65535, description="Port of node 0 for the ranks to meet (0 = a free port; "
                                                            "set one for several nodes).", json_schema_extra=_adv())
    deepspeed_stage: int = Field(0, ge=0, le=3, description=(
        "DeepSpeed ZeRO stage: 0 = plain PyTorch (torch.distributed), 1/2 = shard optimizer states (and gradients), "
        "3 = shard parameters too."), json_schema_extra=_adv())
    offload: bool = Field(False, description="Offload optimizer states to CPU memory (DeepSpeed, stage >= 1).",
                          json_schema_extra=_adv())
    offload_params: bool = Field(False, description="Offload parameters to CPU memory (DeepSpeed ZeRO-3).",
                                 json_schema_extra=_adv())
    deepspeed_config: str = Field("", description=(
        "A DeepSpeed JSON file merged over the generated config (keys it sets win; batch sizes stay the trainer's)."),
                                  json_schema_extra=_adv())
    num_threads: int = Field(0, ge=0, le=1024, description="CPU threads for torch (0 = torch's default).",
                             json_schema_extra=_adv())
    activation_reuse_mb: int = Field(
        1024, ge=0, le=1 << 20, description=(
            "Memory (MB) for keeping the rollout's linear-layer outputs, so the training pass replays them instead of "
            "recomputing its forward matrix products (about a third of a step's training FLOPs). Applies to the sync "
            "hf engine on the policy's own float32 weights, on the first update of each batch; a rollout that needs "
            "more is trained the usual way. 0 = off."), json_schema_extra=_adv())

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
                            "each sequence's token sum, with importance_sampling_level sequence (LUSPO).")
    beta: float = Field(0.0, ge=0.0, le=100.0, description="KL coefficient to the reference model (0 = no reference loaded).")
    use_bias_correction_kl: bool = Field(
        True, description="Multiply the k3 KL term by the importance ratio, the unbiased reverse-KL gradient "
                          "(DeepSeek-V3.2); only matters with beta > 0.", json_schema_extra=_adv())
    epsilon: float = Field(0.2, gt=0.0, lt=1.0, description="Lower clip range of the ratio: 1 - epsilon.")
    epsilon_high: float = Field(0.0, ge=0.0, le=10.0,
                                description="Upper clip range: 1 + epsilon_high (0 = same as epsilon; DAPO uses 0.28). "
                                            "With loss_type cispo it is the cap of the IS weight itself (ScaleRL: 5.0).")
    delta: float = Field(0.0, ge=0.0, le=100.0,
                         description="Two-sided clipping (INTELLECT-2): cap the unclipped ratio term at delta, so a "
                                     "negative advantage cannot push a huge ratio further; > 1 + epsilon_high, e.g. 4 "
                                     "(0 = off).", json_schema_extra=_adv())
    sapo_temperature_pos: float = Field(1.0, gt=0.0, le=100.0,
                                        description="SAPO gate temperature for tokens with positive advantage.",
                                        json_schema_extra=_adv())
    sapo_temperature_neg: float = Field(1.05, gt=0.0, le=100.0,
                                        description="SAPO gate temperature for tokens with non-positive advantage "
                                                    "(the paper: a little above the positive one).",
                                        json_schema_extra=_adv())
    num_iterations: int = Field(1, ge=1, le=64, description="Optimizer steps per rollout batch (the paper's mu).")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Divide advantages by the group's reward std, the batch's, or not at all (Dr. GRPO).")
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="Ratio per token (GRPO) or one per sequence, the mean log-ratio (GSPO).")
    mask_truncated_completions: bool = Field(False, description="Exclude completions that hit max length from the loss.")
    off_policy_mask_threshold: float = Field(
        0.0, ge=0.0, le=100.0,
        description="Off-policy sequence mask (DeepSeek-V3.2): leave out negative-advantage completions whose mean "
                    "per-token log pi_sampling - log pi_theta exceeds this, against the engine's sampling logprobs "
                    "where it gives them (else the old policy's), e.g. 0.5 (0 = off).", json_schema_extra=_adv())
    top_entropy_quantile: float = Field(
        1.0, ge=0.0, le=1.0, description="Train only on this top fraction of tokens by entropy, the 'forking' tokens "
                                         "(Beyond the 80/20 rule: 0.2; 1 = all tokens).", json_schema_extra=_adv())
    entropy_coef: float = Field(
        0.0, ge=0.0, le=10.0, description="Entropy bonus: subtract coef x mean token entropy from the loss, the same "
                                          "for every loss type (0 = off; the start value when adaptive).",
        json_schema_extra=_adv())
    use_adaptive_entropy: bool = Field(
        False, description="Adaptive entropy control (Skywork-OR1): apply the bonus only while entropy is at or "
                           "below entropy_target; raise the coefficient by entropy_coef_delta each step it is, "
                           "lower it otherwise.", json_schema_extra=_adv())
    entropy_target: float = Field(0.2, ge=0.0, le=100.0,
                                  description="Target mean token entropy (nats) of adaptive entropy control; set it "
                                              "near the entropy logged early in training.", json_schema_extra=_adv())
    entropy_coef_min: float = Field(0.0, ge=0.0, le=10.0, description="Lower bound of the adaptive entropy coefficient.",
                                    json_schema_extra=_adv())
    entropy_coef_max: float = Field(1.0, ge=0.0, le=10.0, description="Upper bound of the adaptive entropy coefficient.",
                                    json_schema_extra=_adv())
    entropy_coef_delta: float = Field(0.005, ge=0.0, le=10.0,
                                      description="Step of the adaptive entropy coefficient per optimizer step.",
                                      json_schema_extra=_adv())
    disable_dropout: bool = Field(
        True, description="Turn dropout off in the policy and reference, so the ratio to the sampling policy is "
                          "exactly 1 on the first update and the reference is deterministic.", json_schema_extra=_adv())
    dynamic_sampling: bool = Field(False, description="Drop groups whose rewards are all equal and sample more prompts (DAPO).")
    dynamic_sampling_max_retries: int = Field(3, ge=0, le=100, description="Extra sampling rounds to refill the batch.",
                                              json_schema_extra=_adv())
    skip_solved_prompts: float = Field(
        0.0, ge=0.0, le=0.99, description="Probability of passing over a prompt whose last group was solved (every "
                                          "completion's reward >= solved_reward) when the data order reaches it again: "
                                          "its group would likely score all alike, with no advantage, so the rollout goes "
                                          "to prompts that still teach (GRESO-style selective rollout). Prompts scored all "
                                          "wrong are never skipped. 0 = off.")
    advantage_calibration: bool = Field(
        False, description="Advantage calibration (NGRPO): count a virtual completion scoring solved_reward in every "
                           "group's reward mean and std, so a group whose completions all fail gets negative "
                           "advantages and pushes its wrong answers down, where plain GRPO learns nothing from it; a "
                           "group that all reach solved_reward still gets none.")
    replay_solved: bool = Field(
        False, description="Success replay: when no completion of a prompt's group reaches solved_reward, put the "
                           "last solved completion sampled for that prompt in place of the group's last one, so a "
                           "prompt the policy drifted away from still shows a right answer with a positive advantage "
                           "(as ExGRPO and RLEP replay successes). That completion is off-policy: it keeps the "
                           "sampling logprobs of the policy that drew it.")
    solved_reward: float = Field(1.0, ge=-1e6, le=1e6, description="The (weighted) reward at which a completion counts as "
                                 "solved: the top score (1.0 for the 0/1 correctness rewards), for skip_solved_prompts, "
                                 "replay_solved and advantage_calibration.",
                                 json_schema_extra=_adv())
    learning_rate: float = Field(1e-4, gt=0.0, le=1.0, description="Peak learning rate (AdamW).")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field("constant", description="Learning-rate schedule after warmup.")
    warmup_steps: int = Field(0, ge=0, le=1000000, description="Linear warmup steps.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.", json_schema_extra=_adv())
    max_grad_norm: float = Field(1.0, ge=0.0, le=1e6, description="Gradient clipping norm (0 = off).")
    prompts_per_step: int = Field(8, ge=1, le=65536, description="Prompts per optimizer step; each yields num_generations completions.")
    gradient_accumulation_steps: int = Field(1, ge=1, le=4096, description="Micro-batches per optimizer step.")
    max_steps: int = Field(200, ge=1, le=10_000_000, description="Optimizer steps to train.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for data order, sampling and initialisation.")

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
    runs_dir: str = Field("runs", description="Folder that holds run directories.")
    run_name: str = Field("", description="Name in the run id ('' = from the preset or model).")
    save_steps: int = Field(50, ge=0, le=10_000_000, description="Save a checkpoint every N steps (0 = only at the end).")
    save_total_limit: int = Field(0, ge=0, le=10000, description="Keep only the newest N checkpoints (0 = keep all).",
                                  json_schema_extra=_adv())
    log_samples_steps: int = Field(1, ge=0, le=10_000_000, description="Log all completions every N steps (0 = never).")
    eval_steps: int = Field(0, ge=0, le=10_000_000, description="Evaluate on eval_sources every N steps (0 = never).",
                            json_schema_extra=_adv())
    report_to: list[Literal["tensorboard", "wandb", "swanlab"]] = Field(
        [], description="Extra metric sinks beside metrics.jsonl.")


class RunSpec(Section):
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    rewards: RewardsSection = RewardsSection()
    rollout: RolloutSection = RolloutSection()
    resources: ResourcesSection = ResourcesSection()
    algorithm: AlgorithmSection = AlgorithmSection()
    output: OutputSection = OutputSection()

    @property
    def completions_per_step(self) -> int:
        return self.algorithm.prompts_per_step * self.rollout.num_generations

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

def spec_from_dict(data: dict[str, Any] | None) -> RunSpec:
    try:
        return RunSpec.model_validate(data or {})
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
    """Every option of RunSpec with its help, default and bounds, in declaration order."""
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
                                 lo, hi, xlo, xhi, bool(extra.get("advanced"))))
    return docs


def get_field(spec: RunSpec, path: str) -> Any:
    section, name = path.split(".")
    return getattr(getattr(spec, section), name)
