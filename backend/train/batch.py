"""The trainer's batch types: a prompt, a scored group, a rollout batch, a half-used batch.

Named types instead of nested tuples, shared by the loop and the checkpoint format (checkpoint.py
stores them as tensors and plain data, so old checkpoints survive a field rename with a default).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from backend.rollout.base import Completion, RawMedia


@dataclass
class Rollout:
    """One batch of completions with everything the loss needs (tensors on CPU, moved per micro-batch)."""

    index: int  # rollout number, 1-based
    policy_version: int  # optimizer steps taken by the policy that sampled it
    prompt_ids: torch.Tensor  # (B, Lp) left padded
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor  # (B, Lc) right padded
    completion_mask: torch.Tensor  # 1 on the completion's tokens (incl. EOS; in episodes, inserted tokens too)
    loss_mask: torch.Tensor  # the model's own tokens (sampled_mask), minus truncated completions when masked
    sampling_logps: torch.Tensor | None  # (B, Lc) from the engine
    advantages: torch.Tensor  # (B,)
    metrics: dict[str, float]
    samples: list[dict[str, Any]]
    old_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None
    timings: dict[str, float] = field(default_factory=dict)
    is_weights: torch.Tensor | None = None  # truncated importance sampling weights (rollout.vllm_importance_sampling_*)
    # per row: the prompt's image inputs ({"pixel_values", "image_grid_thw"}, backend.multimodal), None for text
    media: list[dict[str, torch.Tensor] | None] | None = None
    # episodes: 1 on the model's own tokens, 0 on inserted tool results and observations (None: all are the model's)
    model_mask: torch.Tensor | None = None
    # (B, F) the reward functions' scores (NaN = not scored): kl_in_reward forms the advantages again from them
    reward_matrix: torch.Tensor | None = None

    @property
    def sampled_mask(self) -> torch.Tensor:
        """The tokens the policy sampled: what the loss, the KL, the entropy and token means count."""
        return self.completion_mask if self.model_mask is None else self.model_mask


@dataclass(frozen=True)
class Prompt:
    text: str  # exactly what the model is prompted with (template applied, image placeholders expanded)
    ids: list[int]
    media: dict[str, torch.Tensor] | None = None  # image inputs for the model (multimodal rows)
    raw_media: RawMedia | None = None  # the images and unexpanded prompt, for an engine that processes them (vLLM)


@dataclass
class ScoredGroup:
    """One prompt's group: its row, the G completions and their rewards (G, number of reward functions)."""

    row: int  # index into the training rows
    prompt: Prompt
    completions: list[Completion]
    rewards: np.ndarray
    replayed: tuple[int, ...] = ()  # indices of completions put back by success replay (backend.train.replay)


@dataclass
class PendingRollout:
    """A rollout with updates left (num_iterations or steps_per_generation > 1) and how many were done."""

    rollout: Rollout
    iterations_done: int  # optimizer steps taken on it, of RunSpec.updates_per_rollout


def take_rows(ro: Rollout, rows: slice | torch.Tensor, samples: list[dict[str, Any]] | None = None) -> Rollout:
    """The rollout restricted to `rows`: every per-completion tensor (and media) indexed, the batch-level fields
    (index, version, metrics, timings) kept; `samples` replaces the sample rows when given."""
    B = ro.completion_ids.shape[0]
    updates: dict[str, Any] = {}
    for f in dataclasses.fields(ro):
        v = getattr(ro, f.name)
        if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == B:
            updates[f.name] = v[rows].clone()
    if ro.media is not None:  # per-row image inputs travel with their rows
        index = range(B)[rows] if isinstance(rows, slice) else rows.tolist()
        updates["media"] = [ro.media[i] for i in index]
    updates["samples"] = ro.samples if samples is None else samples
    updates["timings"] = dict(ro.timings)
    return dataclasses.replace(ro, **updates)


def slice_rows(batch: int, index: int, count: int) -> slice:
    """Rows of slice `index` of `count` equal, contiguous slices of `batch` rows (whole groups when each slice
    holds whole groups, as prompts_per_step x num_generations does)."""
    n = batch // count
    return slice(index * n, (index + 1) * n)


def rollout_slice(ro: Rollout, update: int, count: int) -> Rollout:
    """What optimizer step `update` (0-based, counted within the rollout) trains on when one rollout serves `count`
    steps (rollout.steps_per_generation): slice `update % count`, so num_iterations passes go over the slices in
    order, as TRL's `_buffered_inputs[step % steps_per_generation]`. The rollout itself when count is 1."""
    if count == 1:
        return ro
    return take_rows(ro, slice_rows(ro.completion_ids.shape[0], update % count, count))


def live_groups(advantages: torch.Tensor, rows: slice, group_size: int) -> slice | torch.Tensor | None:
    """The rows of `rows` (group-aligned) in groups with some non-zero advantage: the slice itself when
    every group is live, an index tensor of whole groups when some are not, None when none is."""
    live = (advantages[rows].view(-1, group_size) != 0).any(dim=1)
    if bool(live.all()):
        return rows
    if not bool(live.any()):
        return None
    start = rows.start or 0
    groups = live.nonzero().squeeze(1)
    return (start + groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)
