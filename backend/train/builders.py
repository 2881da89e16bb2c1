"""Builders: policy, reference, optimizer, scheduler, rollout engine, from a RunSpec (loading is backend.models)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import PreTrainedModel, get_scheduler

from backend.models import compute_dtype, load_base
from backend.rollout.base import RolloutEngine
from backend.spec import RunSpec


def build_policy(spec: RunSpec, base_dir: Path, device: torch.device, checkpoint: Path | None = None):
    """The trainable policy: the base model (full) or the base plus a LoRA adapter.

    From a checkpoint, full weights (or the adapter) are loaded from checkpoint/model.
    """
    m = spec.model
    if m.finetune == "full":
        master = torch.float32 if compute_dtype(spec) is not None else None
        model = load_base(spec, base_dir, device, str(checkpoint / "model") if checkpoint else None, dtype=master)
    else:
        from peft import LoraConfig, PeftModel, get_peft_model

        base = load_base(spec, base_dir, device)
        if checkpoint:
            model = PeftModel.from_pretrained(base, str(checkpoint / "model"), is_trainable=True)
        else:
            targets = m.lora_targets[0] if m.lora_targets == ["all-linear"] else m.lora_targets
            cfg = LoraConfig(r=m.lora_rank, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                             target_modules=targets, task_type="CAUSAL_LM")
            model = get_peft_model(base, cfg)
    if m.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if m.finetune == "lora":
            model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks still need an input grad

    if spec.algorithm.disable_dropout:
        disable_dropout(model)
    model.train()
    return model


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off everywhere, in train mode too: nn.Dropout layers (as TRL's disable_dropout_in_model) and the
    attention-probability dropout that transformers' attention modules apply from a float attribute."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def build_reference(spec: RunSpec, base_dir: Path, device: torch.device, policy) -> PreTrainedModel | None:
    """Frozen reference for the KL term. None when beta = 0 (nothing loaded) or with LoRA
    (the reference is the base with the adapter disabled, no second copy)."""
    if spec.algorithm.beta == 0.0 or spec.model.finetune == "lora":
        return None
    ref = load_base(spec, base_dir, device)
    ref.eval().requires_grad_(False)
    return ref


def build_optimizer(spec: RunSpec, model) -> torch.optim.Optimizer:
    a = spec.algorithm
    params = [p for p in model.parameters() if p.requires_grad]
    try:  # the fused kernel is ~3x faster than the per-tensor loop on CPU too
        return torch.optim.AdamW(params, lr=a.learning_rate, weight_decay=a.weight_decay, fused=True)
    except (RuntimeError, TypeError):  # dtypes/devices without a fused kernel
        return torch.optim.AdamW(params, lr=a.learning_rate, weight_decay=a.weight_decay)


def build_scheduler(spec: RunSpec, optimizer: torch.optim.Optimizer):
    a = spec.algorithm
    name = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}[a.lr_scheduler]
    return get_scheduler(name, optimizer, num_warmup_steps=a.warmup_steps, num_training_steps=a.max_steps)


def build_engine(spec: RunSpec, policy, tokenizer, autocast_dtype: torch.dtype | None = None) -> RolloutEngine:
    """The rollout engine. Sync hf shares the policy's weights (no sync needed); async hf samples
    with its own copy, refreshed after each update, so generation overlaps training."""
    r = spec.rollout
    if r.engine == "hf":
        from backend.rollout.hf import HFEngine

        model = copy.deepcopy(policy).eval() if r.async_generation else policy
        if r.async_generation:
            model.requires_grad_(False)
        return HFEngine(model, tokenizer, autocast_dtype=autocast_dtype)
    raise RuntimeError(f"rollout.engine {r.engine!r} is not available in this version yet; use engine 'hf' "
                       "(the vLLM and LMDeploy engines plug into backend/engines/ behind the same interface)")
