"""The trainer's supply of rollouts: one at a time (sync), or sampled ahead within a staleness bound (async).

Sync: each batch is sampled with the current weights right before training on it, and the engine gets the
new weights after every update (`after_update` = `EngineSync.sync`).

Async (rollout.async_generation): a single rollout thread samples batches ahead, in training order, with the
newest weights it has, while the trainer updates. A batch is submitted only while it would be trained at
most `rollout.max_staleness` updates after the weights it is sampled with; otherwise it waits (counted in
`async/waited`). Weight pushes are queued on the same thread, so they run between generations, in order,
and only the snapshot (a copy of the policy) costs the trainer time. A batch found staler than the bound
(only after a resume with a smaller bound) is dropped with everything behind it and resampled (`async/dropped`).

Every rank keeps the same bookkeeping (None placeholders off rank 0, which alone samples), so all ranks take
the same decisions and meet in the same collectives (weight gathers, the rollout scatter).

The queue owns its counters (`rollouts_done`, `counts`; `state_dict()` for checkpoints) and is given what it
needs: `make_rollout(index, policy_version)`, the `EngineSync` and the ranks. It never reaches into the trainer.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from backend.spec import RunSpec
from backend.train.batch import Rollout
from backend.train.engine_sync import EngineSync


class RolloutQueue:
    def __init__(self, spec: RunSpec, make_rollout: Callable[[int, int], Rollout], sync: EngineSync, ranks: Any,
                 rollouts_done: int = 0, resumed_in_flight: list[Rollout] | None = None) -> None:
        self.make_rollout, self.sync, self.ranks = make_rollout, sync, ranks
        self.is_async, self.main = spec.rollout.async_generation, ranks.is_main
        # updates per batch: num_iterations x steps_per_generation (each slice of it is a step)
        self.mu, self.bound, self.max_steps = spec.updates_per_rollout, spec.rollout.max_staleness, spec.algorithm.max_steps
        self.rollouts_done = rollouts_done  # batches handed out or submitted (the next one's index is this + 1)
        self.counts = {"async/waited": 0, "async/dropped": 0}  # batches held back / resampled by the bound
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout") if self.is_async and self.main else None
        self.queue: deque[Future[Rollout] | None] = deque()  # batches sampled ahead, in training order
        for resumed in (resumed_in_flight or []) if self.is_async else []:
            done: Future[Rollout] | None = Future() if self.main else None
            if done is not None:
                done.set_result(resumed)
            self.queue.append(done)
        self.pushed = sync.version  # the newest weights handed to the engine (pushed in the rollout thread)
        self.held = False  # the next batch is waiting for the staleness bound

    def state_dict(self) -> dict[str, int]:
        return {"rollouts_done": self.rollouts_done}

    def in_flight(self) -> list[Rollout]:
        """The batches sampled ahead (they belong to a checkpoint: the sampler has already moved past them)."""
        return [f.result() for f in self.queue if f is not None]

    def next(self, step: int) -> Rollout:
        """The batch to train on next after `step` updates, this rank's shard of it; async timings in `ro.timings`."""
        if not self.is_async:
            self.rollouts_done += 1
            return self.ranks.scatter_rollout(self.make_rollout(self.rollouts_done, step) if self.main else None)
        if not self.queue:
            self._refill(step, 0)
        t0 = time.time()
        ro = self._pop()
        if self.ranks.any(ro is not None and step - ro.policy_version > self.bound):  # after a smaller-bound resume
            dropped = 1 + len(self.queue)
            self.in_flight()  # let the thread finish them before the sampler moves on
            self.queue.clear()
            self.counts["async/dropped"] += dropped
            self._refill(step, 0)
            ro = self._pop()
        wait_s = time.time() - t0
        sync_s = self._refill(step, self.mu)
        ro = self.ranks.scatter_rollout(ro)  # each rank keeps its shard of whole groups
        ro.timings["rollout_wait_s"] = wait_s
        ro.timings["weight_sync_s"] = sync_s
        return ro

    def after_update(self, step: int, left: int) -> float:
        """After optimizer step `step`, with `left` updates still to take on the current batch: hand the engine
        the new weights (sync), or sample ahead as far as the bound allows (async). Returns the trainer's seconds."""
        return self._refill(step, left) if self.is_async else self.sync.sync(step)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def _pop(self) -> Rollout | None:
        fut = self.queue.popleft()
        return fut.result() if fut is not None else None

    def _sample(self, index: int) -> Rollout:
        return self.make_rollout(index, self.sync.version)  # in the rollout thread: after the pushes before it

    def _refill(self, step: int, left: int) -> float:
        """Submit batches while one submitted now would be trained at most `bound` updates after its weights;
        `left` = updates still to take on the current batch. Returns the weight-snapshot seconds."""
        snap_s = 0.0
        while True:
            ahead = left + self.mu * len(self.queue)  # updates before a batch submitted now is first trained on
            if step + ahead >= self.max_steps:
                return snap_s
            if ahead > self.bound:
                self.held = True
                return snap_s
            if self.pushed < step and not self.sync.shares_policy:
                t0 = time.time()
                weights = self.sync.export()  # a copy (all ranks gather under ZeRO-3): the policy moves on
                snap_s += time.time() - t0
                if self.pool is not None:
                    self.pool.submit(self.sync.push, weights, step)  # runs between generations, in order
                self.pushed = step
            if self.held:
                self.counts["async/waited"] += 1
                self.held = False
            self.rollouts_done += 1
            self.queue.append(self.pool.submit(self._sample, self.rollouts_done) if self.pool is not None else None)
