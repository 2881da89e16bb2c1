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
import torch.nn.functional as F
from transformers import DynamicCache

from backend.multimodal import forward_media, rope_positions, stack_media
from backend.rollout.fast_decode import rotate_half, supports
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
    for m in model.modules():
        if m._forward_hooks or m._forward_pre_hooks or hasattr(m, "_hf_hook"):
            return False
        if model.training and getattr(m, "gradient_checkpointing", False):
            return False
        if model.training and isinstance(m, torch.nn.Dropout) and m.p > 0:
            return False
    return not any(hasattr(p, "ds_id") for p in model.parameters())  # DeepSpeed ZeRO-3 partitions


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """Qwen2RMSNorm / LlamaRMSNorm: normalised in float32, scaled in the input dtype (fused when float32)."""
    eps = norm.variance_epsilon
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return norm.weight * h.to(x.dtype)


def _attend_mask(keys: torch.Tensor, causal_from: int, queries: int) -> torch.Tensor:
    """(B, 1, Q, K) boolean: query i (at key index causal_from + i) sees valid keys at or before it. A query that
    would see nothing (a left-padding position) sees itself, so no row is all-masked (NaN); such rows are padding
    and never scored."""
    K = keys.shape[1]
    q_at = torch.arange(causal_from, causal_from + queries, device=keys.device)
    k_at = torch.arange(K, device=keys.device)
    allowed = (k_at[None, :] <= q_at[:, None])[None] & keys[:, None, :].bool()
    empty = ~allowed.any(-1, keepdim=True)
    allowed = allowed | (empty & (k_at[None, :] == q_at[:, None])[None])
    return allowed[:, None]


def _lean_layers(model, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                 past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
                 ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Hidden states (B, L, H) before the final norm, and each layer's (keys, values) including `past`.
    The same operations in the same order as Qwen2Model / LlamaModel's forward with sdpa attention."""
    inner = model.model
    silu = getattr(model.config, "hidden_act", "") == "silu"
    x = F.embedding(ids, inner.embed_tokens.weight)
    cos, sin = inner.rotary_emb(x, pos)
    cos, sin = cos[:, None], sin[:, None]
    B, L = ids.shape
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        hd = attn.head_dim
        h = _rms_norm(x, layer.input_layernorm)
        q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(B, L, -1, hd).transpose(1, 2)
        k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(B, L, -1, hd).transpose(1, 2)
        v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(B, L, -1, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat([past[i][0], k], 2), torch.cat([past[i][1], v], 2)
        kv.append((k, v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling,
                                           enable_gqa=q.shape[1] != k.shape[1])
        x = x + F.linear(o.transpose(1, 2).reshape(B, L, -1), attn.o_proj.weight, attn.o_proj.bias)
        h = _rms_norm(x, layer.post_attention_layernorm)
        gate = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)
        gate = F.silu(gate) if silu else mlp.act_fn(gate)
        x = x + F.linear(gate * F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias), mlp.down_proj.weight,
                         mlp.down_proj.bias)
    return x, kv


def _head(model, x: torch.Tensor) -> torch.Tensor:
    return F.linear(_rms_norm(x, model.model.norm), model.lm_head.weight, model.lm_head.bias)


def lean_completion_logits(model, p_ids: torch.Tensor, p_mask: torch.Tensor, c_ids: torch.Tensor,
                           c_mask: torch.Tensor, group_size: int | None = None) -> torch.Tensor:
    """`completion_logits` for a model that `lean_supported` accepts (text only); same shapes, same numbers."""
    Lc, Lp = c_ids.shape[1], p_ids.shape[1]
    mask = torch.cat([p_mask, c_mask], 1)
    pos = positions(mask)
    if group_size and group_size > 1 and p_ids.shape[0] % group_size == 0:
        G = group_size
        gp_mask = p_mask[::G]
        x, kv = _lean_layers(model, p_ids[::G], pos[::G, :Lp], _attend_mask(gp_mask, 0, Lp))
        first = x[:, -1:].repeat_interleave(G, dim=0)
        if Lc == 1:
            return _head(model, first)
        past = [(k.repeat_interleave(G, dim=0), v.repeat_interleave(G, dim=0)) for k, v in kv]
        # the last completion token predicts nothing we score: feed tokens 0 .. Lc-2
        rest, _ = _lean_layers(model, c_ids[:, :-1], pos[:, Lp:-1], _attend_mask(mask[:, :-1], Lp, Lc - 1), past)
        return _head(model, torch.cat([first, rest], dim=1))
    ids = torch.cat([p_ids, c_ids], 1)
    x, _ = _lean_layers(model, ids[:, :-1], pos[:, :-1], _attend_mask(mask[:, :-1], 0, Lp + Lc - 1))
    return _head(model, x[:, Lp - 1:])
