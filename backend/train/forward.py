"""Per-token logprobs of a policy for (prompt, completion) batches, the trainer's one forward pass.

The door is `PolicyLogps`: logprobs (and entropies) of any rows of a `Rollout`, for the policy, the reference
or the old-policy pass. It hides how: the shared-prompt packing, the lean pass and the LM head in slices.

GRPO batches hold G completions per prompt. With `group_size` the prompt runs through the model
once per group and its key/value cache is repeated G times for the completions, so prompt tokens
cost 1/G of a plain forward (gradients still flow into the prompt's activations through the
repeated cache). Without it, each sequence runs whole. Either way logits are only computed for
positions that predict completion tokens (the LM head over a 150k vocabulary is not cheap).

For plain Qwen2 / Llama models (`lean_supported`) the forward runs as a lean differentiable pass over the
model's own weight tensors (no copies: the optimizer, checkpoints and weight sync see the same parameters):
fused RMSNorm, F.scaled_dot_product_attention with one boolean mask, no cache objects or output wrappers, over
packed sequences (`packed_completion_logits`: a prompt once, then its group's completions without padding, in
one pass; the shared-prompt saving without the split's second pass).
transformers' forward costs several milliseconds of Python per call (mask building, hooks, wrappers), which on
small models is most of the training step. Everything else (PEFT / LoRA, images, sliding windows, attention
dropout in training, autocast, module hooks such as DeepSpeed ZeRO-3's or accelerate's
offload) runs through the model's forward. tests/test_forward.py checks logits and gradients against it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from backend.multimodal import forward_media, media_positions, stack_media
from backend.rollout.fast_decode import lean_applies, lean_head, lean_layers, plain_modules, rms_norm
from backend.rollout.hf import positions
from backend.train import grpo
from backend.train.batch import Rollout
from backend.train.token_logps import token_logps


def _prompt_positions(model, ids: torch.Tensor, mask: torch.Tensor, media: list | None
                      ) -> tuple[torch.Tensor, torch.Tensor | int, dict[str, torch.Tensor]]:
    """Prompt position ids, the offset of the text that follows (0 without images), and the media kwargs.
    With images the positions are Qwen2-VL's 3-D M-RoPE grid, exactly as the rollout engine computes them."""
    batch = stack_media(media) if media else None
    if batch is None:
        return positions(mask), 0, {}
    pos, delta = media_positions(model, ids, mask, batch)
    return pos, delta, forward_media(batch, ids.device)


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Mixed precision for fp32 master weights (full fine-tuning in bf16); a no-op when dtype is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def completion_logits(model, p_ids: torch.Tensor, p_mask: torch.Tensor, c_ids: torch.Tensor, c_mask: torch.Tensor,
                      group_size: int | None = None, media: list[dict[str, torch.Tensor] | None] | None = None,
                      head: bool = True) -> torch.Tensor:
    """(B, Lc, V) logits whose position t predicts completion token t; with head=False the final hidden states
    (B, Lc, H) the LM head would read there (for `chunked_head` models: token_logps applies the head in slices).

    p_ids/p_mask: (B, Lp) left padded; c_ids/c_mask: (B, Lc) right padded. With group_size G,
    rows b*G .. b*G+G-1 must share one prompt (and its images). `media`: each row's image inputs
    (backend.multimodal; None for a text row): the vision tower runs once per prompt on the shared path.
    """
    # plain Qwen2 / Llama: one lean packed pass (an empty prompt, images or a wrapped model: the forward below)
    if not media and lean_supported(model, p_ids.device) and bool((p_mask.sum(1) > 0).all()):
        G = group_size if group_size and p_ids.shape[0] % group_size == 0 else 1
        return packed_completion_logits(model, p_ids, p_mask, c_ids, c_mask, G, head)
    with contextlib.nullcontext() if head else _head_skipped(model):
        return _model_completion_logits(model, p_ids, p_mask, c_ids, c_mask, group_size, media)


def _model_completion_logits(model, p_ids: torch.Tensor, p_mask: torch.Tensor, c_ids: torch.Tensor, c_mask: torch.Tensor,
                             group_size: int | None, media: list[dict[str, torch.Tensor] | None] | None) -> torch.Tensor:
    """completion_logits through the model's own forward (under gradient checkpointing each sequence whole: the
    shared prompt's key/value cache is what checkpointing turns off)."""
    Lc, Lp = c_ids.shape[1], p_ids.shape[1]
    recompute = model.training and torch.is_grad_enabled() and getattr(model, "is_activation_checkpointing", False)
    if group_size and group_size > 1 and p_ids.shape[0] % group_size == 0 and not recompute:
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
    if ppos.dim() == 3:  # images, videos: the prompt's 3-D grid, then the completion's text positions on all three axes
        cpos = (pos[:, Lp:] + delta)[None].expand(3, -1, -1)
        pos = torch.cat([ppos, cpos], dim=2)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                   logits_to_keep=Lc + 1, **extra).logits
    return logits[:, -(Lc + 1):-1, :]  # some multimodal models (Qwen2-Audio) ignore logits_to_keep


# ---------------------------------------------------------------------------------------------- lean forward


def lean_supported(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether `packed_completion_logits` computes exactly what this model's forward computes: a plain Qwen2 /
    Llama causal LM (fast_decode.lean_applies: the switch and the architecture) with sdpa or eager attention, no
    autocast, no attention dropout while training and no hooks on any module (ZeRO-3
    gathers, accelerate offload and user hooks would be skipped)."""
    if not lean_applies(model) or torch.is_autocast_enabled(device.type):
        return False
    # flash-attention / flex kernels were chosen for memory at long lengths: the lean pass's dense mask is not that
    if getattr(model.config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return False
    # attention dropout acts in training (the attention modules read it; disable_dropout zeroes it there)
    if model.training and any(float(layer.self_attn.attention_dropout or 0.0) > 0 for layer in model.model.layers):
        return False
    return plain_modules(model)


PACK_TOKENS = 128  # completion tokens packed into one sequence at most: attention grows with its square


def rows_per_sequence(group_size: int, fed: int) -> int:
    """How many completions of a group share one packed sequence: the largest divisor k of the group size with
    k * fed <= PACK_TOKENS (fed: completion tokens fed per row), at least 1."""
    return max([k for k in range(1, group_size + 1) if group_size % k == 0 and k * fed <= PACK_TOKENS] or [1])


def packed_completion_logits(model, p_ids: torch.Tensor, p_mask: torch.Tensor, c_ids: torch.Tensor, c_mask: torch.Tensor,
                             group_size: int = 1, head: bool = True) -> torch.Tensor:
    """(B, Lc, V) completion logits from one lean pass over packed sequences, without padding.

    A sequence holds one prompt once, then the unpadded completions of k rows of its group one after another
    (rows_per_sequence), each fed without its last token (which predicts nothing scored). A boolean mask lets a
    completion token see the prompt and its own earlier tokens only, at the positions a plain forward gives it
    (prompt length + t), so every logit is the plain forward's; the prompt runs once per k rows instead of once
    per row, padded completion tokens not at all, and the whole batch is one pass over the weights (the shared-
    prompt split's second pass and its repeated cache are gone). Logits at padded completion positions (c_mask
    0) are finite and meaningless, as in the plain forward. Every prompt must have at least one token.
    head=False: the final norm's output instead of the logits (B, Lc, H)."""
    B, Lc = c_ids.shape
    Lp, dev = p_ids.shape[1], c_ids.device
    fed = (c_mask.sum(1) - 1).clamp(min=0)  # completion tokens fed per row
    k = rows_per_sequence(group_size, int(fed.max()))
    N = B // k  # packed sequences: rows n*k .. n*k+k-1 share prompt row n*k
    fed_s = fed.view(N, k)
    off = fed_s.cumsum(1) - fed_s  # each row's first packed token after its prompt
    plen = p_mask[::k].sum(1)  # (N,) prompt lengths (left padded)
    S = int((plen + fed_s.sum(1)).max())
    at = torch.arange(S, device=dev)[None].expand(N, S)
    # prompt tokens at packed slots 0 .. plen-1; -1 marks the prompt segment, -2 padding
    in_prompt = at < plen[:, None]
    ids = torch.where(in_prompt, p_ids[::k].gather(1, (Lp - plen[:, None] + at).clamp(0, Lp - 1)), 0)
    seg = torch.where(in_prompt, -1, -2)
    pos = at.clone()
    # completion token t of row r = n*k + j at slot plen[n] + off[n, j] + t, position plen[n] + t
    t = torch.arange(Lc, device=dev)[None].expand(B, Lc)
    live = t < fed[:, None]
    row_seq = torch.arange(B, device=dev) // k
    slot = plen[row_seq][:, None] + off.reshape(B)[:, None] + t
    flat = (row_seq[:, None] * S + slot)[live]
    ids = ids.reshape(-1).index_put((flat,), c_ids[live]).view(N, S)
    seg = seg.reshape(-1).index_put((flat,), (torch.arange(B, device=dev) % k)[:, None].expand(B, Lc)[live]).view(N, S)
    pos = pos.reshape(-1).index_put((flat,), (plen[row_seq][:, None] + t)[live]).view(N, S)
    causal = at[:, None, :] <= at[:, :, None]  # [n, query, key]
    same = (seg[:, None, :] == -1) | (seg[:, None, :] == seg[:, :, None])
    pad = seg == -2
    mask = (causal & same & ~pad[:, None, :]) | (pad[:, :, None] & (at[:, None, :] == at[:, :, None]))
    hidden, _ = lean_layers(model, ids, pos, mask[:, None])
    # logit t of row r comes from the token before it: the prompt's last for t = 0, completion token t-1 after
    src = torch.where(t == 0, plen[row_seq][:, None] - 1, slot - 1)
    src = torch.where((t == 0) | (t - 1 < fed[:, None]), src, plen[row_seq][:, None] - 1)  # unscored: any finite
    x = hidden.reshape(N * S, -1)[row_seq[:, None] * S + src]
    return lean_head(model, x) if head else rms_norm(x, model.model.norm)


# ---------------------------------------------------------------------------------------------- the door

# config fields of models whose logits are more than the LM head's product (scaled or soft-capped afterwards)
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def chunked_head(model) -> bool:
    """Whether the LM head may be applied in slices outside the model's forward (token_logps): a plain nn.Linear
    (not a LoRA-wrapped head), whole on this rank (not a ZeRO-3 partition), and nothing done to its output."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or hasattr(head.weight, "ds_id"):
        return False
    configs = [model.config, getattr(model.config, "text_config", None)]
    return not any(getattr(c, k, None) for c in configs if c is not None for k in _LOGIT_POSTPROCESSING)


@contextlib.contextmanager
def _head_skipped(model):
    """The model's forward returns the hidden states its LM head would read, in place of the logits (the head's
    module hooks still run)."""
    head = model.get_output_embeddings()
    head.forward = lambda x: x
    try:
        yield
    finally:
        del head.forward


def rows_of(media: list | None, sl: slice | torch.Tensor) -> list | None:
    """The per-row image inputs of the rows `sl` selects (a slice or an index tensor); None for text batches."""
    if media is None:
        return None
    return media[sl] if isinstance(sl, slice) else [media[i] for i in sl.tolist()]


@dataclass(frozen=True)
class TokenLogps:
    logps: torch.Tensor  # (B, Lc) log p(completion token) at the sampling temperature
    entropies: torch.Tensor | None  # (B, Lc) when asked for


class PolicyLogps:
    """Per-token logprobs of rollout rows under a model, at the run's temperature, on `device`, under autocast
    when `autocast_dtype` is set. Rows of whole groups share their prompt's pass (the lean pass packs them; the
    model's forward shares the prompt's cache unless gradient checkpointing turns the cache off)."""

    def __init__(self, device: torch.device, autocast_dtype: torch.dtype | None, temperature: float,
                 group_size: int | None, chunk_tokens: int = 0):
        self.device, self.autocast_dtype, self.temperature, self.group_size = device, autocast_dtype, temperature, group_size
        self.chunk_tokens = chunk_tokens  # tokens per LM-head slice (0: sized from the vocabulary, footprint.auto_chunk)

    def __call__(self, model, ro: Rollout, rows: slice | torch.Tensor, want_entropy: bool = False,
                 entropy_grad: bool = False) -> TokenLogps:
        """Logprobs of the rows `rows` selects (a slice, or an index tensor of whole groups); entropies when
        wanted, with a gradient only for an entropy bonus."""
        return self._run(model, ro, rows, self.group_size, want_entropy, entropy_grad)

    def _run(self, model, ro: Rollout, rows: slice | torch.Tensor, group: int | None, want_entropy: bool,
             entropy_grad: bool) -> TokenLogps:
        d = self.device
        p_ids, p_mask = ro.prompt_ids[rows].to(d), ro.prompt_mask[rows].to(d)
        c_ids, c_mask = ro.completion_ids[rows].to(d), ro.completion_mask[rows].to(d)
        media = rows_of(ro.media, rows)
        if chunked_head(model):  # the LM head over slices of the sampled tokens: no [tokens x vocabulary] tensor kept
            with autocast(d, self.autocast_dtype):
                hidden = completion_logits(model, p_ids, p_mask, c_ids, c_mask, group, media=media, head=False)
                at = c_mask.bool()
                lm = model.get_output_embeddings()
                lp, ent = token_logps(hidden[at], lm.weight, lm.bias, c_ids[at], self.temperature, want_entropy,
                                      self.chunk_tokens, entropy_grad)
            logps = hidden.new_zeros(c_ids.shape, dtype=lp.dtype).masked_scatter(at, lp)
            return TokenLogps(logps, None if ent is None else hidden.new_zeros(c_ids.shape, dtype=ent.dtype).masked_scatter(at, ent))
        with autocast(d, self.autocast_dtype):
            logits = completion_logits(model, p_ids, p_mask, c_ids, c_mask, group, media=media)
        logits = logits.float() / self.temperature
        logps = grpo.selective_log_softmax(logits, c_ids)
        ent = None
        if want_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = grpo.token_entropy(logits)
        return TokenLogps(logps, ent)
