"""The GRPO training loop, top to bottom.

    for each rollout:  sample prompts -> engine generates G completions each -> rewards -> advantages
        repeat num_iterations (mu) times:  one optimizer step over the batch (micro-batches accumulate)
            -> metrics line, samples, checkpoint, stop request?

With rollout.async_generation the engine (in a thread, or in rollout worker processes) samples the next
batches with the newest weights it has while the trainer updates: up to rollout.max_staleness updates
may lie between sampling a batch and training on it; a batch that would be staler waits to be sampled
(that bookkeeping is backend/train/rollout_queue.py).
The loss's clipped ratio to the sampling policy's logprobs corrects for the lag, and optionally truncated
importance sampling (rollout.vllm_importance_sampling_*) for engine/trainer mismatch.
Everything a watcher needs goes to the run directory.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend import checks
from backend.data import PromptSampler, load_rows, render_prompt
from backend.eval.greedy import greedy_eval
from backend.models import compute_dtype, load_tokenizer, load_vision_processor, resolve_device
from backend.multimodal import media_ref, render_mm_prompt
from backend.rewards.scorer import RewardScorer
from backend.rollout.base import PromptInput, RawMedia, RolloutEngine, SamplingParams, derive_seed
from backend.rollout.hf import HFEngine, left_pad
from backend.rollout.pool import RolloutPool
from backend.rundir import RunDir
from backend.spec import AlgorithmSection, RunSpec
from backend.train import dist, grpo
from backend.train.batch import PendingRollout, Prompt, Rollout, ScoredGroup
from backend.train.builders import (
    adapter_config,
    adapter_state,
    build_engine,
    build_optimizer,
    build_policy,
    build_reference,
    build_scheduler,
    engine_weights,
    lora_scalings,
    merge_lora_state,
)
from backend.train.checkpoint import load_trainer_state, save_trainer_state
from backend.train.forward import TapeRows, autocast, completion_logits, lean_supported
from backend.train.memory import keep_freed_memory
from backend.train.replay import SolvedReplay
from backend.train.rollout_queue import RolloutQueue
from backend.train.signals import STOP
from backend.train.sinks import make_sinks
from backend.train.telemetry import Telemetry

ENTROPY_STATE = "entropy_control.json"


class StopRequested(Exception):
    pass


class GRPOTrainer:
    def __init__(self, spec: RunSpec, run: RunDir, base_dir: Path, resume: bool = False):
        self.ranks = dist.setup(spec)  # one rank: every hook of it is the identity (backend/train/dist.py)
        self.spec, self.run, self.base_dir = spec, self.ranks.run_view(run), base_dir
        a = spec.algorithm
        if spec.resources.num_threads:
            torch.set_num_threads(spec.resources.num_threads)
        self.device = self.ranks.device or resolve_device(spec)
        if self.device.type == "cpu":
            keep_freed_memory()  # no page faults from re-allocating each step's gradients (memory.py)
        _seed_everything(a.seed)

        ckpt = run.latest_checkpoint() if resume else None
        self.tokenizer = load_tokenizer(spec, base_dir)
        # images, videos, audio: prompts go through the model's processor too (backend.multimodal)
        self.vision = load_vision_processor(spec, base_dir, self.tokenizer) \
            if spec.data.images_column or spec.data.videos_column or spec.data.audios_column else None
        self.policy = build_policy(spec, base_dir, self.device, ckpt)
        self.reference = self.ranks.wrap_reference(spec, build_reference(spec, base_dir, self.device, self.policy))
        self.optimizer = build_optimizer(spec, self.policy)
        self.scheduler = build_scheduler(spec, self.optimizer)
        self.autocast_dtype = compute_dtype(spec)  # bf16 compute over fp32 master weights, or None
        engine_model = self.ranks.engine_model(self.policy)  # rank 0 samples; under ZeRO-3 with a full copy
        self.engine: RolloutEngine | None = None if engine_model is None else \
            build_engine(spec, engine_model, self.tokenizer, self.autocast_dtype, base_dir, run.path)
        self.ranks.wrap(spec, self.policy, self.optimizer, base_dir)  # DeepSpeed ZeRO (stage >= 1)
        self.engine_version = 0  # optimizer steps behind the weights the engine holds
        # LoRA with an engine that takes adapters (checks.adapter_push): only the adapter is pushed
        self.adapter_config = adapter_config(self.policy) if checks.adapter_push(spec) and self.engine is not None else None
        r = spec.rollout  # a colocated GPU engine sleeps while the trainer updates (sync only: async keeps it busy)
        self.engine_sleeps = r.placement == "colocate" and r.sleep and r.engine != "hf" and not r.async_generation
        self.async_counts = {"async/waited": 0, "async/dropped": 0}  # batches held back / resampled by the bound
        self.scorer = RewardScorer(spec.rewards, base_dir=base_dir, device=str(self.device))
        self.weights = torch.tensor(self.scorer.weights)
        # the sync engine samples with the policy's own float32 weights: its linear outputs are the training
        # forward's (backend.rollout.tape), kept within this budget
        self.tape_budget = spec.resources.activation_reuse_mb << 20 if isinstance(self.engine, HFEngine) \
            and self.engine_shares_policy and self.autocast_dtype is None and self.ranks.world == 1 else 0

        self.rows = load_rows(spec.data.sources, spec.data, a.seed, base_dir)
        eval_data = spec.data.model_copy(update={"limit": 0})  # data.limit is about training rows
        self.eval_rows = load_rows(spec.data.eval_sources, eval_data, a.seed, base_dir) if spec.data.eval_sources else []
        self._prompt_cache: dict[tuple[str, int], Prompt] = {}
        self.sampler = PromptSampler(len(self.rows), a.seed, skip_solved=a.skip_solved_prompts)
        # the weighted reward of a solved completion, for skip_solved_prompts and replay_solved: a float sum of
        # weighted 0/1 scores may miss the top by an ulp
        self.solved_at = a.solved_reward - 1e-9
        self.replay = SolvedReplay(self.solved_at) if a.replay_solved else None
        self.step = 0
        self.rollouts_done = 0
        self.pending: PendingRollout | None = None
        self.stop_at_step: int | None = None  # stop (with a checkpoint) once this step is done, as on SIGTERM
        self.on_step: Callable[[GRPOTrainer, dict[str, Any]], None] | None = None  # after each step is logged
        self.entropy_control = grpo.EntropyControl(a.entropy_coef, a.use_adaptive_entropy, a.entropy_target,
                                                   a.entropy_coef_delta, a.entropy_coef_min, a.entropy_coef_max)
        self.telemetry = Telemetry()
        self.skip_zero_advantage = True  # leave all-zero-advantage groups out of the loss pass where exact
        self.last_timings: dict[str, float] = {}  # the last optimizer_step's forward+backward and optimizer seconds
        self.sinks = make_sinks(spec.output.report_to if self.ranks.is_main else [], run.path, spec.model_dump(mode="json"))
        self.started = time.time()
        self.elapsed_before = 0.0
        self.resumed_in_flight: list[Rollout] = []  # async: batches sampled ahead when the checkpoint was taken
        self.unscored: dict[str, tuple[int, int]] = {}  # reward name -> (first rollout, batches) scored all None
        if ckpt is not None:
            self._load_state(ckpt)
        self.run.truncate_after_step(self.step)  # rows past the checkpoint are redone, never duplicated

    # ------------------------------------------------------------------ rollout

    def _prompt(self, row_idx: int, rows: list[dict[str, Any]], split: str) -> Prompt:
        key = (split, row_idx)
        if key not in self._prompt_cache:
            if self.vision is not None:
                mm = render_mm_prompt(rows[row_idx], self.spec.data, self.vision, self.base_dir)
                raw = None
                if self.spec.rollout.engine == "vllm":  # vLLM expands the placeholders and processes the images itself
                    raw = RawMedia(self.tokenizer(mm.text, add_special_tokens=False)["input_ids"], list(mm.images))
                self._prompt_cache[key] = Prompt(mm.text, mm.ids, mm.media, raw)
            else:
                text = render_prompt(rows[row_idx], self.spec.data, self.tokenizer)
                self._prompt_cache[key] = Prompt(text, self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return self._prompt_cache[key]

    def _sampling(self, index: int, attempt: int, n: int) -> SamplingParams:
        r = self.spec.rollout
        # A seed per rollout and sampling attempt makes sampling independent of thread timing and exactly resumable.
        return SamplingParams(n=n, max_tokens=r.max_completion_length, temperature=r.temperature,
                              top_p=r.top_p, top_k=r.top_k, seed=derive_seed(self.spec.algorithm.seed, index, attempt))

    def _generate_groups(self, row_ids: list[int], index: int, attempt: int, timings: dict[str, float]
                         ) -> list[ScoredGroup]:
        """Generate G completions for each row and score them."""
        G = self.spec.rollout.num_generations
        prompts = [self._prompt(i, self.rows, "train") for i in row_ids]
        t0 = time.time()
        inputs = [PromptInput(p.ids, p.media or {}, raw_media=p.raw_media) for p in prompts]
        if self.tape_budget:
            groups, tape = self.engine.generate_taped(inputs, self._sampling(index, attempt, G), self.tape_budget)
        else:
            groups, tape = self.engine.generate(inputs, self._sampling(index, attempt, G)), None
        t1 = time.time()
        matrix = self.scorer.score([p.text for p in prompts for _ in range(G)], [c.text for g in groups for c in g],
                                   [self.rows[i] for i in row_ids for _ in range(G)],
                                   completion_ids=[c.token_ids for g in groups for c in g])
        timings["rollout_s"] = timings.get("rollout_s", 0.0) + t1 - t0
        if isinstance(self.engine, RolloutPool):  # per-instance time: a slow or overloaded worker shows up
            for t in self.engine.last_timings:
                key = f"timing/rollout_worker/{t.name}_s"
                timings[key] = timings.get(key, 0.0) + t.seconds
        timings["reward_s"] = timings.get("reward_s", 0.0) + time.time() - t1
        scored = [ScoredGroup(i, prompts[k], g, matrix[k * G:(k + 1) * G], tape=tape)
                  for k, (i, g) in enumerate(zip(row_ids, groups))]
        skip = self.spec.algorithm.skip_solved_prompts
        if skip or self.replay is not None:
            for group in scored:
                totals = self._totals(group)  # as sampled: replay changes the group after this
                if skip:  # what the sampler skips next time
                    self.sampler.mark(group.row, bool((totals >= self.solved_at).all()))
                if self.replay is not None:
                    self.replay.apply(group, totals)
        return scored

    def _totals(self, group: ScoredGroup) -> np.ndarray:
        """Each completion's weighted reward (None scores count 0, as grpo.combine_rewards)."""
        return np.nansum(group.rewards * self.scorer.weights[None, :], axis=1)

    def make_rollout(self, index: int, policy_version: int) -> Rollout:
        if self.engine_sleeps:
            self.engine.wake_up()  # (weights were pushed, and the engine woken, by sync_weights already)
            try:
                return self._make_rollout(index, policy_version)
            finally:
                self.engine.sleep()
        return self._make_rollout(index, policy_version)

    def _make_rollout(self, index: int, policy_version: int) -> Rollout:
        a, P = self.spec.algorithm, self.spec.algorithm.prompts_per_step
        timings: dict[str, float] = {}
        skipped, replayed = self.sampler.skipped, self.replay.replayed if self.replay is not None else 0
        scored = self._generate_groups(self.sampler.take(P), index, 0, timings)
        dropped = 0
        if a.dynamic_sampling:
            # DAPO: keep groups whose rewards differ (only they carry signal); refill from new prompts.
            kept: list[ScoredGroup] = []
            spare: list[ScoredGroup] = []
            for attempt in range(a.dynamic_sampling_max_retries + 1):
                if attempt:
                    scored = self._generate_groups(self.sampler.take(P), index, attempt, timings)
                for group in scored:
                    total = self._totals(group)
                    (kept if np.ptp(total) > 1e-6 and len(kept) < P else spare).append(group)
                if len(kept) >= P:
                    break
            dropped = len(spare)
            scored = kept + spare[:P - len(kept)]  # retries exhausted: pad with zero-signal groups
        ro = self._assemble(index, policy_version, scored)
        ro.timings.update(timings)
        if a.dynamic_sampling:
            ro.metrics["dynamic_sampling/dropped_groups"] = float(dropped)
        if a.skip_solved_prompts:
            ro.metrics["sampler/skipped_solved"] = float(self.sampler.skipped - skipped)
        if self.replay is not None:
            ro.metrics["replay/replayed"] = float(self.replay.replayed - replayed)
        return ro

    def _assemble(self, index: int, policy_version: int, groups: list[ScoredGroup]) -> Rollout:
        spec, G = self.spec, self.spec.rollout.num_generations
        pad = self.tokenizer.pad_token_id
        matrix = np.concatenate([g.rewards for g in groups], axis=0)
        completions = [c for g in groups for c in g.completions]
        prompt_ids, prompt_mask = left_pad([g.prompt.ids for g in groups for _ in range(G)], pad)
        Lc = max(1, max(len(c.token_ids) for c in completions))
        comp_ids = torch.full((len(completions), Lc), pad, dtype=torch.long)
        comp_mask = torch.zeros((len(completions), Lc), dtype=torch.long)
        have_lp = all(c.logprobs is not None for c in completions)
        samp_lp = torch.zeros((len(completions), Lc)) if have_lp else None
        for i, c in enumerate(completions):
            n = len(c.token_ids)
            comp_ids[i, :n] = torch.tensor(c.token_ids, dtype=torch.long)
            comp_mask[i, :n] = 1
            if samp_lp is not None:
                samp_lp[i, :n] = torch.tensor(c.logprobs)
        truncated = torch.tensor([c.finish_reason == "length" for c in completions])
        loss_mask = comp_mask.clone()
        if spec.algorithm.mask_truncated_completions:
            loss_mask[truncated] = 0

        per_fn = torch.from_numpy(matrix)
        rewards = grpo.combine_rewards(per_fn, self.weights)
        a = spec.algorithm
        adv, group_std = grpo.group_advantages(rewards, G, a.scale_rewards,
                                               a.solved_reward if a.advantage_calibration else None)
        lengths = comp_mask.sum(-1).float()

        m: dict[str, float] = {
            "reward": rewards.mean().item(),
            "reward_std": rewards.view(-1, G).std(dim=1).mean().item(),
            "frac_reward_zero_std": torch.isclose(group_std, torch.zeros_like(group_std)).float().mean().item(),
            "completions/mean_length": lengths.mean().item(),
            "completions/min_length": lengths.min().item(),
            "completions/max_length": lengths.max().item(),
            "completions/clipped_ratio": truncated.float().mean().item(),
            "completion_tokens": float(lengths.sum().item()),
        }
        for j, name in enumerate(self.scorer.names):
            col = per_fn[:, j]
            ok = ~torch.isnan(col)
            m[f"rewards/{name}/mean"] = col[ok].mean().item() if ok.any() else math.nan
            m[f"rewards/{name}/std"] = col[ok].std().item() if ok.sum() > 1 else 0.0
            m[f"rewards/{name}/errors"] = float(self.scorer.error_counts.get(name, 0))
            if not ok.any():
                self._note_unscored(name, index)

        samples = []
        reward_list, adv_list, truncated_list = rewards.tolist(), adv.tolist(), truncated.tolist()  # one sync each
        for i, c in enumerate(completions):
            gi = i // G
            samples.append({
                "group": gi, "prompt": groups[gi].prompt.text, "completion": c.text,
                "solution": self.rows[groups[gi].row].get("solution"),
                "rewards": {n: (None if math.isnan(v) else float(v)) for n, v in zip(self.scorer.names, matrix[i])},
                "reward": reward_list[i], "advantage": adv_list[i],
                "length": len(c.token_ids), "truncated": truncated_list[i],
            })
            if i % G in groups[gi].replayed:  # the studio marks it: sampled at an earlier step
                samples[-1]["replayed"] = True
            if spec.data.images_column:  # the studio shows each group's picture beside it
                samples[-1]["images"] = media_ref(self.rows[groups[gi].row].get(spec.data.images_column))
            if spec.data.videos_column:  # the video's file, or its frames (the studio shows the first)
                samples[-1]["videos"] = media_ref(self.rows[groups[gi].row].get(spec.data.videos_column))
            if spec.data.audios_column:
                samples[-1]["audios"] = media_ref(self.rows[groups[gi].row].get(spec.data.audios_column))
        media = [g.prompt.media for g in groups for _ in range(G)]
        ro = Rollout(index, policy_version, prompt_ids, prompt_mask, comp_ids, comp_mask, loss_mask, samp_lp,
                     adv, m, samples, media=media if any(x is not None for x in media) else None)
        tapes = {id(g.tape): g.tape for g in groups if g.tape is not None}
        if tapes:  # dynamic sampling's retries: the tape of the most groups (the others' rows train as usual)
            ro.tape = max(tapes.values(), key=lambda tp: sum(g.tape is tp for g in groups))
            ro.tape_rows = torch.tensor([ro.tape.row(c) if g.tape is ro.tape else -1
                                         for g in groups for c in g.completions])
        return ro

    def _note_unscored(self, name: str, rollout_index: int) -> None:
        """A reward that scored nothing in a whole batch gives no signal: say so in status.json (the dashboard
        shows it), not only as a NaN metric."""
        first, count = self.unscored.get(name, (rollout_index, 0))
        self.unscored[name] = (first, count + 1)

    def warnings(self) -> list[str]:
        return [f"reward {name!r} returned None for every completion in {count} rollout batch(es), first in rollout "
                f"{first}: it adds no learning signal (does the data have the columns it reads?)"
                for name, (first, count) in sorted(self.unscored.items())]

    # ------------------------------------------------------------------ loss

    def _logps(self, model, ro: Rollout, sl: slice | torch.Tensor, want_entropy: bool = False,
               entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token logprobs of the completions (B, T) and, when wanted, per-token entropies (B, T), with a
        gradient only when the loss has an entropy bonus. `sl` selects rows: a slice, or an index tensor of whole
        groups. Rows on the rollout's activation tape replay its linear outputs (backend.rollout.tape)."""
        group = None if self.spec.model.gradient_checkpointing else self.spec.rollout.num_generations
        taped = self._taped_rows(model, ro, sl)
        if taped is None:
            return self._rows_logps(model, ro, sl, group, None, want_entropy, entropy_grad)
        if bool(taped.all()):
            return self._rows_logps(model, ro, sl, group, TapeRows(ro.tape, ro.tape_rows[sl]), want_entropy,
                                    entropy_grad)
        # some rows are not on the tape (put back by success replay): they run the usual pass; neither part is
        # whole groups, so neither shares prompts
        idx = torch.arange(ro.completion_ids.shape[0])[sl]
        on, off = taped.nonzero().squeeze(1), (~taped).nonzero().squeeze(1)
        a = self._rows_logps(model, ro, idx[on], None, TapeRows(ro.tape, ro.tape_rows[idx[on]]), want_entropy,
                             entropy_grad)
        b = self._rows_logps(model, ro, idx[off], None, None, want_entropy, entropy_grad)
        back = torch.argsort(torch.cat([on, off]))  # the rows in `sl`'s order again
        logps = torch.cat([a[0], b[0]])[back]
        ent = torch.cat([a[1], b[1]])[back] if a[1] is not None and b[1] is not None else None
        return logps, ent

    def _taped_rows(self, model, ro: Rollout, sl: slice | torch.Tensor) -> torch.Tensor | None:
        """Which of the rows in `sl` may replay the rollout's tape (bool), or None when none may: the tape is
        there, `model` is the policy it was recorded with and unchanged since, and the lean pass runs."""
        tape = ro.tape
        if tape is None or ro.media is not None or self.autocast_dtype is not None or not tape.valid_for(model) \
                or not lean_supported(model, self.device):
            return None
        taped = ro.tape_rows[sl] >= 0
        return taped if bool(taped.any()) else None

    def _rows_logps(self, model, ro: Rollout, sl: slice | torch.Tensor, group: int | None, tape: TapeRows | None,
                    want_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        d = self.device
        p_ids, p_mask = ro.prompt_ids[sl].to(d), ro.prompt_mask[sl].to(d)
        c_ids, c_mask = ro.completion_ids[sl].to(d), ro.completion_mask[sl].to(d)
        with autocast(d, self.autocast_dtype):
            logits = completion_logits(model, p_ids, p_mask, c_ids, c_mask, group, media=_rows_of(ro.media, sl),
                                       tape=tape)
        logits = logits.float() / self.spec.rollout.temperature
        logps = grpo.selective_log_softmax(logits, c_ids)
        ent = None
        if want_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = grpo.token_entropy(logits)
        return logps, ent

    @torch.no_grad()
    def _prepare_logps(self, ro: Rollout) -> None:
        """old_logps (needed when the batch is reused or sampled by an older policy) and ref_logps (beta > 0)."""
        a, r = self.spec.algorithm, self.spec.rollout
        B = ro.completion_ids.shape[0]
        mb = B // a.gradient_accumulation_steps
        correct = r.vllm_importance_sampling_correction and not self.engine_shares_policy
        if correct and ro.sampling_logps is None:
            raise RuntimeError(f"importance sampling correction needs per-token logprobs from the {r.engine} engine")
        if r.async_generation and not correct:
            if ro.sampling_logps is None:
                raise RuntimeError(f"async generation needs per-token logprobs from the {r.engine} engine")
            ro.old_logps = ro.sampling_logps  # the engine's weights were the sampling policy
        elif a.num_iterations > 1 and not correct and ro.sampling_logps is not None and self.engine_shares_policy \
                and self.autocast_dtype is None:
            # the sync engine sampled with these very weights in float32 and its logprobs equal a forward pass
            # (tests/test_engine_hf.py): a second forward would recompute the same numbers
            ro.old_logps = ro.sampling_logps
        elif a.num_iterations > 1 or correct:
            # the trainer's own logprobs under the current weights: the clip's anchor (decoupled from the sampler
            # when correcting, as in AReaL / verl), and the numerator of the importance weights
            self.policy.eval()
            ro.old_logps = torch.cat([self._logps(self.policy, ro, slice(i, i + mb))[0].cpu() for i in range(0, B, mb)])
            self.policy.train()
            if correct:
                isw = grpo.importance_weights(ro.old_logps, ro.sampling_logps, ro.completion_mask,
                                              r.vllm_importance_sampling_mode, r.vllm_importance_sampling_clip_max)
                ro.is_weights = isw.weights
                ro.metrics.update(isw.metrics)
        if a.beta > 0:
            if self.reference is not None:
                ro.ref_logps = torch.cat([self._logps(self.reference, ro, slice(i, i + mb))[0].cpu()
                                          for i in range(0, B, mb)])
            else:  # LoRA: the base model is the adapter-free policy
                with self.policy.disable_adapter():
                    ro.ref_logps = torch.cat([self._logps(self.policy, ro, slice(i, i + mb))[0].cpu()
                                              for i in range(0, B, mb)])

    def optimizer_step(self, ro: Rollout) -> dict[str, float]:
        """One optimizer step over the rollout (micro-batches accumulate).

        Groups whose advantages are all zero are left out of the forward and backward when that is exact (see
        `zero_advantage_skippable`): their loss and gradient are exactly zero. Entropy is then the mean over
        the completions that trained; the clip ratios stay over all tokens (skipped tokens never clip)."""
        a, r = self.spec.algorithm, self.spec.rollout
        B, G = ro.completion_ids.shape[0], r.num_generations
        ga = a.gradient_accumulation_steps
        mb = B // ga
        total_tokens, total_seqs = self.ranks.global_counts(ro.loss_mask)  # whole step, all ranks
        acc: dict[str, float] = {"loss": 0.0, "kl": 0.0, "entropy": 0.0}
        control = self.entropy_control
        coef = control.apply()  # the same coefficient for every micro-batch of the step, as TRL
        # one process only: ranks must run the same collectives and report the same metrics (and DeepSpeed
        # counts micro-batches to find its accumulation boundary)
        skip = (self.skip_zero_advantage and mb % G == 0 and not control.enabled and self.ranks.world == 1
                and zero_advantage_skippable(a))
        ent_sum = ent_tokens = 0.0
        trained = 0  # micro-batches that ran
        rows_run = rows_replayed = 0  # completions through the loss pass, and those that replayed the tape
        t0 = time.time()
        for i in range(0, B, mb):
            sl = slice(i, i + mb)
            rows = live_groups(ro.advantages, sl, G) if skip else sl
            if rows is None:
                continue
            trained += 1
            if ro.tape is not None:
                taped = self._taped_rows(self.policy, ro, rows)
                rows_run += len(ro.tape_rows[rows])
                rows_replayed += 0 if taped is None else int(taped.sum())
            logps, ent = self._logps(self.policy, ro, rows, want_entropy=True, entropy_grad=control.enabled)
            mask = ro.loss_mask[rows].to(self.device)
            old = ro.old_logps[rows].to(self.device) if ro.old_logps is not None else logps.detach()
            ref = ro.ref_logps[rows].to(self.device) if ro.ref_logps is not None else None
            samp = ro.sampling_logps[rows].to(self.device) if ro.sampling_logps is not None else None
            out = grpo.policy_loss(
                logps, old, ro.advantages[rows].to(self.device), mask,
                loss_type=a.loss_type, epsilon_low=a.epsilon, epsilon_high=a.upper_clip,
                is_level=a.importance_sampling_level, beta=a.beta, ref_logps=ref, num_micro_batches=ga,
                max_completion_length=r.max_completion_length, global_num_tokens=total_tokens,
                global_num_seqs=total_seqs, delta=a.delta or None, sapo_temperature_pos=a.sapo_temperature_pos,
                sapo_temperature_neg=a.sapo_temperature_neg, use_bias_correction_kl=a.use_bias_correction_kl,
                off_policy_mask_threshold=a.off_policy_mask_threshold or None, sampling_logps=samp,
                top_entropy_quantile=a.top_entropy_quantile, entropies=ent, entropy_coef=coef,
                token_weights=ro.is_weights[rows].to(self.device) if ro.is_weights is not None else None)
            self.ranks.backward(out.loss)
            # token-mean metrics of the micro-batch: skipped tokens count in the denominator, never in a numerator
            share = float(mask.sum()) / max(float(ro.loss_mask[sl].sum()), 1.0) if rows is not sl else 1.0
            acc["loss"] += out.loss.item()
            acc["kl"] += float(out.kl) / ga
            acc["entropy"] += float(grpo.masked_mean(ent.detach(), ro.completion_mask[rows].to(self.device).float()))
            for k, v in out.metrics.items():
                acc[k] = acc.get(k, 0.0) + v * share / ga
            ent_sum += out.entropy_sum
            ent_tokens += out.entropy_tokens
        acc["entropy"] = acc["entropy"] / trained if trained else math.nan
        if not trained:  # nothing ran: zero gradients, so AdamW still steps (momentum, weight decay) as it would
            for k in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
                acc[k] = 0.0  # what the skipped tokens give: zero advantage never clips
            for p in self.policy.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        if control.enabled:
            control.update(*self.ranks.sum(ent_sum, ent_tokens))  # every rank keeps the same coefficient
            acc["entropy_coef"] = control.coef  # after this step's update, as TRL logs it
        t1 = time.time()
        acc["learning_rate"] = self.scheduler.get_last_lr()[0]
        acc["grad_norm"] = self.ranks.step(self.policy, self.optimizer, a.max_grad_norm)  # reduce, clip, update
        self.scheduler.step()
        if a.beta == 0:
            acc.pop("kl")
        self.last_timings = {"forward_backward_s": t1 - t0, "optimizer_s": time.time() - t1}
        if ro.tape is not None:  # valid for this update only (the weights just changed): free it
            acc["activation_reuse/replayed"] = rows_replayed / rows_run if rows_run else 0.0
            ro.tape = ro.tape_rows = None
        return self.ranks.reduce_metrics(acc)

    # ------------------------------------------------------------------ weights, eval, checkpoints

    @property
    def engine_shares_policy(self) -> bool:
        """The sync hf engine samples with the policy object itself: no weight sync, and it can evaluate."""
        return getattr(self.engine, "model", None) is self.policy

    def engine_weights(self) -> dict[str, torch.Tensor] | None:
        """A CPU snapshot of the policy as the engine names it (LoRA merged, except for an in-process peft copy);
        None on ranks without an engine. Under ZeRO-3 every rank calls it: parameters are gathered in buckets."""
        peft_names = isinstance(self.engine, HFEngine)  # an in-process copy of the peft model keeps peft's names
        if self.ranks.params_sharded:
            out: dict[str, torch.Tensor] = {}
            for bucket in self.ranks.gathered(self.policy):
                if self.engine is not None:
                    out.update({n: t.detach().to("cpu", copy=True) for n, t in bucket})
            if self.engine is None:
                return None
            if self.adapter_config is not None:
                return adapter_state(self.policy, out)
            if hasattr(self.policy, "merge_adapter") and not peft_names:  # LoRA: merged on the gathered copies
                out = merge_lora_state(out, lora_scalings(self.policy))
            return out
        if self.engine is None:
            return None
        if self.adapter_config is not None:
            return adapter_state(self.policy)
        return engine_weights(self.policy, peft_names=peft_names)

    def push_weights(self, weights: dict[str, torch.Tensor] | None, version: int) -> float:
        t0 = time.time()
        if self.engine is None or weights is None:
            pass
        elif isinstance(self.engine, RolloutPool):
            self.engine.update_weights(weights.items(), version, adapter=self.adapter_config)
        elif self.adapter_config is not None:
            self.engine.update_adapter(weights.items(), self.adapter_config, version)
        else:
            self.engine.update_weights(weights.items())
        self.engine_version = version
        return time.time() - t0

    def sync_weights(self) -> float:
        """Push the updated policy into the engine (a no-op when the engine shares the policy's weights)."""
        if self.engine_shares_policy:
            self.engine_version = self.step
            return 0.0
        t0 = time.time()
        if self.engine_sleeps and self.engine is not None:
            self.engine.wake_up()  # a level-2 sleep dropped the weights: wake, then load the new ones
        self.push_weights(self.engine_weights(), self.step)  # ZeRO-3: gathered in buckets, all ranks take part
        return time.time() - t0

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Greedy eval of the current policy (an async engine holds the previous version and is busy)."""
        prompts = [(p.text, p.ids, p.media) for p in (self._prompt(i, self.eval_rows, "eval")
                                                     for i in range(len(self.eval_rows)))]
        engine = self.engine if self.engine_shares_policy or self.ranks.params_sharded else \
            HFEngine(self.policy, self.tokenizer, autocast_dtype=self.autocast_dtype)
        return greedy_eval(engine, self.tokenizer, self.eval_rows, self.spec.data, self.scorer,
                           self.spec.rollout.max_completion_length, prompts)

    def maybe_evaluate(self) -> dict[str, float]:
        """Greedy eval on eval steps (also kept in eval/during_training.jsonl); {} otherwise."""
        every = self.spec.output.eval_steps
        if not every or self.step % every or not self.ranks.is_main:
            return {}
        ev = self.evaluate()
        self.run.eval_dir.mkdir(exist_ok=True)
        self.run.append_jsonl(self.run.eval_dir / "during_training.jsonl", [{"step": self.step, **ev}])
        return ev

    def save_checkpoint(self, in_flight: list[Rollout] | None = None) -> Path:
        """Write checkpoints/step-N atomically (a temp dir renamed into place); an existing complete
        checkpoint of this step is kept as it is."""
        ckpt = self.run.checkpoints_dir / f"step-{self.step}"
        if (ckpt / "COMPLETE").exists():
            return ckpt
        # full states, gathered from the ranks (all take part); rank 0 writes them in the one-rank format
        weights = self.ranks.model_state(self.policy)
        optimizer = self.ranks.optimizer_state(self.policy, self.optimizer)
        pending = self.ranks.gather_pending(self.pending)
        if not self.ranks.is_main:
            return ckpt
        final, ckpt = ckpt, self.run.checkpoints_dir / f".step-{self.step}.tmp"
        shutil.rmtree(ckpt, ignore_errors=True)
        ckpt.mkdir(parents=True)
        self.policy.save_pretrained(ckpt / "model", safe_serialization=True, state_dict=weights)
        self.tokenizer.save_pretrained(ckpt / "model")
        if self.vision is not None:  # a checkpoint is a loadable model directory, image processor included
            self.vision.save_pretrained(ckpt / "model")
        save_trainer_state(ckpt / "trainer_state.pt", step=self.step, rollouts_done=self.rollouts_done,
                           sampler=self.sampler.state_dict(), optimizer=optimizer,
                           replay=None if self.replay is None else self.replay.state_dict(),
                           scheduler=self.scheduler.state_dict(), pending=pending, in_flight=in_flight or [],
                           elapsed_s=self.elapsed())
        if self.entropy_control.adaptive:  # the controller's state, as TRL's entropy_ctrl_state.json
            (ckpt / ENTROPY_STATE).write_text(json.dumps({"entropy_coef": self.entropy_control.coef,
                                                          "last_entropy": self.entropy_control.last_entropy}))
        (ckpt / "COMPLETE").write_text(str(self.step))
        shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of a killed save
        os.replace(ckpt, final)
        ckpt = final
        limit = self.spec.output.save_total_limit
        if limit:
            for old in self.run.checkpoints()[:-limit]:
                shutil.rmtree(old, ignore_errors=True)
        return ckpt

    def _load_state(self, ckpt: Path) -> None:
        state = load_trainer_state(ckpt / "trainer_state.pt")  # tensors and plain data only, RNGs restored
        self.step, self.rollouts_done = state.step, state.rollouts_done
        self.sampler.load_state_dict(state.sampler)
        if self.replay is not None:
            self.replay.load_state_dict(state.replay or {})  # a run that had replay off stored none
        self.ranks.load_optimizer_state(self.policy, self.optimizer, state.optimizer)
        self.scheduler.load_state_dict(state.scheduler)
        self.pending = self.ranks.shard_pending(state.pending)
        self.resumed_in_flight = state.in_flight
        self.elapsed_before = state.elapsed_s
        if self.entropy_control.adaptive and (ckpt / ENTROPY_STATE).is_file():
            saved = json.loads((ckpt / ENTROPY_STATE).read_text())
            self.entropy_control.coef, self.entropy_control.last_entropy = saved["entropy_coef"], saved["last_entropy"]
        self.sync_weights()

    def elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.started

    # ------------------------------------------------------------------ the loop

    def _log_step(self, ro: Rollout, it: int, train: dict[str, float], timing: dict[str, float],
                  evaluation: dict[str, float]) -> dict[str, Any]:
        out = self.spec.output
        row: dict[str, Any] = {"step": self.step, "time": time.time(), "elapsed_s": self.elapsed(),
                               "rollout": ro.index}
        row.update({k: v for k, v in ro.metrics.items() if k != "completion_tokens"})
        row.update(train)
        row.update(timing)
        row["throughput/completion_tokens_per_s"] = ro.metrics["completion_tokens"] / max(timing["timing/step_s"], 1e-9)
        row["staleness"] = float(self.step - 1 - ro.policy_version)
        if self.spec.rollout.async_generation:
            row.update({k: float(v) for k, v in self.async_counts.items()})
        row.update(self.telemetry.sample())
        row.update(evaluation)
        self.run.append_jsonl(self.run.metrics_path, [row])
        if it == 0 and out.log_samples_steps and (self.step - 1) % out.log_samples_steps == 0:
            self.run.append_jsonl(self.run.samples_path, ({"step": self.step, "rollout": ro.index, **s}
                                                          for s in ro.samples))
        for sink in self.sinks:
            sink.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, self.step)
        return row

    def train(self) -> str:
        a, out = self.spec.algorithm, self.spec.output
        self.run.write_status(state="running", step=self.step, total_steps=a.max_steps, started_at=self.started,
                              error="")
        print(f"training {a.max_steps} steps on {self.device}: {len(self.rows)} prompts, "
              f"{self.spec.completions_per_step} completions per step", flush=True)
        rollouts = RolloutQueue(self, self.resumed_in_flight)
        recent: list[float] = []

        def checkpoint() -> None:
            self.save_checkpoint(rollouts.in_flight())

        try:
            if self.ranks.any(STOP.is_set()):  # asked to stop while loading
                raise StopRequested
            while self.step < a.max_steps:
                t_step = time.time()
                if self.pending is not None:
                    ro, done_its = self.pending.rollout, self.pending.iterations_done
                else:
                    ro, done_its = rollouts.next(), 0
                    t_prep = time.time()
                    self._prepare_logps(ro)
                    ro.timings["prep_s"] = time.time() - t_prep
                for it in range(done_its, a.num_iterations):
                    if self.step >= a.max_steps:
                        break
                    t_train = time.time()
                    train = self.optimizer_step(ro)
                    self.step += 1
                    self.pending = PendingRollout(ro, it + 1) if it + 1 < a.num_iterations else None
                    t_sync = rollouts.after_update(a.num_iterations - it - 1)
                    first = it == 0  # the rollout's own timings belong to its first update only
                    prep = ro.timings.get("prep_s", 0.0) if first else 0.0  # old/ref logprob passes
                    timing = {
                        "timing/rollout_s": ro.timings.get("rollout_s", 0.0) if first else 0.0,
                        "timing/reward_s": ro.timings.get("reward_s", 0.0) if first else 0.0,
                        "timing/train_s": time.time() - t_train + prep,
                        "timing/forward_backward_s": self.last_timings.get("forward_backward_s", 0.0) + prep,
                        "timing/optimizer_s": self.last_timings.get("optimizer_s", 0.0),
                        "timing/weight_sync_s": t_sync + (ro.timings.get("weight_sync_s", 0.0) if first else 0.0),
                        "timing/step_s": time.time() - t_step,
                    }
                    if first:  # async: how long the trainer waited for the batch; pools: each instance's time
                        timing.update({k: v for k, v in ro.timings.items() if k.startswith("timing/")})
                        if "rollout_wait_s" in ro.timings:
                            timing["timing/rollout_wait_s"] = ro.timings["rollout_wait_s"]
                    row = self._log_step(ro, it, train, timing, self.maybe_evaluate())
                    recent = (recent + [timing["timing/step_s"]])[-20:]
                    eta = (a.max_steps - self.step) * sum(recent) / len(recent)
                    self.run.write_status(state="stopping" if STOP.is_set() else "running", step=self.step,
                                          reward=row["reward"], step_s=timing["timing/step_s"], eta_s=eta,
                                          elapsed_s=self.elapsed(), warnings=self.warnings())
                    print(f"step {self.step}/{a.max_steps} reward {row['reward']:.3f} loss {row['loss']:.4f} "
                          f"len {row['completions/mean_length']:.1f} {timing['timing/step_s']:.2f}s", flush=True)
                    if out.save_steps and self.step % out.save_steps == 0 and self.step < a.max_steps:
                        checkpoint()
                    if self.on_step is not None:
                        self.on_step(self, row)
                    if self.ranks.any(STOP.is_set()) or self.step == self.stop_at_step:
                        raise StopRequested
                    t_step = time.time()
            checkpoint()
            final = "finished"
            print(f"finished {self.step} steps in {self.elapsed():.1f}s", flush=True)
        except StopRequested:
            checkpoint()
            final = "stopped"
            print(f"stopped at step {self.step} (checkpoint saved)", flush=True)
        finally:
            rollouts.close()
            if self.engine is not None and not self.engine_shares_policy:
                self.engine.close()  # rollout workers exit with the run
            for sink in self.sinks:
                sink.close()
            self.scorer.close()
        # written last, once nothing of this process is still working (a resume may start right after)
        self.run.write_status(state=final, step=self.step, eta_s=0.0, elapsed_s=self.elapsed())
        return final


def zero_advantage_skippable(a: AlgorithmSection) -> bool:
    """Whether completions with zero advantage may be left out of the loss pass without changing the step.

    Their clipped-surrogate term is exactly zero (-min(r * 0, clip(r) * 0)) and so is its gradient. Leaving
    them out is exact when nothing else depends on them: no KL term (beta = 0), a normalisation that counts the
    step's sequences or tokens globally (grpo, dr_grpo, dapo), not per micro-batch (bnpo), token-level ratios
    (the clip metrics are token means), and none of the options that look at other rows or tokens (entropy
    bonus, top-entropy mask, off-policy mask) or change the term (delta). Objectives not listed are not skipped
    until shown to be zero at zero advantage."""
    return (a.beta == 0.0 and a.loss_type in ("grpo", "dr_grpo", "dapo") and a.importance_sampling_level == "token"
            and a.entropy_coef == 0.0 and not a.use_adaptive_entropy and a.top_entropy_quantile == 1.0
            and not a.off_policy_mask_threshold and not a.delta)


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


def _rows_of(media: list | None, sl: slice | torch.Tensor) -> list | None:
    """The per-row image inputs of the rows `sl` selects (a slice or an index tensor); None for text batches."""
    if media is None:
        return None
    return media[sl] if isinstance(sl, slice) else [media[i] for i in sl.tolist()]


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def error_summary(err: BaseException) -> str:
    tb = traceback.extract_tb(err.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(err).__name__}: {err}{where}"
