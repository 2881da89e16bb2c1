"""The model's media inputs: a batch's media tensors and the positions of prompts that carry media.

Contract
- Qwen2-VL places image tokens on a 3-D (time, height, width) rotary grid (M-RoPE). `rope_positions`
  gives the (3, B, L) positions of left-padded prompts and each row's delta: text after the prompt
  sits at (index in the unpadded sequence + delta) on all three axes, so a plain 2-D position for
  completion tokens is exact once the delta is added. The rollout engine and the training forward
  both use it (through `media_positions`, which falls back to plain positions for models without
  M-RoPE, Qwen2-Audio), which keeps their logprobs equal for the same weights.
- `stack_media` concatenates a batch's per-row media dicts; `forward_media` moves them to the model's device;
  `mm_token_types` gives the token types a Qwen2-VL forward or generate() needs with media.
"""

from __future__ import annotations

from typing import Any

import torch

from backend.multimodal.media import MediaError


def stack_media(items: list[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor] | None:
    """Media of a batch, in row order (the model scatters image / video features into their tokens row by row),
    each kind concatenated over the rows that have it; None when no row has any."""
    rows = [m for m in items if m]
    if not rows:
        return None
    keys = dict.fromkeys(k for m in rows for k in m)  # image rows and video rows may mix in one batch
    return {k: torch.cat([m[k] for m in rows if k in m], 0) for k in keys}


def _vl_core(model: Any) -> Any:
    """The module that owns get_rope_index (Qwen2VLModel), through PEFT and ForConditionalGeneration wrappers."""
    todo, seen = [model], set()
    while todo:
        m = todo.pop(0)
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        if hasattr(m, "get_rope_index"):
            return m
        todo += [getattr(m, "base_model", None), getattr(m, "model", None)]
    raise MediaError(f"{type(model).__name__} takes no images (no M-RoPE position index)")


def mm_token_types(config: Any, ids: torch.Tensor) -> torch.Tensor:
    """transformers' mm_token_type_ids for token ids: 1 at image tokens, 2 at video tokens, else 0 (a
    Qwen2-VL forward or generate() needs them with media to compute M-RoPE positions)."""
    types = torch.zeros_like(ids, dtype=torch.int)
    types[ids == config.image_token_id] = 1
    types[ids == getattr(config, "video_token_id", -1)] = 2
    return types


def rope_positions(model: Any, ids: torch.Tensor, mask: torch.Tensor, media: dict[str, torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, B, L) M-RoPE positions of left-padded prompts with image tokens, and (B, 1) deltas:
    the position of a text token after the prompt is its unpadded index + delta."""
    core = _vl_core(model)
    types = mm_token_types(core.config, ids)
    return core.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=media.get("image_grid_thw"),
                               video_grid_thw=media.get("video_grid_thw"), attention_mask=mask)


def media_positions(model: Any, ids: torch.Tensor, mask: torch.Tensor, media: dict[str, torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt positions and (B, 1) deltas for a batch with media: M-RoPE for models that have it (Qwen2-VL),
    else plain positions that skip left padding, with delta 0 (Qwen2-Audio: audio tokens are ordinary positions)."""
    try:
        _vl_core(model)
    except MediaError:
        return (mask.cumsum(-1) - 1).clamp(min=0), torch.zeros((ids.shape[0], 1), dtype=torch.long, device=ids.device)
    return rope_positions(model, ids, mask, media)


def forward_media(media: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in media.items()}
