"""Per-token log-probabilities and entropies straight from hidden states, a slice of tokens at a time.

Why: a real vocabulary has ~150k entries. `[tokens x vocabulary]` float32 logits for a GRPO micro-batch
(32 completions x 1k tokens) are 20 GB, and autograd keeps them, their log-softmax and its gradient. Here the
LM head runs over `chunk` tokens at a time; for each slice only what the loss needs is kept (the token's
logprob, the entropy, and the log-sum-exp for the backward), and the backward recomputes the slice's logits
(one extra head product per slice) instead of storing them. Peak extra memory is `chunk x vocabulary` floats
whatever the batch, and the numbers equal the unchunked `log_softmax(h W^T / T)` computation up to float
rounding (tests/test_token_logps.py checks values and gradients against it).

`token_logps(hidden, weight, bias, targets, temperature, want_entropy, chunk, entropy_grad)`:
hidden (N, H), weight (V, H) (the LM head's; tied embeddings are the same tensor), bias (V,) or None,
targets (N,) -> logps (N,) and entropies (N,) or None. With `entropy_grad` False the entropies carry no gradient
(the loss has no entropy bonus), and the backward skips their term.
"""

from __future__ import annotations

import contextlib

import torch

from backend.footprint import auto_chunk  # the slice size is the memory model's (the planner counts the same)


class _ChunkedTokenLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, want_entropy: bool, chunk: int, entropy_grad: bool):
        N, dt = hidden.shape[0], _acc(hidden)
        logps = hidden.new_empty(N, dtype=dt)
        ent = hidden.new_empty(N, dtype=dt) if want_entropy else None
        lse = hidden.new_empty(N, dtype=dt)
        for s in range(0, N, chunk):
            z = _logits(hidden[s:s + chunk], weight, bias, temperature)
            lse[s:s + chunk] = torch.logsumexp(z, dim=-1)
            logps[s:s + chunk] = z.gather(-1, targets[s:s + chunk, None]).squeeze(-1) - lse[s:s + chunk]
            if ent is not None:
                p = (z - lse[s:s + chunk, None]).exp_()
                ent[s:s + chunk] = lse[s:s + chunk] - (p * z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent if ent is not None else lse.new_empty(0))
        ctx.temperature, ctx.chunk, ctx.entropy_grad = temperature, chunk, entropy_grad and want_entropy
        kind = hidden.device.type  # the backward recomputes the slices' logits under the forward's autocast
        ctx.amp = (kind, torch.get_autocast_dtype(kind)) if torch.is_autocast_enabled(kind) else None
        ctx.mark_non_differentiable(lse)
        return logps, (ent if ent is not None else lse.new_empty(0)), lse

    @staticmethod
    def backward(ctx, g_logps: torch.Tensor, g_ent: torch.Tensor, _g_lse: torch.Tensor):
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        T, chunk = ctx.temperature, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        g_h = torch.zeros_like(hidden) if need_h else None
        g_w = torch.zeros(weight.shape, dtype=_acc(weight), device=weight.device) if need_w else None
        g_b = torch.zeros(bias.shape, dtype=_acc(bias), device=bias.device) if need_b else None
        with_ent = ctx.entropy_grad and g_ent is not None and g_ent.numel() > 0
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk]
            with torch.autocast(*ctx.amp) if ctx.amp else contextlib.nullcontext():
                z = _logits(h, weight, bias, T)
            # in place on the recomputed slice: each [chunk x vocabulary] temporary is a pass over memory
            logp = z.sub_(lse[s:s + chunk, None])
            p = logp.exp() if with_ent else logp.exp_()
            # d logp_target / dz = onehot - p
            dz = p.mul_(-g_logps[s:s + chunk, None])
            dz.scatter_add_(-1, targets[s:s + chunk, None], g_logps[s:s + chunk, None].to(dz.dtype))
            if with_ent:  # H = -sum p log p: dH/dz = -p (log p + H); p is dz / -g here, so recompute it
                q = logp.exp()
                dz -= q.mul_(logp.add_(ent[s:s + chunk, None])).mul_(g_ent[s:s + chunk, None])
            if T != 1.0:
                dz /= T  # z = logits / T
            if g_h is not None:
                g_h[s:s + chunk] = (dz @ weight.to(dz.dtype)).to(hidden.dtype)
            if g_w is not None:
                g_w += dz.t() @ h.to(dz.dtype)
            if g_b is not None:
                g_b += dz.sum(0)
        return (g_h, None if g_w is None else g_w.to(weight.dtype), None if g_b is None else g_b.to(bias.dtype),
                None, None, None, None, None)


def _acc(t: torch.Tensor) -> torch.dtype:
    """The dtype sums and softmaxes run in: float32, or the input's when wider."""
    return torch.promote_types(t.dtype, torch.float32)


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    z = torch.nn.functional.linear(h, weight, bias)
    z = z.to(_acc(z))
    return z / temperature if temperature != 1.0 else z


def token_logps(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float = 1.0, want_entropy: bool = False, chunk: int = 0,
                entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of `targets` (and entropies) under softmax(hidden W^T + b) / T, `chunk` tokens at a time
    (0: footprint.auto_chunk for W's vocabulary)."""
    chunk = chunk or auto_chunk(weight.shape[0])
    logps, ent, _ = _ChunkedTokenLogps.apply(hidden, weight, bias, targets, float(temperature), want_entropy, chunk,
                                             entropy_grad and torch.is_grad_enabled())
    if not want_entropy:
        return logps, None
    return logps, ent if entropy_grad and torch.is_grad_enabled() else ent.detach()
