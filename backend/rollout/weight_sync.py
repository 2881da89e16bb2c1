"""Collective weight channel: the trainer broadcasts new weights to its rollout workers in buckets.

Why: the file path (`SharedWeights`: one mapped shared-memory file, or inline bytes for a worker reached by
URL) moves every weight through host memory. On GPUs the fast path is a
collective between the trainer and the engines, as TRL's vLLM client (vLLM's StatelessProcessGroup +
PyNcclCommunicator) and verl/OpenRLHF do it. This module builds that collective with torch alone.

Contract:
- A SEPARATE process group: the trainer (rank 0) hosts a TCPStore, every worker joins it as rank
  1..n, and the group is a ProcessGroupGloo / ProcessGroupNCCL built directly on that store. It never
  touches torch.distributed's default group, which DDP/DeepSpeed own in the trainer and vLLM owns in
  its workers.
- Backend "nccl" when the trainer and every worker are on CUDA, else "gloo" (buffers on CPU): the same
  code path either way, so the CPU tests exercise it for real.
- One update = a small metadata message first (WeightsMeta: names, shapes, dtypes, byte offsets,
  planned into buckets of `bucket_bytes`; it travels over the worker protocol with the receive op),
  then one broadcast of a flat uint8 buffer per bucket. Tensors are packed at 64-byte aligned offsets
  so a slice can be viewed back as its dtype without a copy. A tensor larger than a bucket has a
  bucket to itself.
- Every collective has the group's timeout: a peer that dies or stops mid-broadcast makes the others
  fail within it rather than hang (the pool then names the worker, see pool.py).
- One rank per worker process: a tensor-parallel vLLM instance receives in its driver process and
  loads through reload_weights, which reaches its TP ranks (vllm_engine.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

ALIGN = 64  # bytes; every tensor starts at a multiple of this inside its bucket
_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                                       torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                                                       torch.bool)}
_PREFIX = "grpo-weight-sync"


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16"
    offset: int  # byte offset inside its bucket (a multiple of ALIGN)
    nbytes: int


@dataclass(frozen=True)
class BucketMeta:
    nbytes: int
    tensors: tuple[TensorMeta, ...]


@dataclass(frozen=True)
class WeightsMeta:
    buckets: tuple[BucketMeta, ...]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @property
    def names(self) -> list[str]:
        return [t.name for b in self.buckets for t in b.tensors]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> WeightsMeta:
    """Group tensors, in order, into buckets of at most `bucket_bytes` (aligned sizes); a larger tensor gets its own."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes")
    buckets: list[BucketMeta] = []
    cur: list[TensorMeta] = []
    size = 0
    for name, t in named:
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise ValueError(f"weight {name!r} has dtype {t.dtype}, which the weight channel does not carry")
        nbytes = t.numel() * t.element_size()
        if cur and size + nbytes > bucket_bytes:
            buckets.append(BucketMeta(size, tuple(cur)))
            cur, size = [], 0
        cur.append(TensorMeta(name, tuple(t.shape), dtype, size, nbytes))
        size = _aligned(size + nbytes)
    if cur:
        buckets.append(BucketMeta(size, tuple(cur)))
    return WeightsMeta(tuple(buckets))


def pack(bucket: BucketMeta, tensors: dict[str, torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
    """One flat uint8 buffer holding the bucket's tensors at their offsets."""
    buf = torch.zeros(bucket.nbytes, dtype=torch.uint8, device=device)
    for m in bucket.tensors:
        src = tensors[m.name].detach().contiguous().reshape(-1).view(torch.uint8)
        buf[m.offset:m.offset + m.nbytes].copy_(src)
    return buf


def unpack(bucket: BucketMeta, buf: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The bucket's tensors as views into `buf` (no copy)."""
    return [(m.name, buf[m.offset:m.offset + m.nbytes].view(_DTYPES[m.dtype]).view(m.shape)) for m in bucket.tensors]


_FILE_PREFIX = "grpo-weights-"  # then the owner's pid, "-", mkstemp's random part (no "-" in it), ".bin"
_FRESH_S = 60.0  # a file this young may be one whose owner has not locked it yet


def remove_orphaned_files(directory: str | None = None) -> None:
    """Remove the SharedWeights files whose owner is gone. The owner holds an exclusive flock on its file for
    as long as it lives, and the kernel drops it however the process ends (kill -9 included, in any pid
    namespace), so a file whose lock can be taken is an orphan's. `directory` None: where the files are made
    (/dev/shm, the temp directory). Files without the owner's pid in their name predate the lock: left alone."""
    dirs = [directory] if directory else [d for d in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(d)]
    now = time.time()
    for d in dirs:
        for p in Path(d).glob(f"{_FILE_PREFIX}*-*.bin"):
            try:
                if now - p.stat().st_mtime < _FRESH_S:
                    continue
                with p.open("rb") as f:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    p.unlink()
            except OSError:  # locked (its owner lives), gone already, or not ours to remove
                continue


class SharedWeights:
    """Full weights in one shared-memory file that stays mapped: the "file" channel to local workers.

    The trainer side creates it for a layout (one bucket of `plan_buckets`, so a worker views each tensor in
    place), writes each update into it and hands the workers its path and layout; a worker maps it once and
    copies from the views into its engine. Reusing one mapping is what makes an update cheap: a new file per
    update paid for its fresh pages (page faults and zeroing) at both ends, which for a tiny model cost more
    than a training step. One writer at a time, and no write while a worker reads: the pool updates every
    worker and waits for them before the next write."""

    def __init__(self, bucket: BucketMeta, path: str, owner: bool, lock_fd: int | None = None):
        self.bucket, self.path, self.owner = bucket, path, owner
        self._lock_fd = lock_fd  # the owner's open file, flock'ed while it lives (remove_orphaned_files)
        self.buf = torch.from_file(path, shared=True, size=max(bucket.nbytes, 1), dtype=torch.uint8)  # MAP_SHARED
        self.views = dict(unpack(bucket, self.buf))

    @classmethod
    def create(cls, named: Iterable[tuple[str, torch.Tensor]], directory: str | None = None) -> SharedWeights:
        """The trainer's side: a new file sized for `named` (one bucket), locked while this process lives and
        removed again by close(). Files of trainers that are gone (a kill -9 never ran close()) are removed
        first, since each is as large as the model and /dev/shm is memory."""
        (bucket,) = plan_buckets(named, 1 << 62).buckets
        remove_orphaned_files(directory or tempfile.gettempdir())
        fd, path = tempfile.mkstemp(prefix=f"{_FILE_PREFIX}{os.getpid()}-", suffix=".bin", dir=directory)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return cls(bucket, path, owner=True, lock_fd=fd)

    @classmethod
    def open(cls, path: str, bucket: BucketMeta) -> SharedWeights:
        """A worker's mapping of the trainer's file."""
        return cls(bucket, path, owner=False)

    def fits(self, tensors: dict[str, torch.Tensor]) -> bool:
        """Whether `tensors` have this file's names, shapes and dtypes (else a new file is planned)."""
        return len(tensors) == len(self.views) and all(
            name in tensors and tensors[name].shape == v.shape and tensors[name].dtype == v.dtype
            for name, v in self.views.items())

    def write(self, tensors: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, view in self.views.items():
                view.copy_(tensors[name])

    def close(self) -> None:
        self.views, self.buf = {}, None  # type: ignore[assignment]
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def outward_address(peer_host: str) -> str:
    """This machine's address as `peer_host` sees it (the interface a route to it leaves by); no packet is sent."""
    if peer_host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer_host, 9))
        return s.getsockname()[0]


def pick_backend(trainer_on_cuda: bool, workers_on_cuda: Iterable[bool]) -> str:
    """nccl when every side is on CUDA (and torch has NCCL), gloo otherwise."""
    import torch.distributed as dist

    return "nccl" if trainer_on_cuda and all(workers_on_cuda) and dist.is_nccl_available() else "gloo"


class WeightChannel:
    """One side of the channel: rank 0 (the trainer) sends, ranks 1..n (workers) receive.

    The trainer side is made in two steps because the group forms only once every rank joins:
    `WeightChannel.host(...)` opens the store (its port goes to the workers), then `connect()` on the trainer
    and `WeightChannel.join(...)` on each worker (concurrently) build the group."""

    def __init__(self, store, rank: int, world: int, backend: str, timeout_s: float, address: str):
        self.store, self.rank, self.world, self.backend = store, rank, world, backend
        self.timeout = timedelta(seconds=timeout_s)
        self.address = address  # this rank's address for gloo's connections
        self.group = None
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    @property
    def port(self) -> int:
        return self.store.port

    @classmethod
    def host(cls, world: int, backend: str, timeout_s: float, host: str = "127.0.0.1") -> WeightChannel:
        """The trainer's side: a store on `host` (any free port), not yet connected."""
        import torch.distributed as dist

        store = dist.TCPStore(host, 0, world, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        return cls(store, 0, world, backend, timeout_s, host)

    @classmethod
    def join(cls, host: str, port: int, world: int, rank: int, backend: str, timeout_s: float) -> WeightChannel:
        """A worker's side: connect to the trainer's store and form the group (blocks until every rank joins)."""
        import torch.distributed as dist

        store = dist.TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=timeout_s))
        channel = cls(store, rank, world, backend, timeout_s, outward_address(host))
        channel.connect()
        return channel

    def connect(self) -> None:
        import torch.distributed as dist

        store = dist.PrefixStore(_PREFIX, self.store)
        if self.backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            self.group = dist.ProcessGroupNCCL(store, self.rank, self.world, opts)
        elif self.backend == "gloo":
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = self.timeout
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=self.address)]
            self.group = dist.ProcessGroupGloo(store, self.rank, self.world, opts)
        else:
            raise ValueError(f"weight channel backend must be nccl or gloo, got {self.backend!r}")

    def _broadcast(self, buf: torch.Tensor) -> None:
        import torch.distributed as dist

        if self.group is None:
            raise RuntimeError("the weight channel is not connected")
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = self.timeout
        self.group.broadcast([buf], opts).wait(self.timeout)

    def send(self, meta: WeightsMeta, tensors: dict[str, torch.Tensor]) -> None:
        """Rank 0: broadcast every bucket of `meta` (the receivers already hold `meta`)."""
        for bucket in meta.buckets:
            self._broadcast(pack(bucket, tensors, self.device))

    def receive(self, meta: WeightsMeta, device: torch.device | str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks 1..n: the tensors, bucket by bucket as they arrive (moved to `device` when given)."""
        for bucket in meta.buckets:
            buf = torch.empty(bucket.nbytes, dtype=torch.uint8, device=self.device)
            self._broadcast(buf)
            if device is not None and torch.device(device) != buf.device:
                buf = buf.to(device)
            yield from unpack(bucket, buf)

    def close(self) -> None:
        """Drop the group (an aborted or finished channel cannot be reused)."""
        group, self.group = self.group, None
        if group is not None:
            try:
                group.abort()
            except Exception:  # noqa: BLE001 - best effort: the group may be broken already
                pass
