"""Rollout pool: data-parallel engine instances behind the one engine interface.

generate() gives every prompt its group seed first (base.group_seeds), splits the prompts into
contiguous runs of whole groups, one run per instance, samples them concurrently and gathers the
groups back in prompt order. Because seeds are per group, 2 instances sample exactly what 1 would.
Tensor parallelism lives inside an instance (one worker spanning its GPUs), not here.

Instances are anything with the engine interface: WorkerHandles (worker.py) in the trainer, plain
engines in tests. New weights are written once (one shared-memory file) and read by every local worker.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.rollout.base import Completion, PromptInput, SamplingParams, group_seeds
from backend.rollout.worker import WorkerConfig, WorkerHandle, release, spawn_worker, write_weights


@dataclass(frozen=True)
class InstanceTiming:
    name: str
    groups: int
    completion_tokens: int
    seconds: float


def split_groups(n_prompts: int, n_instances: int) -> list[range]:
    """Contiguous, near-equal runs of prompts (the first runs take the remainder); empty runs are dropped."""
    base, extra = divmod(n_prompts, n_instances)
    runs, start = [], 0
    for i in range(n_instances):
        size = base + (1 if i < extra else 0)
        if size:
            runs.append(range(start, start + size))
        start += size
    return runs


class RolloutPool:
    def __init__(self, instances: Sequence, names: Sequence[str] | None = None):
        if not instances:
            raise ValueError("a rollout pool needs at least one engine instance")
        self.instances = list(instances)
        self.names = list(names) if names else [getattr(e, "name", f"instance-{i}") for i, e in enumerate(instances)]
        self._threads = ThreadPoolExecutor(max_workers=len(self.instances), thread_name_prefix="rollout-pool")
        self.last_timings: list[InstanceTiming] = []
        self.version = 0

    def generate(self, prompts: list[PromptInput], sampling: SamplingParams) -> list[list[Completion]]:
        prompts = group_seeds(prompts, sampling)
        runs = split_groups(len(prompts), len(self.instances))

        def one(k: int, run: range) -> tuple[list[list[Completion]], InstanceTiming]:
            t0 = time.perf_counter()
            out = self.instances[k].generate([prompts[i] for i in run], sampling)
            tokens = sum(len(c.token_ids) for g in out for c in g)
            return out, InstanceTiming(self.names[k], len(run), tokens, time.perf_counter() - t0)

        if len(runs) == 1:
            results = [one(0, runs[0])]
        else:
            futures = [self._threads.submit(one, k, run) for k, run in enumerate(runs)]
            results = [f.result() for f in futures]  # in order; the first failure raises here
        self.last_timings = [t for _, t in results]
        return [g for out, _ in results for g in out]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        self.version = self.version + 1 if version is None else version
        local = [e for e in self.instances if isinstance(e, WorkerHandle) and e.proc is not None]
        tensors = {n: t.detach().to("cpu").contiguous() for n, t in named_tensors}
        path = write_weights(tensors) if local else None
        try:
            futures = []
            for e in self.instances:
                if path is not None and e in local:
                    futures.append(self._threads.submit(e.update_weights_from_file, path, self.version))
                elif isinstance(e, WorkerHandle):
                    futures.append(self._threads.submit(e.update_weights, tensors.items(), self.version))
                else:
                    futures.append(self._threads.submit(e.update_weights, tensors.items()))
            for f in futures:
                f.result()
        finally:
            if path is not None:
                os.unlink(path)

    def sleep(self) -> None:
        for f in [self._threads.submit(e.sleep) for e in self.instances]:
            f.result()

    def wake_up(self) -> None:
        for f in [self._threads.submit(e.wake_up) for e in self.instances]:
            f.result()

    def close(self) -> None:
        for e in self.instances:
            if isinstance(e, WorkerHandle):
                release(e)
            else:
                e.close()
        self._threads.shutdown(wait=False, cancel_futures=True)


def start_workers(cfg: WorkerConfig, count: int, log_dir: Path, gpu_sets: Sequence[list[int]] | None = None,
                  python: str = "", start_timeout_s: float = 600.0, call_timeout_s: float = 600.0) -> RolloutPool:
    """Start `count` workers concurrently (worker i on gpu_sets[i]; logs rollout-worker-i.log) and pool them.
    If any fails to start, the others are closed and the first error is raised."""
    names = [f"rollout-{i}" for i in range(count)]
    with ThreadPoolExecutor(max_workers=count) as ex:
        futures = [ex.submit(spawn_worker, cfg, names[i], log_dir / f"rollout-worker-{i}.log",
                             list(gpu_sets[i]) if gpu_sets else None, python, start_timeout_s, call_timeout_s)
                   for i in range(count)]
        handles, errors = [], []
        for f in futures:
            try:
                handles.append(f.result())
            except Exception as err:
                errors.append(err)
    if errors:
        for h in handles:
            release(h)
        raise errors[0]
    return RolloutPool(handles, names)
