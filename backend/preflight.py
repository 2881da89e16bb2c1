"""Can this machine and this version run the spec? Checked at launch, before a run directory exists.

`spec.check_spec` says whether a spec is well-formed (presets for GPU clusters pass it anywhere);
this says whether it can start here, so a run never fails after minutes of model loading for a
reason known up front.
"""

from __future__ import annotations

import torch

from backend.spec import RunSpec, SpecIssue

AVAILABLE_ENGINES = ("hf",)  # vllm and lmdeploy plug in behind backend/engines/base.py


def check_runnable(spec: RunSpec) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    r, res = spec.rollout, spec.resources
    if r.engine not in AVAILABLE_ENGINES:
        issues.append(SpecIssue("rollout.engine", f"engine {r.engine!r} is not available in this version yet; use 'hf'"))
    if r.placement == "separate":
        issues.append(SpecIssue("rollout.placement", "separate rollout GPUs need the vllm or lmdeploy engine, "
                                                     "not available in this version yet; use 'colocate'"))
    gpus = torch.cuda.device_count()
    wants_cuda = res.device == "cuda" or res.train_gpus or res.rollout_gpus
    if wants_cuda and gpus == 0:
        issues.append(SpecIssue("resources.device", "no CUDA GPU is visible on this machine; use device cpu or auto"))
    for field, ids in (("resources.train_gpus", res.train_gpus), ("resources.rollout_gpus", res.rollout_gpus)):
        missing = [g for g in ids if g >= gpus]
        if gpus and missing:
            issues.append(SpecIssue(field, f"GPU(s) {missing} not visible (this machine has {gpus})"))
    if len(res.train_gpus) > 1 or res.deepspeed_stage:
        issues.append(SpecIssue("resources.train_gpus" if len(res.train_gpus) > 1 else "resources.deepspeed_stage",
                                "multi-GPU training (torchrun/DeepSpeed) is not available in this version yet; "
                                "use one training GPU and deepspeed_stage 0"))
    if spec.data.images_column:
        issues.append(SpecIssue("data.images_column", "multimodal GRPO is not available in this version yet"))
    return issues
