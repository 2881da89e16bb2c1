"""A lean decode step for Llama-family decoders (Qwen2, Llama): one new token per row, preallocated KV cache.

transformers' forward costs several milliseconds of Python per call (mask building, cache objects, output
wrappers, hooks), which on small models is more than the arithmetic; decoding pays it once per token. The hf
engine therefore prefills with the model's own forward and runs the decode steps through `KVDecoder`, which
calls the model's own modules (embedding, norms, projections, rotary embedding, MLP, head) in the same order as
its forward, with the cache as preallocated tensors and the padding mask as one boolean table. The numbers are
the model's (tests/test_engine_hf.py compares both paths and a plain forward pass). Anything it does not cover
(other architectures, sliding windows, wrapped models such as PEFT, autocast) decodes with the model's forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")


def supports(model: torch.nn.Module) -> bool:
    """Whether `KVDecoder` reproduces this model's forward: a plain (unwrapped) Qwen2 / Llama causal LM with
    full attention in every layer and no tensor-parallel split."""
    cfg = getattr(model, "config", None)
    if type(model).__name__ not in ARCHITECTURES or cfg is None:
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    return all(t == "full_attention" for t in (getattr(cfg, "layer_types", None) or []))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KVDecoder:
    """Decode state after a prefill: per-layer key/value buffers with room for `max_new` more positions."""

    def __init__(self, model: torch.nn.Module, cache: DynamicCache, mask: torch.Tensor, max_new: int):
        self.model = model
        batch, width = mask.shape
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for layer in cache.layers:
            for src, dst in ((layer.keys, self.keys), (layer.values, self.values)):
                buf = src.new_empty((batch, src.shape[1], width + max_new, src.shape[3]))
                buf[:, :, :width] = src
                dst.append(buf)
        # attend[b, j]: may row b attend to position j (left padding is not; every generated position is)
        self.attend = torch.ones((batch, width + max_new), dtype=torch.bool, device=mask.device)
        self.attend[:, :width] = mask.bool()
        self.length = width

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens (B,), positions (B, 1) -> next-token logits (B, V); appends the tokens' keys and values."""
        inner = self.model.model
        at, end = self.length, self.length + 1
        x = inner.embed_tokens(tokens[:, None])
        cos, sin = inner.rotary_emb(x, positions)
        cos, sin = cos[:, None], sin[:, None]
        mask = self.attend[:, None, None, :end]
        batch = x.shape[0]
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            self.values[i][:, :, at] = attn.v_proj(h).view(batch, -1, attn.head_dim)
            q = q * cos + rotate_half(q) * sin
            self.keys[i][:, :, at] = (k * cos + rotate_half(k) * sin)[:, :, 0]
            keys, values = self.keys[i][:, :, :end], self.values[i][:, :, :end]
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling,
                                               enable_gqa=q.shape[1] != keys.shape[1])
            x = x + attn.o_proj(o.transpose(1, 2).reshape(batch, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.length = end
        return self.model.lm_head(inner.norm(x))[:, -1]
