"""Rollout pool: data-parallel engine instances behind the one engine interface.

generate() gives every prompt its group seed first (base.group_seeds), splits the prompts into
contiguous runs of whole groups, one run per instance, samples them concurrently and gathers the
groups back in prompt order. Because seeds are per group, 2 instances sample exactly what 1 would.
Tensor parallelism lives inside an instance (one worker spanning its GPUs), not here.

Instances are anything with the engine interface: WorkerHandles (worker.py) in the trainer, plain
engines in tests. New weights reach the workers one of two ways (`weight_sync`):
- "file": written into one shared-memory file that every local worker maps and reads (the same file for every
  update while the layout stays: weight_sync.SharedWeights); inline bytes to a worker
  reached by URL;
- "collective": the workers and the trainer form a weight channel (weight_sync.py) on the first update;
  each update sends the metadata to every worker (receive_weights) while this process broadcasts the
  buckets. A worker that dies or hangs meanwhile raises its RolloutWorkerError (the channel is then closed
  and not reused); a broadcast that fails with every worker still alive raises one naming the channel.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path

import torch

from backend.rollout.base import Completion, InstanceTiming, PromptInput, RolloutEngine, SamplingParams, group_seeds
from backend.rollout.weight_sync import SharedWeights, WeightChannel, outward_address, pick_backend, plan_buckets
from backend.rollout.worker import RolloutWorkerError, WorkerConfig, WorkerHandle, release, shm_dir, spawn_worker

WEIGHT_SYNC_MODES = ("file", "collective")


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


class RolloutPool(RolloutEngine):
    def __init__(self, instances: Sequence, names: Sequence[str] | None = None, weight_sync: str = "file",
                 bucket_mb: float = 256.0, channel_timeout_s: float = 600.0):
        if not instances:
            raise ValueError("a rollout pool needs at least one engine instance")
        if weight_sync not in WEIGHT_SYNC_MODES:
            raise ValueError(f"rollout.weight_sync: {weight_sync!r} is not one of {', '.join(WEIGHT_SYNC_MODES)}")
        if weight_sync == "collective" and not all(isinstance(e, WorkerHandle) for e in instances):
            raise ValueError("rollout.weight_sync: collective needs every engine instance to be a rollout worker")
        self.instances = list(instances)
        self.names = list(names) if names else [getattr(e, "name", f"instance-{i}") for i, e in enumerate(instances)]
        # one thread per instance, plus one for this side of a broadcast
        self._threads = ThreadPoolExecutor(max_workers=len(self.instances) + 1, thread_name_prefix="rollout-pool")
        self._timings: list[InstanceTiming] = []
        self.version = 0
        self.weight_sync = weight_sync
        self.bucket_bytes = max(1, int(bucket_mb * 2**20))
        self.channel_timeout_s = channel_timeout_s
        self.channel: WeightChannel | None = None
        self.shared: SharedWeights | None = None  # the "file" channel to local workers, once weights were pushed
        self.channel_meta_buckets: tuple = ()  # the buckets of the last collective update (for timing and tests)

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
        self._timings = [t for _, t in results]
        return [g for out, _ in results for g in out]

    def last_timings(self) -> list[InstanceTiming]:
        return list(self._timings)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None,
                       adapter: dict | None = None) -> None:
        """New weights for every instance; with `adapter` (a peft config) the tensors are a LoRA adapter."""
        self.version = self.version + 1 if version is None else version
        if self.weight_sync == "collective":
            self._broadcast_weights(named_tensors, adapter)
            return
        local = [e for e in self.instances if isinstance(e, WorkerHandle) and e.proc is not None]
        tensors = {n: t.detach().to("cpu").contiguous() for n, t in named_tensors}
        if local:  # one mapped file for every local worker, kept while the layout stays (weight_sync.SharedWeights)
            if self.shared is None or not self.shared.fits(tensors):
                if self.shared is not None:
                    self.shared.close()
                self.shared = SharedWeights.create(tensors.items(), shm_dir())
            self.shared.write(tensors)
        futures = []
        for e in self.instances:
            if e in local:
                futures.append(self._threads.submit(e.update_weights_shared, self.shared, self.version, adapter))
            else:
                futures.append(self._threads.submit(e.update_weights, tensors.items(), self.version, adapter))
        for f in futures:  # every reader is done before the next write
            f.result()

    # ------------------------------------------------------------------ the collective path

    def _together(self, mine: Callable[[], object], theirs: list[Callable[[], object]], what: str) -> None:
        """Run this side of a collective and every worker's side (`theirs[i]` calls instance i) concurrently.
        The first failure ends it and closes the channel. The error raised names the cause: a worker whose
        process died (the others only see 'connection closed by peer'), else the first worker's own error,
        else this side's failure as an error naming the channel."""
        futures: list[Future] = [self._threads.submit(mine)] + [self._threads.submit(f) for f in theirs]
        wait(futures, return_when=FIRST_EXCEPTION)
        if not any(f.done() and f.exception() is not None for f in futures):
            return
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()  # unblocks the others' collectives (or their group timeout does)
        wait(futures[1:], timeout=5.0)  # the workers' calls notice a death within a poll slice
        dead = [i for i, e in enumerate(self.instances) if isinstance(e, WorkerHandle) and e.local and e.proc.poll() is not None]
        order = dead + [i for i in range(len(theirs)) if i not in dead]
        for i in order:
            f = futures[i + 1]
            if f.done() and isinstance(f.exception(), RolloutWorkerError):
                raise f.exception()
        if dead:
            raise self.instances[dead[0]]._fail(f"died during the weight {what}")
        err = next(f.exception() for f in futures if f.done() and f.exception() is not None)
        raise RolloutWorkerError(f"rollout weight channel ({what}, workers {', '.join(self.names)}) failed: "
                                 f"{type(err).__name__}: {err}") from err

    def _open_channel(self) -> WeightChannel:
        """Form the weight channel: this process is rank 0, worker i rank i + 1."""
        workers: list[WorkerHandle] = self.instances
        devices = [w.health().get("device", "cpu") for w in workers]
        backend = pick_backend(torch.cuda.is_available(), [d == "cuda" for d in devices])
        remote = [w.address[0] for w in workers if not w.local]
        host = outward_address(remote[0]) if remote else "127.0.0.1"
        world = len(workers) + 1
        channel = WeightChannel.host(world, backend, self.channel_timeout_s, host)
        self.channel = channel
        self._together(channel.connect, [lambda w=w, r=r: w.init_weight_channel(host, channel.port, world, r, backend,
                                                                             self.channel_timeout_s)
                                         for r, w in enumerate(workers, start=1)], f"{backend} setup")
        return channel

    def _broadcast_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], adapter: dict | None = None) -> None:
        tensors = {n: t.detach() for n, t in named_tensors}
        channel = self.channel or self._open_channel()
        meta = plan_buckets(tensors.items(), self.bucket_bytes)
        self.channel_meta_buckets = meta.buckets
        version = self.version
        self._together(lambda: channel.send(meta, tensors),
                       [lambda w=w: w.receive_weights(meta, version, adapter) for w in self.instances],
                       f"{channel.backend} broadcast")

    def sleep(self) -> None:
        for f in [self._threads.submit(e.sleep) for e in self.instances]:
            f.result()

    def wake_up(self) -> None:
        for f in [self._threads.submit(e.wake_up) for e in self.instances]:
            f.result()

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.shared is not None:
            self.shared.close()
            self.shared = None
        for e in self.instances:
            if isinstance(e, WorkerHandle):
                release(e)
            else:
                e.close()
        self._threads.shutdown(wait=False, cancel_futures=True)


def start_workers(cfg: WorkerConfig, count: int, log_dir: Path, gpu_sets: Sequence[list[int]] | None = None,
                  python: str = "", start_timeout_s: float = 600.0, call_timeout_s: float = 600.0,
                  weight_sync: str = "file", bucket_mb: float = 256.0) -> RolloutPool:
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
    return RolloutPool(handles, names, weight_sync=weight_sync, bucket_mb=bucket_mb, channel_timeout_s=call_timeout_s)
