"""Builders: policy, reference, optimizer, scheduler, rollout engine, from a RunSpec (loading is backend.models)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import PreTrainedModel, get_scheduler

from backend.models import compute_dtype, load_base, model_ref
from backend.rollout.base import RolloutEngine
from backend.rollout.worker import WorkerConfig
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


def build_reference(spec: RunSpec, base_dir: Path, device: torch.device, policy,
                    weights: Path | None = None) -> PreTrainedModel | None:
    """Frozen reference for the KL term. None when beta = 0 (nothing loaded) or with LoRA
    (the reference is the base with the adapter disabled, no second copy). `weights`: a synced reference saved
    in a checkpoint (algorithm.sync_ref_model, backend/train/ref_sync.py) instead of the base model."""
    if spec.algorithm.beta == 0.0 or spec.model.finetune == "lora":
        return None
    ref = load_base(spec, base_dir, device, str(weights) if weights is not None else None)
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


def worker_config(spec: RunSpec, base_dir: Path) -> WorkerConfig:
    r, m = spec.rollout, spec.model
    on_gpu = spec.on_gpu(torch.cuda.is_available())
    full_bf16 = compute_dtype(spec) is not None  # the trainer computes in bf16 over fp32 weights: so does an hf worker
    dtype = "float32" if full_bf16 and r.engine == "hf" else m.dtype
    if dtype == "auto":
        dtype = "bfloat16" if on_gpu else "float32"
    return WorkerConfig(engine=r.engine, model=model_ref(spec, base_dir), dtype=dtype,
                        autocast="bfloat16" if full_bf16 and r.engine == "hf" else "",
                        device="cuda" if on_gpu else "cpu", threads=r.worker_threads, trust_remote_code=m.trust_remote_code,
                        tensor_parallel_size=r.tensor_parallel_size, gpu_memory_utilization=r.gpu_memory_utilization,
                        enable_sleep=r.sleep and r.placement == "colocate", lmdeploy_backend=r.lmdeploy_backend,
                        max_model_len=r.max_model_len, seed=spec.algorithm.seed,
                        max_lora_rank=m.lora_rank if spec.adapter_push else 0)


def rollout_gpu_sets(spec: RunSpec) -> list[list[int]] | None:
    """GPUs of each engine instance: consecutive runs of tensor_parallel_size rollout GPUs (None on CPU)."""
    r, res = spec.rollout, spec.resources
    gpus = res.rollout_gpus if r.placement == "separate" else res.train_gpus[:1] or [0]
    cuda = torch.cuda.is_available()
    if not (gpus and cuda and spec.on_gpu(cuda)):
        return None
    tp = r.tensor_parallel_size
    return [gpus[i * tp:(i + 1) * tp] for i in range(r.data_parallel_size)]


def build_engine(spec: RunSpec, policy, tokenizer, autocast_dtype: torch.dtype | None = None,
                 base_dir: Path = Path("."), log_dir: Path | None = None) -> RolloutEngine:
    """The rollout engine: a pool of rollout workers (spec.rollout_in_workers), colocated vLLM in this process, or
    the hf engine here. Sync hf shares the policy's weights (no sync needed); async hf samples with its own copy."""
    r = spec.rollout
    weight_sync = spec.weight_sync_mode(spec.on_gpu(torch.cuda.is_available()))
    if r.worker_urls:
        from backend.rollout.pool import RolloutPool
        from backend.rollout.worker import connect_worker

        handles = []
        try:
            for i, url in enumerate(r.worker_urls):
                handles.append(connect_worker(url, f"rollout-{i}", r.worker_timeout_s))
        except Exception:
            for h in handles:
                h.close()
            raise
        return RolloutPool(handles, weight_sync=weight_sync, bucket_mb=r.weight_sync_bucket_mb,
                           channel_timeout_s=r.worker_timeout_s)
    if spec.rollout_in_workers:
        from backend.rollout.pool import start_workers

        count = r.data_parallel_size if r.placement == "separate" else 1
        return start_workers(worker_config(spec, base_dir), count, log_dir or Path("."), rollout_gpu_sets(spec),
                             python=r.worker_python, call_timeout_s=r.worker_timeout_s,
                             weight_sync=weight_sync, bucket_mb=r.weight_sync_bucket_mb)
    if r.engine == "vllm":
        from backend.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(worker_config(spec, base_dir))
    from backend.rollout.hf import HFEngine

    model = copy.deepcopy(policy).eval() if r.async_generation else policy
    if r.async_generation:
        model.requires_grad_(False)
    return HFEngine(model, tokenizer, autocast_dtype=autocast_dtype)


def base_name(peft_name: str) -> str:
    """A peft parameter's name as the base model (and every engine) names it."""
    return peft_name.removeprefix("base_model.model.").replace(".base_layer", "")


def lora_scalings(policy, adapter: str = "default") -> dict[str, float]:
    """Each LoRA layer's scale (alpha / r, or alpha / sqrt(r) with rsLoRA) by its module name, as peft holds it."""
    return {name: float(m.scaling[adapter]) for name, m in policy.named_modules()
            if isinstance(getattr(m, "scaling", None), dict) and adapter in m.scaling}


@torch.no_grad()
def merge_lora_state(state: dict[str, torch.Tensor], scalings: dict[str, float],
                     adapter: str = "default") -> dict[str, torch.Tensor]:
    """A peft state (full tensors, peft names) merged into base-model names: W = W_base + scale * B @ A for every
    LoRA linear layer, in float32, cast back to W's dtype. The math peft's merge_adapter does, done on gathered
    copies, for where the live modules cannot be merged in place (ZeRO-3 partitions them)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if "lora_" not in name:
            out[base_name(name)] = t
            continue
        if not (name.endswith(f".lora_A.{adapter}.weight") or name.endswith(f".lora_B.{adapter}.weight")):
            raise ValueError(f"cannot merge LoRA parameter {name!r} for the rollout engine: only LoRA linear layers "
                             f"(lora_A / lora_B of adapter {adapter!r}) are merged")
    for module, scale in scalings.items():
        a, b = state.get(f"{module}.lora_A.{adapter}.weight"), state.get(f"{module}.lora_B.{adapter}.weight")
        if a is None or b is None:
            continue
        key = base_name(f"{module}.base_layer.weight")
        w = out[key]
        out[key] = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)
    return out


def adapter_config(policy, adapter: str = "default") -> dict:
    """The LoRA adapter's peft config as adapter_config.json holds it (what an engine loading the adapter reads)."""
    import json

    d = policy.peft_config[adapter].to_dict()
    return json.loads(json.dumps(d, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


@torch.no_grad()
def adapter_state(policy, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """A CPU copy of the LoRA adapter alone, under the names peft saves (from `state`, the full peft state
    gathered under ZeRO-3, or from the live parameters)."""
    from peft import get_peft_model_state_dict

    got = get_peft_model_state_dict(policy, state_dict=state)
    return {n: t.detach().to("cpu", copy=True) for n, t in got.items()}


@torch.no_grad()
def engine_weights(policy, peft_names: bool) -> dict[str, torch.Tensor]:
    """A CPU copy of the policy's weights for an engine. With LoRA and peft_names False, the adapter is merged
    into the base weights and the names are the base model's (what vLLM, LMDeploy and an hf worker hold);
    an in-process copy of the peft model (peft_names) takes the names as they are."""
    is_peft = hasattr(policy, "merge_adapter")
    if not is_peft or peft_names:
        return {n: p.detach().to("cpu", copy=True) for n, p in policy.named_parameters()}
    policy.merge_adapter()
    try:
        out = {}
        for n, p in policy.named_parameters():
            if "lora_" in n:
                continue
            out[base_name(n)] = p.detach().to("cpu", copy=True)
        return out
    finally:
        policy.unmerge_adapter()
