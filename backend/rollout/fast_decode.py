"""Lean passes for Llama-family decoders (Qwen2, Llama): a prefill / training pass and a decode step.

transformers' forward costs several milliseconds of Python per call (mask building, cache objects, output
wrappers, hooks), which on small models is more than the arithmetic; decoding pays it once per token, training
once per micro-batch. `lean_layers` runs the model's own weight tensors (no copies) through the same operations
in the same order as its forward (fused RMSNorm, rotary embedding from the model's own module, scaled dot-product
attention with one boolean mask, MLP, head); it is differentiable, so the trainer's forward uses it too
(backend.train.forward). The hf engine prefills with it and decodes with `KVDecoder`: the cache as preallocated
tensors, the padding mask as one boolean table. The numbers are the model's up to float32 rounding
(tests/test_engine_hf.py and tests/test_forward.py compare against its forward). Anything it does not cover (other
architectures, sliding windows, wrapped or hooked models such as PEFT, ZeRO-3 or offloading, autocast) runs
through the model's forward.

The one switch: `lean_applies(model)` is what both the hf engine's decode and the trainer's forward ask, and
`set_lean(False)` turns the lean passes off process-wide, so everything runs the model's own forward. It exists
to compare the two paths (tests, benches) and to rule the lean passes out when a model misbehaves; it changes
speed, not results beyond float32 rounding.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch.utils.hooks import RemovableHandle

ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")

_lean = True  # the switch (module docstring): process-wide, as the passes it guards are module functions


def set_lean(enabled: bool) -> bool:
    """Turn the lean passes (decode and training forward) on or off process-wide; returns the previous setting, for
    a caller to restore."""
    global _lean
    before, _lean = _lean, enabled
    return before


def supports(model: torch.nn.Module) -> bool:
    """Whether `KVDecoder` reproduces this model's forward: a plain (unwrapped) Qwen2 / Llama causal LM with
    full attention in every layer and no tensor-parallel split."""
    cfg = getattr(model, "config", None)
    if type(model).__name__ not in ARCHITECTURES or cfg is None:
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    return all(t == "full_attention" for t in (getattr(cfg, "layer_types", None) or []))


def lean_applies(model: torch.nn.Module) -> bool:
    """Whether a lean pass runs for this model: the switch is on and the architecture is covered (`supports`). The
    callers add what only they know (autocast, media, hooks: backend.rollout.hf, backend.train.forward)."""
    return _lean and supports(model)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary tables for `rope`: cos as is, sin with its first half negated."""
    half = sin.shape[-1] // 2
    return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb, x * cos + rotate_half(x) * sin, bit for bit: rotate_half(x) is
    cat(-x2, x1) and (-a) * b == a * (-b) in floating point, so the sign moves into the table and the halves
    swap with one roll (fewer ops per call, forward and backward)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


_PLAIN: weakref.WeakKeyDictionary[torch.nn.Module, tuple[int, bool]] = weakref.WeakKeyDictionary()


def plain_modules(model: torch.nn.Module) -> bool:
    """No module carries a hook that its forward would run and a lean pass would skip (DeepSpeed ZeRO-3's
    parameter gathers, accelerate's offload, user hooks) and no parameter is a ZeRO-3 partition. Gradient
    checkpointing is not such a hook: lean_layers applies it itself. The module walk is cached per model until the
    next hook is registered anywhere (torch counts every registration), so it costs nothing per call; a hook
    removed later keeps the (safe) fallback."""
    registered = RemovableHandle.next_id
    hit = _PLAIN.get(model)
    if hit is not None and hit[0] == registered:
        return hit[1]
    plain = not any(_skipped_hooks(m) or m._forward_pre_hooks or hasattr(m, "_hf_hook") for m in model.modules())
    plain = plain and not any(hasattr(p, "ds_id") for p in model.parameters())
    _PLAIN[model] = (registered, plain)
    return plain


def _skipped_hooks(module: torch.nn.Module) -> list:
    """The module's forward hooks a lean pass would skip and that matter. transformers' gradient checkpointing adds
    one to the input embeddings that only marks their output as requiring grad, for reentrant checkpointing of a
    frozen embedding; lean_layers' checkpoints are not reentrant, so that one does not."""
    return [h for h in module._forward_hooks.values() if getattr(h, "__name__", "") != "make_inputs_require_grads"]


def _linear(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An nn.Linear's output without the module call (its hooks are excluded by plain_modules)."""
    return F.linear(x, module.weight, module.bias)


def _mlp(mlp: torch.nn.Module, h: torch.Tensor, silu: bool) -> torch.Tensor:
    """Qwen2MLP / LlamaMLP: down(act(gate(h)) * up(h))."""
    gate = _linear(mlp.gate_proj, h)
    return _linear(mlp.down_proj, (F.silu(gate) if silu else mlp.act_fn(gate)) * _linear(mlp.up_proj, h))


def rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """Qwen2RMSNorm / LlamaRMSNorm: normalised in float32, scaled in the input dtype (fused when float32)."""
    eps = norm.variance_epsilon
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return norm.weight * h.to(x.dtype)


def attend_mask(keys: torch.Tensor, causal_from: int, queries: int) -> torch.Tensor:
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


def lean_layers(model, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                 past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
                 ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Hidden states (B, L, H) before the final norm, and each layer's (keys, values) including `past`.
    The same operations in the same order as Qwen2Model / LlamaModel's forward with sdpa attention."""
    inner = model.model
    silu = getattr(model.config, "hidden_act", "") == "silu"
    x = F.embedding(ids, inner.embed_tokens.weight)
    cos, sin = rope_tables(*inner.rotary_emb(x, pos))
    cos, sin = cos[:, None], sin[:, None]
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    # the model's gradient checkpointing, in the lean pass: each layer's activations are recomputed in the backward
    recompute = torch.is_grad_enabled() and checkpointing(model)
    for i, layer in enumerate(inner.layers):
        p = None if past is None else past[i]
        if recompute:
            x, k, v = torch.utils.checkpoint.checkpoint(_layer, layer, x, cos, sin, mask, silu, p, use_reentrant=False)
        else:
            x, k, v = _layer(layer, x, cos, sin, mask, silu, p)
        kv.append((k, v))
    return x, kv


def _layer(layer: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
           silu: bool, past: tuple[torch.Tensor, torch.Tensor] | None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decoder layer of lean_layers: the hidden states after it and its keys and values (with `past`'s)."""
    attn, mlp = layer.self_attn, layer.mlp
    B, L, hd = x.shape[0], x.shape[1], attn.head_dim
    h = rms_norm(x, layer.input_layernorm)
    q = _linear(attn.q_proj, h).view(B, L, -1, hd).transpose(1, 2)
    k = _linear(attn.k_proj, h).view(B, L, -1, hd).transpose(1, 2)
    v = _linear(attn.v_proj, h).view(B, L, -1, hd).transpose(1, 2)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    if past is not None:
        k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=q.shape[1] != k.shape[1])
    x = x + _linear(attn.o_proj, o.transpose(1, 2).reshape(B, L, -1))
    x = x + _mlp(mlp, rms_norm(x, layer.post_attention_layernorm), silu)
    return x, k, v


def checkpointing(model: torch.nn.Module) -> bool:
    """Whether the model's gradient checkpointing is on (transformers marks its decoder layers, or the model)."""
    inner = model.model
    return bool(getattr(inner, "gradient_checkpointing", False)
                or any(getattr(layer, "gradient_checkpointing", False) for layer in inner.layers))


def lean_head(model, x: torch.Tensor) -> torch.Tensor:
    """Final norm and LM head: logits for the hidden states x."""
    return _linear(model.lm_head, rms_norm(x, model.model.norm))


class KVDecoder:
    """Decode state after a prefill: per-layer key/value buffers with room for `max_new` more positions.

    kv: each layer's prompt keys and values (P, kv_heads, W, head_dim) from `lean_layers`; mask (B, W) the rows'
    padding mask, B = P * n: each prompt's row repeated n times (a group shares its prompt), straight into the
    buffers without an intermediate copy. first (B, 1): the position of each row's first fed token; the rotary
    tables for all steps are computed here once (the same numbers per position as one step at a time)."""

    def __init__(self, model: torch.nn.Module, kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor,
                 max_new: int, first: torch.Tensor):
        self.model = model
        rows, width = mask.shape
        prompts = kv[0][0].shape[0]
        n = rows // prompts
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for k, v in kv:
            for src, dst in ((k, self.keys), (v, self.values)):
                heads, dim = src.shape[1], src.shape[3]
                buf = src.new_empty((rows, heads, width + max_new, dim))
                buf.view(prompts, n, heads, width + max_new, dim)[:, :, :, :width] = src[:, None]
                dst.append(buf)
        # attend[b, j]: may row b attend to position j (left padding is not; every generated position is)
        self.attend = torch.ones((rows, width + max_new), dtype=torch.bool, device=mask.device)
        self.attend[:, :width] = mask.bool()
        self.length = width
        self.fed = 0
        self.silu = getattr(model.config, "hidden_act", "") == "silu"
        pos = first + torch.arange(max_new, device=first.device)
        cos, sin = rope_tables(*model.model.rotary_emb(kv[0][0], pos))  # (B, max_new, head_dim), the keys' dtype
        self.cos, self.sin = cos[:, None], sin[:, None]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B,) at positions first + (tokens fed so far) -> next-token logits (B, V); appends the tokens'
        keys and values."""
        inner = self.model.model
        at, end = self.length, self.length + 1
        x = F.embedding(tokens[:, None], inner.embed_tokens.weight)
        cos, sin = self.cos[:, :, self.fed:self.fed + 1], self.sin[:, :, self.fed:self.fed + 1]
        batch = x.shape[0]
        attend = self.attend[:, None, None, :end]  # every layer's attention sees positions 0 .. end-1
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            hd = attn.head_dim
            h = rms_norm(x, layer.input_layernorm)
            q = _linear(attn.q_proj, h).view(batch, 1, -1, hd).transpose(1, 2)
            k = _linear(attn.k_proj, h).view(batch, 1, -1, hd).transpose(1, 2)
            self.values[i][:, :, at] = _linear(attn.v_proj, h).view(batch, -1, hd)
            q = rope(q, cos, sin)
            self.keys[i][:, :, at] = rope(k, cos, sin)[:, :, 0]
            keys, values = self.keys[i][:, :, :end], self.values[i][:, :, :end]
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=attend, scale=attn.scaling,
                                               enable_gqa=q.shape[1] != keys.shape[1])
            x = x + _linear(attn.o_proj, o.transpose(1, 2).reshape(batch, 1, -1))
            x = x + _mlp(layer.mlp, rms_norm(x, layer.post_attention_layernorm), self.silu)
        self.length, self.fed = end, self.fed + 1
        return lean_head(self.model, x)[:, -1]
