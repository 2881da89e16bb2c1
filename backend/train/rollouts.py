"""Building a rollout batch: prompts -> engine -> rewards -> filters -> a `Rollout` the loss can train on.

    make(index, policy_version):
        take prompts_per_step (x rollout.steps_per_generation) rows from the sampler, render each prompt once (cached)
        the engine samples G completions per prompt
        the scorer scores every completion with every reward function
        filters, in order: skip-solved bookkeeping and success replay (replay.py) per group; DAPO dynamic
        sampling (resample prompts until every group of the batch carries signal, or the retries run out)
        assemble: pad into tensors, combine rewards, group advantages; metrics and sample rows (report.py)
    charge_kl (algorithm.kl_in_reward, once the trainer has the old and reference logprobs): the advantages again,
        from the kept reward matrix less beta x each completion's KL

The builder owns the prompt sampler and the replay store (their state goes into checkpoints) and nothing of
the optimizer's: it is given the engine and the scorer. A seed per rollout and sampling attempt makes sampling
independent of thread timing (async) and exactly resumable.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend.agent import Agent
from backend.agent.episodes import episode_metrics, score_inputs
from backend.data import PromptSampler, render_prompt
from backend.multimodal import render_mm_prompt
from backend.rewards.scorer import RewardScorer
from backend.rollout.base import PromptInput, RawMedia, RolloutEngine, SamplingParams, derive_seed
from backend.rollout.hf import left_pad
from backend.spec import RunSpec
from backend.train import grpo, report
from backend.train.batch import Prompt, Rollout, ScoredGroup
from backend.train.replay import SolvedReplay


class RolloutBuilder:
    def __init__(self, spec: RunSpec, tokenizer: Any, vision: Any, rows: list[dict[str, Any]], engine: RolloutEngine,
                 scorer: RewardScorer, base_dir: Path, engine_sleeps: bool, agent: Agent | None = None):
        a = spec.algorithm
        self.agent = agent  # tools or an environment: rollouts are episodes (backend.agent)
        self.spec, self.tokenizer, self.vision, self.rows, self.base_dir = spec, tokenizer, vision, rows, base_dir
        self.engine, self.scorer, self.engine_sleeps = engine, scorer, engine_sleeps
        self.reward_weights = torch.tensor(scorer.weights)  # one weight per reward function, in scorer order
        self.sampler = PromptSampler(len(rows), a.seed, skip_solved=a.skip_solved_prompts)
        # the weighted reward of a solved completion, for skip_solved_prompts and replay_solved: a float sum of
        # weighted 0/1 scores may miss the top by an ulp
        self.solved_at = a.solved_reward - 1e-9
        self.replay = SolvedReplay(self.solved_at) if a.replay_solved else None
        self.unscored = report.UnscoredRewards()
        self._prompt_cache: dict[tuple[str, int], Prompt] = {}

    def prompt(self, row_idx: int, rows: list[dict[str, Any]], split: str, observation: str | None = None) -> Prompt:
        """Row `row_idx` of `rows` rendered as the model is prompted with it (cached per split and row; with an
        environment's first observation, rendered anew)."""
        key = (split, row_idx)
        tools = self.agent.schemas if self.agent is not None else None
        if observation:
            text = render_prompt(rows[row_idx], self.spec.data, self.tokenizer, tools, observation)
            return Prompt(text, self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if key not in self._prompt_cache:
            if self.vision is not None:
                mm = render_mm_prompt(rows[row_idx], self.spec.data, self.vision, self.base_dir)
                raw = None
                if self.spec.rollout.engine == "vllm":  # vLLM expands the placeholders and processes the images itself
                    raw = RawMedia(self.tokenizer(mm.text, add_special_tokens=False)["input_ids"], list(mm.images))
                self._prompt_cache[key] = Prompt(mm.text, mm.ids, mm.media, raw)
            else:
                text = render_prompt(rows[row_idx], self.spec.data, self.tokenizer, tools)
                self._prompt_cache[key] = Prompt(text, self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return self._prompt_cache[key]

    def make(self, index: int, policy_version: int) -> Rollout:
        """Rollout batch number `index`, sampled by the engine's weights of `policy_version`."""
        if not self.engine_sleeps:
            return self._make(index, policy_version)
        self.engine.wake_up()  # (weights were pushed, and the engine woken, by the weight sync already)
        try:
            return self._make(index, policy_version)
        finally:
            self.engine.sleep()

    def _sampling(self, index: int, attempt: int) -> SamplingParams:
        r = self.spec.rollout
        return SamplingParams(n=r.num_generations, max_tokens=r.max_completion_length, temperature=r.temperature,
                              top_p=r.top_p, top_k=r.top_k, seed=derive_seed(self.spec.algorithm.seed, index, attempt))

    def _generate_groups(self, row_ids: list[int], index: int, attempt: int, timings: dict[str, float]) -> list[ScoredGroup]:
        """G completions for each row, scored; the sampler and the replay store see each group as sampled."""
        G = self.spec.rollout.num_generations
        prompts = [self.prompt(i, self.rows, "train") for i in row_ids]
        t0 = time.time()
        inputs = [PromptInput(p.ids, p.media or {}, raw_media=p.raw_media) for p in prompts]
        if self.agent is None:
            groups = self.engine.generate(inputs, self._sampling(index, attempt))
        else:
            def reprompt(k: int, observation: str) -> PromptInput:
                prompts[k] = self.prompt(row_ids[k], self.rows, "train", observation)
                return PromptInput(prompts[k].ids)

            groups = self.agent.runner.run(self.engine, inputs, self._sampling(index, attempt),
                                           [self.rows[i] for i in row_ids], reprompt)
            _add(timings, "timing/tools_s", sum(c.episode.tool_seconds for g in groups for c in g))
        t1 = time.time()
        flat = [c for g in groups for c in g]
        texts, rows, chats = score_inputs(flat, [self.rows[i] for i in row_ids for _ in range(G)])
        matrix = self.scorer.score([p.text for p in prompts for _ in range(G)], texts, rows,
                                   completion_ids=[c.token_ids for c in flat], conversations=chats)
        _add(timings, "rollout_s", t1 - t0)
        for t in self.engine.last_timings():  # per-instance time: a slow or overloaded worker shows up
            _add(timings, f"timing/rollout_worker/{t.name}_s", t.seconds)
        _add(timings, "reward_s", time.time() - t1)
        scored = [ScoredGroup(i, prompts[k], g, matrix[k * G:(k + 1) * G])
                  for k, (i, g) in enumerate(zip(row_ids, groups))]
        skip = self.spec.algorithm.skip_solved_prompts
        for group in scored if skip or self.replay is not None else []:
            totals = self.totals(group)  # as sampled: replay changes the group after this
            if skip:  # what the sampler skips next time
                self.sampler.mark(group.row, bool((totals >= self.solved_at).all()))
            if self.replay is not None:
                self.replay.apply(group, totals)
        return scored

    def totals(self, group: ScoredGroup) -> np.ndarray:
        """Each completion's weighted reward (None scores count 0, as grpo.combine_rewards)."""
        return np.nansum(group.rewards * self.scorer.weights[None, :], axis=1)

    def _make(self, index: int, policy_version: int) -> Rollout:
        a, P = self.spec.algorithm, self.spec.prompts_per_rollout  # prompts_per_step for each step it serves
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
                    (kept if np.ptp(self.totals(group)) > 1e-6 and len(kept) < P else spare).append(group)
                if len(kept) >= P:
                    break
            dropped = len(spare)
            scored = kept + spare[:P - len(kept)]  # retries exhausted: pad with zero-signal groups
        ro = self.assemble(index, policy_version, scored)
        ro.timings.update(timings)
        if a.dynamic_sampling:
            ro.metrics["dynamic_sampling/dropped_groups"] = float(dropped)
        if a.skip_solved_prompts:
            ro.metrics["sampler/skipped_solved"] = float(self.sampler.skipped - skipped)
        if self.replay is not None:
            ro.metrics["replay/replayed"] = float(self.replay.replayed - replayed)
        return ro

    def assemble(self, index: int, policy_version: int, groups: list[ScoredGroup]) -> Rollout:
        """The groups as padded tensors with combined rewards and group advantages."""
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
        episodes = any(c.model_mask is not None for c in completions)
        model_mask = torch.zeros((len(completions), Lc), dtype=torch.long) if episodes else None
        for i, c in enumerate(completions):
            n = len(c.token_ids)
            comp_ids[i, :n] = torch.tensor(c.token_ids, dtype=torch.long)
            comp_mask[i, :n] = 1
            if model_mask is not None:
                model_mask[i, :n] = torch.tensor(c.model_mask if c.model_mask is not None else [1] * n)
            if samp_lp is not None:
                samp_lp[i, :n] = torch.tensor(c.logprobs)
        truncated = torch.tensor([c.finish_reason == "length" for c in completions])
        # only the model's own tokens are trained: inserted tool results and observations are not
        loss_mask = (model_mask if model_mask is not None else comp_mask).clone()
        if spec.algorithm.mask_truncated_completions:
            loss_mask[truncated] = 0

        per_fn = torch.from_numpy(matrix)
        computed = grpo.advantages(spec.algorithm, per_fn, self.reward_weights, G)
        rewards, adv, group_std = computed.rewards, computed.advantages, computed.group_std
        scored = report.ScoredBatch(groups, self.scorer.names, matrix, rewards, adv, group_std, truncated,
                                    (model_mask if model_mask is not None else comp_mask).sum(-1).float())
        metrics = report.rollout_metrics(scored, self.scorer.error_counts)
        if self.agent is not None:
            metrics.update(episode_metrics([c.episode for c in completions]))
        self.unscored.note(scored, index)
        media = [g.prompt.media for g in groups for _ in range(G)]
        ro = Rollout(index, policy_version, prompt_ids, prompt_mask, comp_ids, comp_mask, loss_mask, samp_lp,
                     adv, metrics, report.sample_rows(scored, self.rows, spec.data),
                     media=media if any(x is not None for x in media) else None, model_mask=model_mask,
                     reward_matrix=per_fn)
        return ro

    def charge_kl(self, ro: Rollout, kl: torch.Tensor, reward_matrix: torch.Tensor,
                  rows: slice | torch.Tensor | None = None) -> None:
        """algorithm.kl_in_reward: the rollout's advantages formed again, each reward less beta x its completion's
        KL to the reference, once the old and reference logprobs exist (after assemble, which has no model).
        `kl` (grpo.sequence_kl) and `reward_matrix` are the whole batch's (every rank's rows, so batch statistics
        are the batch's); `rows` are this rank's of it (None: all). From the kept reward matrix, so a batch
        prepared twice (resumed) is charged once."""
        computed = grpo.advantages(self.spec.algorithm, reward_matrix, self.reward_weights,
                                   self.spec.rollout.num_generations, kl)
        ro.advantages = computed.advantages if rows is None else computed.advantages[rows]
        ro.metrics["kl"] = float(kl.mean())  # ms-swift's kl metric in this mode: the summed per-completion KL
        ro.metrics["kl_in_reward/reward"] = float(computed.rewards.mean())
        if len(ro.samples) == len(kl):  # one sample row per completion (rank 0's: the whole batch's)
            for sample, adv, charged in zip(ro.samples, computed.advantages.tolist(), kl.tolist()):
                sample["advantage"], sample["kl"] = adv, charged

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the builder: the sampler's position and the replay store."""
        return {"sampler": self.sampler.state_dict(), "replay": None if self.replay is None else self.replay.state_dict()}

    def load_state_dict(self, sampler: dict[str, Any], replay: dict[str, Any] | None) -> None:
        self.sampler.load_state_dict(sampler)
        if self.replay is not None:
            self.replay.load_state_dict(replay or {})  # a run that had replay off stored none


def _add(timings: dict[str, float], key: str, seconds: float) -> None:
    timings[key] = timings.get(key, 0.0) + seconds
