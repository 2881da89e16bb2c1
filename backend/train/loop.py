"""The GRPO trainer: a recipe over small builders, read top to bottom.

    trainer = GRPOTrainer(spec, run, base_dir, resume)   # cheap: nothing loaded
    trainer.setup()                                      # ranks, model, reference, optimizer, engine, rewards, data
    trainer.train()                                      # the loop below; cleanup() when it ends, however it ends

    for each rollout:  sample prompts -> engine generates G completions each -> rewards -> advantages   (rollouts.py)
        old / reference logprobs where the objective needs them                                      (prepare_logps)
        kl_in_reward: the advantages formed again, each reward charged beta x its KL        (RolloutBuilder.charge_kl)
        repeat num_iterations (mu) times:  one optimizer step over the batch (micro-batches accumulate)
            -> reference sync when due, weights to the engine, metrics line, samples, checkpoint, stop request?

With rollout.steps_per_generation N > 1 a rollout samples N steps' prompts at once and each step trains on the
next of its N slices (batch.rollout_slice): N x mu steps per rollout. With algorithm.sync_ref_model the KL
reference moves toward the policy every ref_model_sync_steps steps (ref_sync.py).

With rollout.async_generation the engine (in a thread, or in rollout worker processes) samples the next
batches with the newest weights it has while the trainer updates, within rollout.max_staleness updates
(rollout_queue.py). The loss's clipped ratio to the sampling policy's logprobs corrects for the lag, and
optionally truncated importance sampling (rollout.vllm_importance_sampling_*) for engine/trainer mismatch.
Everything a watcher needs goes to the run directory (report.py builds the rows; rank 0 alone writes them).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend.agent import Agent, context_window
from backend.data import drop_long_prompts, load_rows
from backend.eval.greedy import greedy_eval
from backend.models import compute_dtype, load_vision_processor, resolve_device, spec_tokenizer
from backend.rewards.scorer import RewardScorer
from backend.rollout.hf import HFEngine
from backend.rundir import RunDir
from backend.spec import RunSpec
from backend.train import checkpoint, dist, grpo, guard, ref_sync, report
from backend.train.batch import PendingRollout, Rollout, live_groups, rollout_slice
from backend.train.builders import build_engine, build_optimizer, build_policy, build_reference, build_scheduler
from backend.train.engine_sync import EngineSync
from backend.train.forward import PolicyLogps
from backend.train.memory import keep_freed_memory
from backend.train.rollout_queue import RolloutQueue
from backend.train.rollouts import RolloutBuilder
from backend.train.signals import STOP
from backend.train.sinks import make_sinks
from backend.train.telemetry import Telemetry


class StopRequested(Exception):
    pass


class GRPOTrainer:
    def __init__(self, spec: RunSpec, run: RunDir, base_dir: Path, resume: bool = False):
        self.spec, self.run, self.base_dir, self.resume = spec, run, base_dir, resume
        self.step = 0  # optimizer steps taken
        self.pending: PendingRollout | None = None  # a batch with updates left (spec.updates_per_rollout > 1)
        self.stop_at_step: int | None = None  # stop (with a checkpoint) once this step is done, as on SIGTERM
        self.on_step: Callable[[GRPOTrainer, dict[str, Any]], None] | None = None  # after each step is logged
        self.skip_zero_advantage = True  # leave all-zero-advantage groups out of the loss pass where exact
        self.started, self.elapsed_before = time.time(), 0.0
        self.ranks: dist.Ranks | None = None
        self.notes: list[str] = []  # what resuming skipped (checkpoints that do not verify)
        self.guard = guard.Guard()  # skipped non-finite updates; fails the run after guard.LIMIT in a row
        self._closers: list[Callable[[], None]] = []  # what cleanup() releases, in order

    # ------------------------------------------------------------------ setup

    def setup(self) -> GRPOTrainer:
        spec, base_dir, a = self.spec, self.base_dir, self.spec.algorithm
        self.ranks = dist.setup(spec)  # one rank: every hook of it is the identity (backend/train/dist.py)
        if self.resume and self.ranks.is_main:
            checkpoint.remove_partial(self.run.checkpoints_dir)
        ckpt, self.notes = checkpoint.resume_point(self.run.checkpoints()) if self.resume else (None, [])
        for note in self.notes:  # in train.log, and in status.json's warnings with the others
            print(note, flush=True)
        self.run = self.ranks.run_view(self.run)
        if spec.resources.num_threads:
            torch.set_num_threads(spec.resources.num_threads)
        self.device = self.ranks.device or resolve_device(spec)
        if self.device.type == "cpu":
            keep_freed_memory()  # no page faults from re-allocating each step's gradients (memory.py)
        random.seed(a.seed)
        np.random.seed(a.seed)
        torch.manual_seed(a.seed)

        self.tokenizer = spec_tokenizer(spec, base_dir)
        # images, videos, audio: prompts go through the model's processor too (backend.multimodal)
        self.vision = load_vision_processor(spec, base_dir, self.tokenizer) \
            if spec.data.images_column or spec.data.videos_column or spec.data.audios_column else None
        self.policy = build_policy(spec, base_dir, self.device, ckpt)
        self.reference = self.ranks.wrap_reference(spec, build_reference(spec, base_dir, self.device, self.policy,
                                                                         ref_sync.reference_dir(a, ckpt)))
        self.ref_sync = ref_sync.RefSync(a, self.reference, self.policy) if a.sync_ref_model else None
        self.optimizer = build_optimizer(spec, self.policy)
        self.scheduler = build_scheduler(spec, self.optimizer)
        self.autocast_dtype = compute_dtype(spec)  # bf16 compute over fp32 master weights, or None
        engine_model = self.ranks.engine_model(self.policy)  # rank 0 samples; under ZeRO-3 with a full copy
        engine = None if engine_model is None else \
            build_engine(spec, engine_model, self.tokenizer, self.autocast_dtype, base_dir, self.run.path)
        self.ranks.wrap(spec, self.policy, self.optimizer, base_dir)  # DeepSpeed ZeRO (stage >= 1)
        self.sync = EngineSync(spec, self.policy, engine, self.ranks)
        self._closers.append(self.sync.close)
        self.scorer = RewardScorer(spec.rewards, base_dir=base_dir, device=str(self.device))
        self._closers.append(self.scorer.close)
        self.logps = PolicyLogps(self.device, self.autocast_dtype, spec.rollout.temperature,
                                 spec.rollout.num_generations, a.logprob_chunk_tokens)
        self.entropy_control = grpo.EntropyControl(a.entropy_coef, a.use_adaptive_entropy, a.entropy_target,
                                                   a.entropy_coef_delta, a.entropy_coef_min, a.entropy_coef_max)

        loaded = load_rows(spec.data.sources, spec.data, a.seed, base_dir)
        rows = drop_long_prompts(loaded, spec.data, self.tokenizer)
        if len(rows) < len(loaded):
            print(f"data.prompt_truncation delete: {len(loaded) - len(rows)} of {len(loaded)} prompts are longer "
                  f"than {spec.data.max_prompt_tokens} tokens and were dropped", flush=True)
        eval_data = spec.data.model_copy(update={"limit": 0})  # data.limit is about training rows
        self.eval_rows = drop_long_prompts(load_rows(spec.data.eval_sources, eval_data, a.seed, base_dir),
                                           spec.data, self.tokenizer) if spec.data.eval_sources else []
        self.agent = None  # tools or an environment: rollouts are episodes, played where the engine is (rank 0)
        if spec.tools.enabled and engine is not None:
            self.agent = Agent.of_run(spec, self.tokenizer, base_dir, context_window(self.policy))
            self._closers.append(self.agent.close)
        self.rollouts = RolloutBuilder(spec, self.tokenizer, self.vision, rows, engine, self.scorer, base_dir,
                                       self.sync.engine_sleeps, self.agent)  # it samples on rank 0 only
        self.telemetry = Telemetry()
        self.sinks = make_sinks(spec.output.report_to if self.ranks.is_main else [], self.run.path, spec.model_dump(mode="json"))
        self._closers += [s.close for s in self.sinks]
        state = self._load_state(ckpt) if ckpt is not None else None
        self.queue = RolloutQueue(spec, self.make_rollout, self.sync, self.ranks, state.rollouts_done if state else 0,
                                  state.in_flight if state else [])
        self._closers.insert(0, self.queue.close)  # the rollout thread stops before the engine closes
        self.run.truncate_after_step(self.step)  # rows past the checkpoint are redone, never duplicated
        return self

    def _load_state(self, ckpt: Path) -> checkpoint.TrainerState:
        state = checkpoint.load_trainer_state(ckpt / "trainer_state.pt")  # tensors and plain data only, RNGs restored
        self.step = state.step
        self.rollouts.load_state_dict(state.sampler, state.replay)
        self.ranks.load_optimizer_state(self.policy, self.optimizer, state.optimizer)
        self.scheduler.load_state_dict(state.scheduler)
        self.pending = self.ranks.shard_pending(state.pending)
        self.elapsed_before = state.elapsed_s
        saved = checkpoint.load_entropy_state(ckpt) if self.entropy_control.adaptive else None
        if saved is not None:
            self.entropy_control.coef, self.entropy_control.last_entropy = saved
        self.sync.sync(self.step)
        return state

    def make_rollout(self, index: int, policy_version: int) -> Rollout:
        return self.rollouts.make(index, policy_version)

    def elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.started

    # ------------------------------------------------------------------ the loop

    def train(self) -> str:
        a = self.spec.algorithm
        self.run.write_status(state="running", step=self.step, total_steps=a.max_steps, started_at=self.started, error="")
        print(f"training {a.max_steps} steps on {self.device}: {len(self.rollouts.rows)} prompts, "
              f"{self.spec.completions_per_step} completions per step", flush=True)
        U, N = self.spec.updates_per_rollout, self.spec.rollout.steps_per_generation
        eta, save_every = report.Eta(period=U), self.spec.output.save_steps
        try:
            try:
                if self.ranks.any(STOP.is_set()):  # asked to stop while loading
                    raise StopRequested
                while self.step < a.max_steps:
                    clock = report.StepClock()
                    ro, done = (self.pending.rollout, self.pending.iterations_done) if self.pending else (self._next_rollout(), 0)
                    for u in range(done, min(U, done + a.max_steps - self.step)):  # u: updates done on ro
                        batch = rollout_slice(ro, u, N)
                        with self.telemetry.phase("train"):
                            stats = self.optimizer_step(batch, clock)
                        self.step += 1
                        if self.ref_sync is not None:
                            self.ref_sync.after_step(self.step)
                        self.pending = PendingRollout(ro, u + 1) if u + 1 < U else None
                        clock.weight_sync_s = self.queue.after_update(self.step, U - u - 1)
                        row = self._log_step(batch, u, stats, report.step_timing(ro, u == 0, clock), eta)
                        if save_every and self.step % save_every == 0 and self.step < a.max_steps:
                            self.save_checkpoint()
                        if self.on_step is not None:
                            self.on_step(self, row)
                        if self.ranks.any(STOP.is_set()) or self.step == self.stop_at_step:
                            raise StopRequested
                        clock = report.StepClock()
                final = "finished"
            except StopRequested:
                final = "stopped"
            self.save_checkpoint()
            print(f"finished {self.step} steps in {self.elapsed():.1f}s" if final == "finished"
                  else f"stopped at step {self.step} (checkpoint saved)", flush=True)
        finally:
            self.cleanup()
        # written last, once nothing of this process is still working (a resume may start right after)
        self.run.write_status(state=final, step=self.step, eta_s=0.0, elapsed_s=self.elapsed())
        return final

    def _next_rollout(self) -> Rollout:
        with self.telemetry.phase("rollout"):
            ro = self.queue.next(self.step)
        t0 = time.time()
        self.prepare_logps(ro)
        ro.timings["prep_s"] = time.time() - t0
        return ro

    def _log_step(self, ro: Rollout, update: int, stats: dict[str, float], timing: dict[str, float],
                  eta: report.Eta) -> dict[str, Any]:
        out = self.spec.output
        extra = {k: float(v) for k, v in self.queue.counts.items()} if self.spec.rollout.async_generation else {}
        extra.update(self.telemetry.sample())
        extra.update(self.maybe_evaluate())
        cause = guard.batch_problem(ro) or guard.update_problem(stats)
        self.guard.note(self.step, cause)
        extra[guard.SKIPPED] = float(cause is not None)
        row = report.metrics_row(self.step, self.elapsed(), ro, stats, timing, extra)
        self.run.append_jsonl(self.run.metrics_path, [row])
        if update == 0 and out.log_samples_steps and (self.step - 1) % out.log_samples_steps == 0:
            self.run.append_jsonl(self.run.samples_path, ({"step": self.step, "rollout": ro.index, **s} for s in ro.samples))
        for sink in self.sinks:
            sink.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, self.step)
        step_s = timing["timing/step_s"]
        self.run.write_status(state="stopping" if STOP.is_set() else "running", step=self.step, reward=row["reward"],
                              step_s=step_s, eta_s=eta.update(step_s, self.spec.algorithm.max_steps - self.step),
                              elapsed_s=self.elapsed(),
                              warnings=self.notes + self.rollouts.unscored.warnings() + self.guard.warnings())
        print(f"step {self.step}/{self.spec.algorithm.max_steps} reward {row['reward']:.3f} loss {row['loss']:.4f} "
              f"len {row['completions/mean_length']:.1f} {step_s:.2f}s", flush=True)
        self.guard.raise_at_limit()  # once the step's row and status say why
        return row

    def cleanup(self) -> None:
        """Release the rollout thread, the engine (workers exit with the run), the scorer and the sinks; once."""
        while self._closers:
            self._closers.pop(0)()

    # ------------------------------------------------------------------ the update

    @torch.no_grad()
    def prepare_logps(self, ro: Rollout) -> None:
        """old_logps (needed when the batch is reused or sampled by an older policy) and ref_logps (beta > 0); with
        kl_in_reward, the advantages charged the KL between them (RolloutBuilder.charge_kl)."""
        a, r = self.spec.algorithm, self.spec.rollout
        B = ro.completion_ids.shape[0]
        mb = B // (a.gradient_accumulation_steps * r.steps_per_generation)  # a training micro-batch's rows
        reused = self.spec.updates_per_rollout > 1  # steps after the first train on it with newer weights
        correct = r.vllm_importance_sampling_correction and not self.sync.shares_policy

        # the sync engine sampled with these very weights in float32, and its logprobs equal a forward pass
        # (tests/test_engine_hf.py): a second forward would recompute the same numbers
        engine_is_forward = ro.sampling_logps is not None and self.sync.shares_policy and self.autocast_dtype is None

        def passes(model) -> torch.Tensor:
            with self.telemetry.phase("reference"):  # the old-policy and reference passes: one phase
                return torch.cat([self.logps(model, ro, slice(i, i + mb)).logps.cpu() for i in range(0, B, mb)])

        def policy_pass() -> torch.Tensor:
            self.policy.eval()
            out = passes(self.policy)
            self.policy.train()
            return out

        if correct and ro.sampling_logps is None:
            raise RuntimeError(f"importance sampling correction needs per-token logprobs from the {r.engine} engine")
        if r.async_generation and not correct:
            if ro.sampling_logps is None:
                raise RuntimeError(f"async generation needs per-token logprobs from the {r.engine} engine")
            ro.old_logps = ro.sampling_logps  # the engine's weights were the sampling policy
        elif reused and not correct and engine_is_forward:
            ro.old_logps = ro.sampling_logps
        elif reused or correct:
            # the trainer's own logprobs under the current weights: the clip's anchor (decoupled from the sampler
            # when correcting, as in AReaL / verl), and the numerator of the importance weights
            ro.old_logps = policy_pass()
            if correct:
                isw = grpo.importance_weights(ro.old_logps, ro.sampling_logps, ro.sampled_mask,
                                              r.vllm_importance_sampling_mode, r.vllm_importance_sampling_clip_max)
                ro.is_weights = isw.weights
                ro.metrics.update(isw.metrics)
        if a.beta > 0 and self.reference is not None:
            ro.ref_logps = passes(self.reference)
        elif a.beta > 0:  # LoRA: the base model is the adapter-free policy
            with self.policy.disable_adapter():
                ro.ref_logps = passes(self.policy)
        if a.kl_in_reward:  # the rewards are charged the KL of the policy that sampled (ms-swift's old logps)
            old = ro.old_logps
            if old is None:
                old = ro.sampling_logps if engine_is_forward else policy_pass()
            assert ro.reward_matrix is not None
            whole = self.ranks.whole_batch  # batch statistics need every rank's rows
            kl = whole(grpo.sequence_kl(old, ro.ref_logps, ro.sampled_mask))
            self.rollouts.charge_kl(ro, kl, whole(ro.reward_matrix), self.ranks.own_rows(len(kl)))

    def optimizer_step(self, ro: Rollout, clock: report.StepClock | None = None) -> dict[str, float]:
        """One optimizer step over the rollout (micro-batches accumulate); its metrics. `clock` gets its seconds.

        Groups whose advantages are all zero are left out of the forward and backward when that is exact (see
        `AlgorithmSection.zero_advantage_skippable`): their loss and gradient are exactly zero. Entropy is then the mean over
        the completions that trained; the clip ratios stay over all tokens (skipped tokens never clip)."""
        a, r, d = self.spec.algorithm, self.spec.rollout, self.device
        # not trained on at all (guard.py; every rank agrees, as advantages are sharded); _log_step notes why
        if self.ranks.any(guard.batch_problem(ro) is not None):
            lr = self.scheduler.get_last_lr()[0]
            self.scheduler.step()  # the step counts, its update is skipped (as AMP's GradScaler)
            return {"loss": math.nan, "grad_norm": math.nan, "learning_rate": lr}
        B, G, ga = ro.completion_ids.shape[0], r.num_generations, a.gradient_accumulation_steps
        mb = B // ga
        total_tokens, total_seqs = self.ranks.global_counts(ro.loss_mask)  # whole step, all ranks
        acc: dict[str, float] = {"loss": 0.0, "kl": 0.0, "entropy": 0.0}
        control = self.entropy_control
        coef = control.apply()  # the same coefficient for every micro-batch of the step, as TRL
        # one process only: ranks must run the same collectives and report the same metrics (and DeepSpeed
        # counts micro-batches to find its accumulation boundary)
        skip = (self.skip_zero_advantage and mb % G == 0 and not control.enabled and self.ranks.world == 1
                and a.zero_advantage_skippable)
        ent_sum = ent_tokens = 0.0
        trained = 0  # micro-batches that ran
        t0 = time.time()
        for i in range(0, B, mb):
            sl = slice(i, i + mb)
            rows = live_groups(ro.advantages, sl, G) if skip else sl
            if rows is None:
                continue
            trained += 1
            lp = self.logps(self.policy, ro, rows, want_entropy=True, entropy_grad=control.enabled)
            mask = ro.loss_mask[rows].to(d)

            def at(t: torch.Tensor | None, rows: slice | torch.Tensor = rows) -> torch.Tensor | None:
                return None if t is None else t[rows].to(d)

            out = grpo.loss(a, grpo.LossInputs(
                lp.logps, at(ro.old_logps), at(ro.advantages), mask, ref_logps=at(ro.ref_logps),
                sampling_logps=at(ro.sampling_logps), entropies=lp.entropies, token_weights=at(ro.is_weights),
                entropy_coef=coef, global_num_tokens=total_tokens, global_num_seqs=total_seqs, num_micro_batches=ga,
                max_completion_length=r.max_completion_length))
            self.ranks.backward(out.loss)
            # token-mean metrics of the micro-batch: skipped tokens count in the denominator, never in a numerator
            share = float(mask.sum()) / max(float(ro.loss_mask[sl].sum()), 1.0) if rows is not sl else 1.0
            acc["loss"] += out.loss.item()
            acc["kl"] += float(out.kl) / ga
            acc["entropy"] += float(grpo.masked_mean(lp.entropies.detach(), ro.sampled_mask[rows].to(d).float()))
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
        if a.beta == 0 or a.kl_in_reward:  # no KL term in the loss (kl_in_reward: the rollout's metric says it)
            acc.pop("kl")
        if clock is not None:
            t2 = time.time()
            clock.train_s, clock.forward_backward_s, clock.optimizer_s = t2 - t0, t1 - t0, t2 - t1
        return self.ranks.reduce_metrics(acc)

    # ------------------------------------------------------------------ evaluation and checkpoints

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Greedy eval of the current policy (an async engine holds the previous version and is busy)."""
        prompts = [(p.text, p.ids, p.media) for p in (self.rollouts.prompt(i, self.eval_rows, "eval")
                                                     for i in range(len(self.eval_rows)))]
        engine = self.sync.engine if self.sync.shares_policy or self.ranks.params_sharded else \
            HFEngine(self.policy, self.tokenizer, autocast_dtype=self.autocast_dtype)
        return greedy_eval(engine, self.tokenizer, self.eval_rows, self.spec.data, self.scorer,
                           self.spec.rollout.max_completion_length, prompts,
                           self.agent.runner if self.agent is not None else None)

    def maybe_evaluate(self) -> dict[str, float]:
        """Greedy eval on eval steps (also kept in eval/during_training.jsonl); {} otherwise."""
        every = self.spec.output.eval_steps
        if not every or self.step % every or not self.ranks.is_main:
            return {}
        ev = self.evaluate()
        self.run.eval_dir.mkdir(exist_ok=True)
        self.run.append_jsonl(self.run.eval_dir / "during_training.jsonl", [{"step": self.step, **ev}])
        return ev

    def save_checkpoint(self) -> Path:
        """checkpoints/step-N, written atomically; an existing complete checkpoint of this step is kept as it is."""
        ckpt = self.run.checkpoints_dir / f"step-{self.step}"
        if checkpoint.is_complete(ckpt):
            return ckpt
        # full states, gathered from the ranks (all take part); rank 0 writes them in the one-rank format
        weights = self.ranks.model_state(self.policy)
        optimizer = self.ranks.optimizer_state(self.policy, self.optimizer)
        pending = self.ranks.gather_pending(self.pending)
        if not self.ranks.is_main:
            return ckpt
        guard.check_weights(weights.items() if weights is not None else self.policy.named_parameters(), self.step)

        def fill(tmp: Path) -> None:
            self.policy.save_pretrained(tmp / "model", safe_serialization=True, state_dict=weights)
            self.tokenizer.save_pretrained(tmp / "model")
            if self.vision is not None:  # a checkpoint is a loadable model directory, image processor included
                self.vision.save_pretrained(tmp / "model")
            builder = self.rollouts.state_dict()
            checkpoint.save_trainer_state(tmp / "trainer_state.pt", step=self.step, sampler=builder["sampler"],
                                          replay=builder["replay"], optimizer=optimizer, pending=pending,
                                          scheduler=self.scheduler.state_dict(), in_flight=self.queue.in_flight(),
                                          elapsed_s=self.elapsed(), **self.queue.state_dict())
            if self.entropy_control.adaptive:
                checkpoint.save_entropy_state(tmp, self.entropy_control.coef, self.entropy_control.last_entropy)
            if self.ref_sync is not None:  # the reference has moved from the base model: resume needs it
                self.ref_sync.save(tmp)

        checkpoint.write_atomically(ckpt, fill, str(self.step))
        checkpoint.prune(self.run.checkpoints(), self.spec.output.save_total_limit)
        return ckpt

