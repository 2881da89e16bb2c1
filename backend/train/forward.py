"""Completion logits of a policy for (prompt, completion) batches, the trainer's one forward pass.

GRPO batches hold G completions per prompt. With `group_size` the prompt runs through the model
once per group and its key/value cache is repeated G times for the completions, so prompt tokens
cost 1/G of a plain forward (gradients still flow into the prompt's activations through the
repeated cache). Without it, each sequence runs whole. Either way logits are only computed for
positions that predict completion tokens (the LM head over a 150k vocabulary is not cheap).

For plain Qwen2 / Llama models (`lean_supported`) the forward runs as a lean differentiable pass over the
model's own weight tensors (no copies: the optimizer, checkpoints and weight sync see the same parameters):
fused RMSNorm, F.scaled_dot_product_attention with one boolean mask, no cache objects or output wrappers.
transformers' forward costs several milliseconds of Python per call (mask building, hooks, wrappers), which on
small models is most of the training step. Everything else (PEFT / LoRA, images, sliding windows, attention
dropout in training, gradient checkpointing, autocast, module hooks such as DeepSpeed ZeRO-3's or accelerate's
offload) runs through the model's forward. tests/test_forward.py checks logits and gradients against it.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache

from backend.multimodal import forward_media, rope_positions, stack_media
from backend.rollout.fast_decode import attend_mask, lean_head, lean_layers, plain_modules, supports
from backend.rollout.hf import positions


def _prompt_positions(model, ids: torch.Tensor, mask: torch.Tensor, media: list | None
                      ) -> tuple[torch.Tensor, torch.Tensor | int, dict[str, torch.Tensor]]:
    """Prompt position ids, the offset of the text that follows (0 without images), and the media kwargs.
    With images the positions are Qwen2-VL's 3-D M-RoPE grid, exactly as the rollout engine computes them."""
    batch = stack_media(media) if media else None
    if batch is None:
        return positions(mask), 0, {}
    pos, delta = rope_positions(model, ids, mask, batch)
    return pos, delta, forward_media(batch, ids.device)


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Mixed precision for fp32 master weights (full fine-tuning in bf16); a no-op when dtype is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def completion_logits(model, p_ids: torch.Tensor, p_mask: torch.Tensor, c_ids: torch.Tensor, c_mask: torch.Tensor,
                      group_size: int | None = None, media: list[dict[str, torch.Tensor] | None] | None = None
                      ) -> torch.Tensor:
    """(B, Lc, V) logits whose position t predicts completion token t.

    p_ids/p_mask: (B, Lp) left padded; c_ids/c_mask: (B, Lc) right padded. With group_size G,
    rows b*G .. b*G+G-1 must share one prompt (and its images). `media`: each row's image inputs
    (backend.multimodal; None for a text row): the vision tower runs once per prompt on the shared path.
    """
    Lc, Lp = c_ids.shape[1], p_ids.shape[1]
    if not media and lean_supported(model, p_ids.device):
        return lean_completion_logits(model, p_ids, p_mask, c_ids, c_mask, group_size)
    if group_size and group_size > 1 and p_ids.shape[0] % group_size == 0:
        G = group_size
        gp_ids, gp_mask = p_ids[::G], p_mask[::G]
        gpos, delta, extra = _prompt_positions(model, gp_ids, gp_mask, media[::G] if media else None)
        cache = DynamicCache()
        out = model(input_ids=gp_ids, attention_mask=gp_mask, position_ids=gpos, past_key_values=cache,
                    use_cache=True, logits_to_keep=1, **extra)
        cache = out.past_key_values
        cache.batch_repeat_interleave(G)
        first = out.logits[:, -1:, :].repeat_interleave(G, dim=0)
        if Lc == 1:
            return first
        mask = torch.cat([p_mask, c_mask], 1)
        if isinstance(delta, torch.Tensor):
            delta = delta.repeat_interleave(G, dim=0)
        pos = positions(mask)[:, Lp:] + delta
        # the last completion token predicts nothing we score: feed tokens 0 .. Lc-2
        rest = model(input_ids=c_ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, :-1],
                     past_key_values=cache, use_cache=True).logits
        return torch.cat([first, rest], dim=1)
    ids = torch.cat([p_ids, c_ids], 1)
    mask = torch.cat([p_mask, c_mask], 1)
    ppos, delta, extra = _prompt_positions(model, p_ids, p_mask, media)
    pos = positions(mask)
    if extra:  # images: the prompt's 3-D grid, then the completion's text positions on all three axes
        cpos = (pos[:, Lp:] + delta)[None].expand(3, -1, -1)
        pos = torch.cat([ppos, cpos], dim=2)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                   logits_to_keep=Lc + 1, **extra).logits
    return logits[:, :-1, :]


# ---------------------------------------------------------------------------------------------- lean forward


def lean_supported(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether `lean_completion_logits` computes exactly what this model's forward computes: a plain Qwen2 /
    Llama causal LM (fast_decode.supports), no autocast, no gradient checkpointing, no attention dropout while
    training, and no hooks on any module (ZeRO-3 gathers, accelerate offload, user hooks would be skipped)."""
    if not supports(model) or torch.is_autocast_enabled(device.type):
        return False
    if model.training and float(getattr(model.config, "attention_dropout", 0.0) or 0.0) > 0:
        return False
    if model.training and any(getattr(m, "gradient_checkpointing", False) or (isinstance(m, torch.nn.Dropout) and m.p > 0)
                              for m in model.modules()):
        return False
    return plain_modules(model)


def lean_completion_logits(model, p_ids: torch.Tensor, p_mask: torch.Tensor, c_ids: torch.Tensor,
                           c_mask: torch.Tensor, group_size: int | None = None) -> torch.Tensor:
    """`completion_logits` for a model that `lean_supported` accepts (text only); same shapes, same numbers."""
    Lc, Lp = c_ids.shape[1], p_ids.shape[1]
    mask = torch.cat([p_mask, c_mask], 1)
    pos = positions(mask)
    if group_size and group_size > 1 and p_ids.shape[0] % group_size == 0:
        G = group_size
        gp_mask = p_mask[::G]
        x, kv = lean_layers(model, p_ids[::G], pos[::G, :Lp], attend_mask(gp_mask, 0, Lp))
        first = x[:, -1:].repeat_interleave(G, dim=0)
        if Lc == 1:
            return lean_head(model, first)
        past = [(k.repeat_interleave(G, dim=0), v.repeat_interleave(G, dim=0)) for k, v in kv]
        # the last completion token predicts nothing we score: feed tokens 0 .. Lc-2
        rest, _ = lean_layers(model, c_ids[:, :-1], pos[:, Lp:-1], attend_mask(mask[:, :-1], Lp, Lc - 1), past)
        return lean_head(model, torch.cat([first, rest], dim=1))
    ids = torch.cat([p_ids, c_ids], 1)
    x, _ = lean_layers(model, ids[:, :-1], pos[:, :-1], attend_mask(mask[:, :-1], 0, Lp + Lc - 1))
    return lean_head(model, x[:, Lp - 1:])
