"""Which options do nothing under a spec's other choices: one small table, `INERT_RULES`, read by two places.

The studio greys such a field out (not editable) with the rule's reason beside it, and `checks.check` refuses a
value other than the default where the rule says `refuse` (a setting that would be silently ignored). Both read
this table, so the form and the check cannot disagree about what an option depends on. Loss-type dependencies
are derived from `LOSS_TYPES` (each objective's `options`, and the clip options its `clipped` / `weight_cap`
imply), never listed by hand.

The table holds the obvious dependencies only: LoRA fields under full fine-tuning, KL options without a KL term,
per-objective options, the adaptive entropy controller, engine-specific rollout fields and options of a feature
that is off. It never removes a field: an inert field keeps its value and is written to the spec as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backend.spec import LOSS_TYPES, RunSpec


@dataclass(frozen=True)
class Inert:
    """`fields` ('section.field') do nothing while `when(spec)` holds; `why` / `why_zh` say so."""

    fields: tuple[str, ...]
    when: Callable[[RunSpec], bool]
    why: str
    why_zh: str
    refuse: bool = False  # the check refuses a non-default value while the rule holds (it would be ignored)


def _loss_readers() -> dict[str, tuple[str, ...]]:
    """Option -> the loss types that read it: each objective's own `options`, and the clip options (epsilon and
    delta: the clipped surrogate; epsilon_high: that, or the cap of a capped importance weight)."""
    readers: dict[str, list[str]] = {}
    for name, info in LOSS_TYPES.items():
        reads = list(info.options)
        if info.clipped:
            reads += ["epsilon", "delta"]
        if info.clipped or info.weight_cap:
            reads.append("epsilon_high")
        for option in reads:
            readers.setdefault(option, []).append(name)
    return {option: tuple(names) for option, names in readers.items()}


def _loss_rules() -> list[Inert]:
    rules = []
    for option, names in _loss_readers().items():
        if set(names) == set(LOSS_TYPES):
            continue  # read by every objective
        own = any(option in LOSS_TYPES[n].options for n in names)
        which = " / ".join(names)
        what, what_zh = ("", "") if own else \
            ((" (the clipped objectives)", "（裁剪类目标）") if option != "epsilon_high" else
             (" (the clipped objectives, and cispo's weight cap)", "（裁剪类目标，以及 cispo 的权重上限）"))
        rules.append(Inert((f"algorithm.{option}",), lambda s, names=names: s.algorithm.loss_type not in names,
                           f"only used by loss_type {which}{what}", f"仅 loss_type 为 {which} 时使用{what_zh}",
                           refuse=own or option == "delta"))
    return rules


INERT_RULES: tuple[Inert, ...] = (
    Inert(("model.lora_rank", "model.lora_alpha", "model.lora_dropout", "model.lora_targets"),
          lambda s: s.model.finetune != "lora", "only used with fine-tuning 'lora'", "仅在微调方式为 lora 时使用"),
    Inert(("algorithm.use_bias_correction_kl",), lambda s: s.algorithm.beta == 0.0 or s.algorithm.kl_in_reward,
          "only used with a KL term in the loss (beta > 0, kl_in_reward off)",
          "仅在损失中有 KL 项（beta > 0 且未开启 kl_in_reward）时使用"),
    Inert(("algorithm.kl_in_reward",), lambda s: s.algorithm.beta == 0.0,  # checks.py refuses it on, saying why
          "only used with a KL term (beta > 0)", "仅在有 KL 项（beta > 0）时使用"),
    *_loss_rules(),
    Inert(("algorithm.entropy_target", "algorithm.entropy_coef_min", "algorithm.entropy_coef_max",
           "algorithm.entropy_coef_delta"), lambda s: not s.algorithm.use_adaptive_entropy,
          "only used with use_adaptive_entropy", "仅在开启 use_adaptive_entropy 时使用", refuse=True),
    Inert(("algorithm.dynamic_sampling_max_retries",), lambda s: not s.algorithm.dynamic_sampling,
          "only used with dynamic sampling", "仅在开启动态采样时使用"),
    Inert(("rollout.lmdeploy_backend",), lambda s: s.rollout.engine != "lmdeploy",
          "only used with engine lmdeploy", "仅在引擎为 lmdeploy 时使用"),
    Inert(("algorithm.ref_model_mixup_alpha", "algorithm.ref_model_sync_steps"),
          lambda s: not s.algorithm.sync_ref_model, "only used with sync_ref_model", "仅在开启 sync_ref_model 时使用",
          refuse=True),
    Inert(("rollout.gpu_memory_utilization", "rollout.sleep", "rollout.max_model_len"), lambda s: s.rollout.engine == "hf",
          "not used by engine hf (vllm and lmdeploy only)", "hf 引擎不使用（仅用于 vllm 和 lmdeploy）"),
    Inert(("rollout.max_staleness",), lambda s: not s.rollout.async_generation,
          "only used with async generation", "仅在开启异步生成时使用"),
    Inert(("rollout.vllm_importance_sampling_mode", "rollout.vllm_importance_sampling_clip_max"),
          lambda s: not s.rollout.vllm_importance_sampling_correction,
          "only used with importance sampling correction on", "仅在开启重要性采样校正时使用"),
)


def inert_fields(spec: RunSpec) -> dict[str, Inert]:
    """Each field that does nothing under `spec`, with the (first) rule that says so."""
    out: dict[str, Inert] = {}
    for rule in INERT_RULES:
        if rule.when(spec):
            for path in rule.fields:
                out.setdefault(path, rule)
    return out
