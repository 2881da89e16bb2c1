"""Completion logits of a policy for (prompt, completion) batches, the trainer's one forward pass.

GRPO batches hold G completions per prompt. With `group_size` the prompt runs through the model
once per group and its key/value cache is repeated G times for the completions, so prompt tokens
cost 1/G of a plain forward (gradients still flow into the prompt's activations through the
repeated cache). Without it, each sequence runs whole. Either way logits are only computed for
positions that predict completion tokens (the LM head over a 150k vocabulary is not cheap).
"""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache

from backend.rollout.hf import positions


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Mixed precision for fp32 master weights (full fine-tuning in bf16); a no-op when dtype is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def completion_logits(model, p_ids: torch.Tensor, p_mask: torch.Tensor, c_ids: torch.Tensor, c_mask: torch.Tensor,
                      group_size: int | None = None) -> torch.Tensor:
    """(B, Lc, V) logits whose position t predicts completion token t.

    p_ids/p_mask: (B, Lp) left padded; c_ids/c_mask: (B, Lc) right padded. With group_size G,
    rows b*G .. b*G+G-1 must share one prompt.
    """
    Lc = c_ids.shape[1]
    if group_size and group_size > 1 and p_ids.shape[0] % group_size == 0:
        G = group_size
        gp_ids, gp_mask = p_ids[::G], p_mask[::G]
        cache = DynamicCache()
        out = model(input_ids=gp_ids, attention_mask=gp_mask, position_ids=positions(gp_mask), past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        cache.batch_repeat_interleave(G)
        first = out.logits[:, -1:, :].repeat_interleave(G, dim=0)
        if Lc == 1:
            return first
        mask = torch.cat([p_mask, c_mask], 1)
        pos = positions(mask)[:, p_ids.shape[1]:]
        # the last completion token predicts nothing we score: feed tokens 0 .. Lc-2
        rest = model(input_ids=c_ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, :-1],
                     past_key_values=cache, use_cache=True).logits
        return torch.cat([first, rest], dim=1)
    ids = torch.cat([p_ids, c_ids], 1)
    mask = torch.cat([p_mask, c_mask], 1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False,
                   logits_to_keep=Lc + 1).logits
    return logits[:, :-1, :]
