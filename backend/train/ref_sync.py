"""Reference-model sync (TR-DPO; TRL's `sync_ref_model`): the KL reference follows the policy slowly.

Every `algorithm.ref_model_sync_steps` optimizer steps (after the step whose number is a multiple of it, as TRL's
SyncRefModelCallback.on_step_end), each reference parameter becomes
    ref = alpha * policy + (1 - alpha) * ref          alpha = algorithm.ref_model_mixup_alpha
computed as TRL computes it (`ref.mul_(1 - alpha).add_(policy, alpha=alpha)`, in the reference's dtype), so the
numbers match TRL's. Parameters are paired by name, not by order, so a model whose two copies list them
differently fails loudly instead of mixing the wrong tensors. Reference logprobs of a rollout are taken when it is
prepared, so a sync applies from the next rollout on (TRL computes them at generation too).

It needs a reference of its own: full fine-tuning with beta > 0, whole on every rank (no ZeRO-3 partitioning);
`backend.checks` refuses the rest. The reference is then state: checkpoints keep it in `reference/` (a model
directory) and a resume loads it from there (`reference_dir`), so a resumed run's KL term is the straight run's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from backend.spec import AlgorithmSection

REFERENCE_DIR = "reference"  # the synced reference inside a checkpoint directory


@torch.no_grad()
def mix_into(reference: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
    """reference <- alpha * policy + (1 - alpha) * reference, parameter by parameter (by name)."""
    ref_params = dict(reference.named_parameters())
    pol_params = dict(policy.named_parameters())
    if ref_params.keys() != pol_params.keys():
        missing = sorted(ref_params.keys() ^ pol_params.keys())[:3]
        raise RuntimeError(f"the reference and the policy have different parameters (e.g. {missing}): cannot sync")
    for name, ref in ref_params.items():
        ref.data.mul_(1.0 - alpha).add_(pol_params[name].data.to(ref.device), alpha=alpha)


def due(step: int, every: int) -> bool:
    """Whether optimizer step `step` (1-based) ends with a sync."""
    return step > 0 and step % every == 0


class RefSync:
    """The loop's handle: `after_step(step)` mixes when due; `save(ckpt)` keeps the reference in a checkpoint."""

    def __init__(self, algorithm: AlgorithmSection, reference: torch.nn.Module | None, policy: torch.nn.Module) -> None:
        if reference is None:  # the check refuses this before launch (backend.checks); a direct caller hears why
            raise ValueError("algorithm.sync_ref_model needs a reference model of its own: beta > 0 and full "
                             "fine-tuning (with LoRA the reference is the adapter-disabled base)")
        self.alpha, self.every = algorithm.ref_model_mixup_alpha, algorithm.ref_model_sync_steps
        self.reference, self.policy = reference, policy
        self.syncs = 0  # done by this process

    def after_step(self, step: int) -> bool:
        if not due(step, self.every):
            return False
        mix_into(self.reference, self.policy, self.alpha)
        self.syncs += 1
        return True

    def save(self, ckpt: Path) -> None:
        self.reference.save_pretrained(ckpt / REFERENCE_DIR, safe_serialization=True)


def reference_dir(algorithm: AlgorithmSection, ckpt: Path | None) -> Path | None:
    """The synced reference a resume loads (None: the base model, as at the start)."""
    if ckpt is None or not algorithm.sync_ref_model or not (ckpt / REFERENCE_DIR).is_dir():
        return None
    return ckpt / REFERENCE_DIR
