"""The trainer's batch types: a prompt, a scored group, a rollout batch, a half-used batch.

Named types instead of nested tuples, shared by the loop and the checkpoint format (checkpoint.py
stores them as tensors and plain data, so old checkpoints survive a field rename with a default).
"""

from __future__ import annotations

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
    """A rollout with updates left (num_iterations > 1) and how many were done."""

    rollout: Rollout
    iterations_done: int


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
