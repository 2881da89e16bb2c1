"""Transformers rollout engine: batched sampling with a KV cache, for CPU and debugging on GPU.

Each prompt is prefilled once and its cache repeated n times (a group shares its prompt),
then all sequences decode together until every one has produced EOS or hit max_tokens.
The loop is hand-written rather than `model.generate` because it also returns the sampling
policy's per-token logprobs at no extra cost and has less per-token overhead on tiny models.
For Llama-family models the prefill and the decode steps skip transformers' per-call machinery (fast_decode).
An activation tape (the rollout's linear outputs, replayed by the training forward) paid 1.05-1.06x end to end
on a quiet host and was removed (bench/RESULTS.md). torch.compile of the decode step was measured and left out:
on this CPU it cost 140 s of compilation (2 busy cores) to save about 15% of a preset rollout, which no short run
pays back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from backend.multimodal import forward_media, media_positions, placeholder_ids, stack_media
from backend.rollout.base import Completion, PromptInput, RolloutEngine, SamplingParams, group_seeds
from backend.rollout.fast_decode import KVDecoder, attend_mask, lean_applies, lean_head, lean_layers, plain_modules


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside top-k and outside the top-p nucleus with -inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (always keep the first)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(-1, idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator | list[torch.Generator | None] | None,
                never: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its logprob under logits / T (before filtering, as the trainer scores it).

    Greedy (top_k = 1) is an argmax; top-k / top-p filter first; unfiltered sampling draws straight from the
    logits (inverse_cdf), whose cumulative sum also gives the log-sum-exp the logprob needs, so no log-softmax
    or probability tensor is made. `never`: token ids never sampled (a VLM's image placeholders), a filter like
    top-k, so the reported logprob stays unfiltered. `gen` a list: one generator per group of sp.n consecutive
    rows (per-group seeds, see base.group_seeds).
    """
    z = logits if sp.temperature == 1.0 else logits / sp.temperature  # x / 1 == x
    pick = z if never is None else z.index_fill(-1, never, float("-inf"))
    groups = gen if isinstance(gen, list) else [gen]
    if sp.top_k == 1:
        nxt, lse = pick.argmax(-1), torch.logsumexp(z, -1)
    elif sp.top_k or sp.top_p < 1.0 or never is not None:
        nxt, _ = inverse_cdf(filter_logits(pick, sp.top_k, sp.top_p), groups, len(z) // len(groups))
        lse = torch.logsumexp(z, -1)
    else:
        nxt, lse = inverse_cdf(z, groups, len(z) // len(groups))
    return nxt, z.gather(-1, nxt[:, None]).squeeze(-1) - lse


def inverse_cdf(scores: torch.Tensor, gens: list[torch.Generator | None], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row, drawn exactly from softmax(scores) (B, V; -inf = never), and each row's log-sum-exp.

    The row's cumulative sum of exp(scores - max) (float64) is inverted at a uniform draw; rows p*n .. p*n+n-1
    draw from group p's generator, so a group samples the same tokens whatever else is in the batch (how a batch
    is split over workers or chunks does not matter). One random number per row: the exponential race drew one
    per vocabulary entry, which at 151,936 entries cost 5-9x the decode step's LM head product on CPU, and
    torch.multinomial as much; three passes over the logits (max, exp, cumsum) where log-softmax, exp and the
    draw took five."""
    top = scores.amax(-1, keepdim=True)
    cdf = (scores - top).exp_().double().cumsum_(-1)
    total = cdf[:, -1:]
    u = torch.cat([torch.rand(n, generator=g, dtype=torch.float64, device=scores.device) for g in gens])
    picked = torch.searchsorted(cdf, u[:, None] * total, right=True).squeeze(-1)
    lse = (top + total.log().to(scores.dtype)).squeeze(-1)
    return picked.clamp_(max=scores.shape[-1] - 1), lse  # u * total reaches the total only at float64's last bit


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding, as in training."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


class HFEngine(RolloutEngine):
    """Sampling with a transformers model in this process (the lean decode where fast_decode.lean_applies)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_batch: int = 0,
                 autocast_dtype: torch.dtype | None = None):
        self.model = model
        self.autocast_dtype = autocast_dtype
        self.tok = tokenizer
        self.max_batch = max_batch  # sequences decoded together; 0 = all at once
        # an in-process peft model is sampled as it is: weights come with peft's names
        self.keeps_peft_names = hasattr(model, "peft_config")
        self.eos_ids = set(_eos_ids(model, tokenizer))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))
        # a sampled image placeholder would be read as an image slot by the training forward: never sample one
        never = placeholder_ids(model.config)
        self.never = torch.tensor(never, device=next(model.parameters()).device) if never else None

    def shares(self, model: Any) -> bool:
        return self.model is model

    @torch.no_grad()
    def generate(self, prompts: list[PromptInput], sampling: SamplingParams) -> list[list[Completion]]:
        prompts = group_seeds(prompts, sampling)  # seeds per group: chunking does not change the samples
        if not self.max_batch:
            return self._generate(prompts, sampling)
        per_chunk = max(1, self.max_batch // sampling.n)
        out: list[list[Completion]] = []
        for i in range(0, len(prompts), per_chunk):
            out.extend(self._generate(prompts[i:i + per_chunk], sampling))
        return out

    def _generate(self, prompts: list[PromptInput], sp: SamplingParams) -> list[list[Completion]]:
        if self.autocast_dtype is None:
            return self._decode(prompts, sp)
        device = next(self.model.parameters()).device
        with torch.autocast(device_type=device.type, dtype=self.autocast_dtype):
            return self._decode(prompts, sp)

    def _decode(self, prompts: list[PromptInput], sp: SamplingParams) -> list[list[Completion]]:
        model = self.model
        device = next(model.parameters()).device
        # one generator per group, so a group samples the same tokens whatever else is in the batch
        gen = [None if p.seed is None else torch.Generator(device=device).manual_seed(p.seed) for p in prompts]

        ids, mask = left_pad([p.token_ids for p in prompts], self.pad_id)
        ids, mask = ids.to(device), mask.to(device)
        media = stack_media([p.multi_modal for p in prompts])
        extra: dict[str, torch.Tensor] = {}
        # the lean passes read no training flag (they have no dropout): only the model's own forward needs eval
        # mode, and toggling it walks every module, a cost per rollout comparable to a decode step on tiny models
        lean_ok = self.autocast_dtype is None and media is None and lean_applies(model) \
            and plain_modules(model)
        was_training = model.training and not lean_ok
        if was_training:
            model.eval()
        if media is None:
            prefill_pos, delta = positions(mask), torch.zeros((len(prompts), 1), dtype=torch.long, device=device)
        else:  # images, videos: M-RoPE positions; text after the prompt is offset by each row's delta (audio: 0)
            prefill_pos, delta = media_positions(model, ids, mask, media)
            extra = forward_media(media, device)
        lean, kv = None, None
        cache = DynamicCache()
        if lean_ok:
            hidden, kv = lean_layers(model, ids, prefill_pos, attend_mask(mask, 0, ids.shape[1]))
            logits = lean_head(model, hidden[:, -1]).float()
        else:
            out = model(input_ids=ids, attention_mask=mask, position_ids=prefill_pos, past_key_values=cache,
                        use_cache=True, logits_to_keep=1, **extra)  # only the last position samples: no B x Lp x V
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()
        if sp.n > 1:
            if kv is None:
                cache.batch_repeat_interleave(sp.n)
            logits = logits.repeat_interleave(sp.n, dim=0)
            mask = mask.repeat_interleave(sp.n, dim=0)
            delta = delta.repeat_interleave(sp.n, dim=0)
        batch = mask.shape[0]
        pos = mask.sum(-1, keepdim=True) - 1 + delta.to(device)  # last prompt position per row
        if kv is not None and sp.max_tokens > 1:  # the prompt rows repeated n times into the decode buffers
            lean = KVDecoder(model, kv, mask, sp.max_tokens, pos + 1)

        eos = torch.tensor(sorted(self.eos_ids), device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        # the attention mask for every step at once: step s passes a view of its first width + s columns
        width = mask.shape[1]
        full_mask = torch.cat([mask, mask.new_ones((batch, sp.max_tokens))], dim=1)
        # "all done?" reads the device: every step on CPU (free), every few steps on GPU (a sync stalls its queue;
        # the extra steps only append padding to finished rows)
        check_every = 1 if device.type == "cpu" else 8
        pad = torch.full((batch,), self.pad_id, dtype=torch.long, device=device)
        # preallocated: a small tensor kept per step would pin the heap between the steps' [rows x vocabulary]
        # blocks, which glibc then cannot reuse (with backend.train.memory's settings the process grew by one such
        # block per step: 19 MB at 32 rows x 151,936)
        tokens = torch.full((batch, sp.max_tokens), self.pad_id, dtype=torch.long, device=device)
        logps = torch.zeros((batch, sp.max_tokens), dtype=torch.float32, device=device)
        steps = 0
        for step in range(sp.max_tokens):
            nxt, lp = sample_next(logits, sp, gen, self.never)
            nxt = torch.where(done, pad, nxt)
            tokens[:, step], logps[:, step] = nxt, lp
            steps = step + 1
            done = done | torch.isin(nxt, eos)
            if step == sp.max_tokens - 1 or ((step + 1) % check_every == 0 and bool(done.all())):
                break
            pos = pos + 1
            if lean is not None:
                logits = lean.step(nxt).float()
                continue
            out = model(input_ids=nxt[:, None], attention_mask=full_mask[:, :width + step + 1], position_ids=pos,
                        past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()
        if was_training:
            model.train()

        tok_mat = tokens[:, :steps].tolist()
        lp_mat = logps[:, :steps].tolist()
        results: list[list[Completion]] = []
        for p in range(len(prompts)):
            group = []
            for j in range(sp.n):
                row = p * sp.n + j
                seq, lps = tok_mat[row], lp_mat[row]
                end = next((k for k, t in enumerate(seq) if t in self.eos_ids), None)
                if end is None:
                    group.append(Completion(seq, self.tok.decode(seq, skip_special_tokens=True), "length", lps))
                else:
                    kept = seq[: end + 1]
                    group.append(Completion(kept, self.tok.decode(kept, skip_special_tokens=True), "stop",
                                            lps[: end + 1]))
            results.append(group)
        return results

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int = 0,
                       adapter: dict[str, Any] | None = None) -> None:
        if adapter is not None:
            raise ValueError("the hf engine takes full weights, not a LoRA adapter")
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in named_tensors:
                params[name].copy_(t)

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]


def _eos_ids(model: PreTrainedModel, tok: PreTrainedTokenizerBase) -> list[int]:
    ids: list[int] = []
    for src in (getattr(model.generation_config, "eos_token_id", None), tok.eos_token_id):
        if isinstance(src, int):
            ids.append(src)
        elif isinstance(src, list):
            ids.extend(src)
    if not ids:
        raise ValueError("the tokenizer and generation config define no EOS token")
    return ids
