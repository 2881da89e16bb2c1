"""Training ranks: what changes when the trainer runs as N data-parallel processes.

Started by torchrun (see backend/train/supervise.py), every rank runs the same loop. The contract:
- Rank 0 alone drives the rollout (engine, rewards, sampler) and broadcasts each rollout batch; every
  rank trains on its contiguous shard of whole groups, so group statistics never split. A rollout that serves
  several steps (rollout.steps_per_generation) is sharded slice by slice: each step, every rank trains its
  shard of that step's slice.
- Loss normalisers are global: the dapo token count and the grpo/dr_grpo sequence count are summed over
  ranks, and the gradient of a rank is the sum of the ranks' gradients (bnpo, a per-micro-batch mean,
  averages instead). With the same global batch and seed, N ranks follow the 1-rank loss curve.
- Gradients: torch.distributed all-reduce (deepspeed_stage 0), or DeepSpeed ZeRO 1/2/3 (partitioned
  optimizer states, gradients and, at 3, parameters; optional CPU offload).
- Checkpoints hold the full, unpartitioned state in the single-rank format (weights by save_pretrained,
  optimizer states as torch AdamW's state_dict, gathered parameter by parameter), so they load with
  `weights_only=True` and resume under any rank count or ZeRO stage.
- Under ZeRO-3 the rollout engine on rank 0 holds its own full copy, refreshed by gathering the
  policy in buckets of parameters (never the whole model at once).
- Rank 0 alone writes the run directory (status, metrics, samples, checkpoints); the others get a
  RunDir whose writes do nothing.

With one rank and stage 0 every hook here is the identity, and nothing is initialised.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from backend.rundir import RunDir
from backend.spec import LOSS_TYPES, RunSpec
from backend.train.batch import PendingRollout, Rollout, slice_rows, take_rows
from backend.train.supervise import free_port

# Training metrics that are not per-rank means: summed (loss), global already, or the same on every rank.
NOT_AVERAGED = frozenset({"loss", "grad_norm", "learning_rate", "entropy_coef"})
PUSH_BUCKET_BYTES = 256 << 20  # ZeRO-3 weight push: gather at most this much at a time


def deepspeed_config(spec: RunSpec, micro_batch: int, world: int, on_cuda: bool,
                     base_dir: Path | None = None) -> dict[str, Any]:
    """The DeepSpeed config for a RunSpec; resources.deepspeed_config (a JSON file) is merged over it.

    Mixed precision is the trainer's (fp32 master weights and bf16 autocast, as on one rank), so
    DeepSpeed keeps fp32. Clipping is DeepSpeed's; batch sizes always come from the spec.
    """
    res, a = spec.resources, spec.algorithm
    zero: dict[str, Any] = {"stage": res.deepspeed_stage, "overlap_comm": on_cuda, "contiguous_gradients": True}
    if res.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_cuda}
    if res.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": on_cuda}
    cfg: dict[str, Any] = {
        "zero_optimization": zero,
        "gradient_clipping": a.max_grad_norm,
        "zero_allow_untested_optimizer": True,  # torch's AdamW, the same optimizer as one rank
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if res.deepspeed_config:
        path = Path(res.deepspeed_config)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        cfg = _merge(cfg, json.loads(path.read_text()))
    cfg.update(train_micro_batch_size_per_gpu=micro_batch, gradient_accumulation_steps=a.gradient_accumulation_steps,
               train_batch_size=micro_batch * a.gradient_accumulation_steps * world)
    return cfg


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def shard_rows(batch: int, rank: int, world: int) -> slice:
    """The contiguous rows of rank `rank`: batch / world rows (whole groups, checked before launch)."""
    n = batch // world
    return slice(rank * n, (rank + 1) * n)


def rank_rows(batch: int, rank: int, world: int, slices: int = 1) -> slice | torch.Tensor:
    """The rows of rank `rank` when a rollout of `batch` rows serves `slices` optimizer steps
    (rollout.steps_per_generation): its shard of each slice, slice after slice, so that slice s of every rank's
    rows together is the one-rank slice s (each step trains what one rank would). One slice: `shard_rows`."""
    if slices == 1 or world == 1:
        return shard_rows(batch, rank, world)
    n = batch // slices
    return torch.cat([torch.arange(batch)[slice_rows(batch, s, slices)][shard_rows(n, rank, world)]
                      for s in range(slices)])


def shard_rollout(ro: Rollout, rank: int, world: int, keep_samples: bool, slices: int = 1) -> Rollout:
    """This rank's rows of a rollout (`rank_rows`): every per-completion tensor indexed, metrics (already global)
    kept."""
    if world == 1:
        return ro
    return take_rows(ro, rank_rows(ro.completion_ids.shape[0], rank, world, slices), ro.samples if keep_samples else [])


def join_rollouts(shards: list[Rollout], slices: int = 1) -> Rollout:
    """Inverse of shard_rollout (shards in rank order): the full batch, samples from rank 0's shard."""
    if len(shards) == 1:
        return shards[0]
    first, world = shards[0], len(shards)
    B = first.completion_ids.shape[0] * world
    order = _joined_order(B, world, slices)
    updates: dict[str, Any] = {}
    for f in dataclasses.fields(first):
        v = getattr(first, f.name)
        if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == B // world:
            updates[f.name] = torch.cat([getattr(s, f.name) for s in shards])[order]
    if first.media is not None:
        flat = [m for s in shards for m in (s.media or [])]
        updates["media"] = [flat[i] for i in order.tolist()]
    return dataclasses.replace(first, **updates)


def join_rows(parts: list[torch.Tensor], slices: int = 1) -> torch.Tensor:
    """Inverse of `rank_rows` for one per-completion tensor: the ranks' rows (in rank order) as the whole batch."""
    world = len(parts)
    if world == 1:
        return parts[0]
    return torch.cat(parts)[_joined_order(parts[0].shape[0] * world, world, slices)]


def _joined_order(batch: int, world: int, slices: int) -> torch.Tensor:
    """The permutation that puts the ranks' rows, laid end to end in rank order, back in batch order."""
    where = torch.cat([torch.arange(batch)[rank_rows(batch, r, world, slices)] for r in range(world)])
    return torch.argsort(where)


class QuietRunDir(RunDir):
    """The run directory as ranks other than 0 see it: readable, but their writes go nowhere."""

    def write_status(self, **fields: Any) -> dict[str, Any]:
        return self.read_status()

    def append_jsonl(self, path: Path, rows: Any) -> None:
        pass

    def truncate_after_step(self, step: int) -> None:
        pass


def clipped_step(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_ then optimizer.step() (max_norm <= 0: no clipping); returns the gradient norm
    before clipping. A norm that is not finite skips the step (the caller zeroes the gradients). The same update
    without clip_grad_norm_'s extra pass over every gradient: none when the norm is within the bound (its factor
    would be 1.0), and with a fused Adam/AdamW the factor rides on the kernel's grad_scale input (the AMP unscale
    path: each gradient is divided by it as the kernel reads it)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        optimizer.step()
        return 0.0
    total = torch.nn.utils.get_total_norm(grads, foreach=True)
    norm = float(total)
    if not math.isfinite(norm):  # never applied: one such step makes every weight NaN (train/guard.py)
        return norm
    # clip_grad_norm_'s factor is min(1, max_norm / (norm + 1e-6))
    clip = max_norm > 0 and norm + 1e-6 > max_norm
    fused = isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) and optimizer.defaults.get("fused")
    if clip and fused and math.isfinite(norm) and getattr(optimizer, "grad_scale", None) is None:
        optimizer.grad_scale = (total + 1e-6) / max_norm
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale
        return norm
    if clip:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    optimizer.step()
    return norm


@dataclass
class Ranks:
    """This process's place among the training ranks, and the few operations that depend on it."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    stage: int = 0  # DeepSpeed ZeRO stage; 0 = plain torch (all-reduce of gradients when world > 1)
    device: torch.device | None = None  # the rank's device when distributed; None = the spec's
    loss_sums: bool = True  # the loss type's normaliser is global (LossTypeInfo.global_normaliser)
    slices: int = 1  # optimizer steps a rollout serves (rollout.steps_per_generation): ranks shard each slice
    ds_engine: Any = None
    comm_s: float = 0.0  # seconds in this module's collectives (rollout broadcast, counts, gradients at stage 0)
    _comm_reported: float = 0.0

    @contextmanager
    def _timed(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.comm_s += time.perf_counter() - t0

    def comm_seconds(self) -> float:
        """Seconds spent communicating so far: this module's collectives, plus DeepSpeed's own when its
        comms_logger is enabled (a deepspeed_config with {"comms_logger": {"enabled": true, "prof_all": true}})."""
        total = self.comm_s
        if self.ds_engine is not None:
            from deepspeed.comm import comm as dscomm

            log = dscomm.comms_logger
            if log.enabled:
                # each record holds its op's running total so far (DeepSpeed's timer is not reset): take the latest
                total += sum(max(max(rec[1]) for rec in op.values()) for op in log.comms_dict.values()) / 1000.0  # ms
        return total

    @property
    def _comm_device(self) -> torch.device:
        """Where small collectives' tensors live: NCCL only reduces GPU tensors, gloo CPU ones."""
        return self.device if self.device is not None and self.device.type == "cuda" else torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def params_sharded(self) -> bool:
        """ZeRO-3: a rank holds a slice of every parameter; full weights exist only while gathered."""
        return self.stage == 3

    # ---------------------------------------------------------------- set up

    def run_view(self, run: RunDir) -> RunDir:
        return run if self.is_main else QuietRunDir(run.path)

    def engine_model(self, policy):
        """The model rank 0's rollout engine samples with: the policy itself, or under ZeRO-3 a full copy
        taken before partitioning (ranks other than 0 build no engine and get None)."""
        if not self.is_main:
            return None
        return copy.deepcopy(policy) if self.params_sharded else policy

    def wrap(self, spec: RunSpec, policy, optimizer: torch.optim.Optimizer, base_dir: Path) -> None:
        """Hand the policy and optimizer to DeepSpeed (stage >= 1); the policy object stays the module."""
        if not self.stage:
            return
        import deepspeed

        local_completions = spec.completions_per_step // self.world
        micro = local_completions // spec.algorithm.gradient_accumulation_steps
        on_cuda = self.device is not None and self.device.type == "cuda"
        cfg = deepspeed_config(spec, micro, self.world, on_cuda, base_dir)
        self.ds_engine, _, _, _ = deepspeed.initialize(model=policy, optimizer=optimizer, config=cfg)

    def wrap_reference(self, spec: RunSpec, reference):
        """Under ZeRO-3 the frozen reference is partitioned too (a full copy per rank would undo what ZeRO-3
        saves); its forward then gathers layer by layer, on every rank at once, like the policy's."""
        if reference is None or not self.params_sharded:
            return reference
        import deepspeed

        on_cuda = self.device is not None and self.device.type == "cuda"
        cfg = deepspeed_config(spec, 1, self.world, on_cuda)
        cfg = {k: v for k, v in cfg.items() if k not in ("gradient_clipping",)}
        cfg["zero_optimization"] = {k: v for k, v in cfg["zero_optimization"].items() if k != "offload_optimizer"}
        cfg.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, train_batch_size=self.world)
        engine, *_ = deepspeed.initialize(model=reference, config=cfg)
        engine.eval()
        return engine.module

    # ---------------------------------------------------------------- rollouts

    def scatter_rollout(self, ro: Rollout | None) -> Rollout:
        """Rank 0's rollout to every rank, each keeping its shard of whole groups."""
        if self.world == 1:
            assert ro is not None
            return ro
        box = [ro]
        with self._timed():
            tdist.broadcast_object_list(box, src=0)
        return shard_rollout(box[0], self.rank, self.world, keep_samples=self.is_main, slices=self.slices)

    def shard_pending(self, pending: PendingRollout | None) -> PendingRollout | None:
        """A checkpoint's (full) half-used rollout, re-sharded for this rank count."""
        if pending is None or self.world == 1:
            return pending
        return PendingRollout(shard_rollout(pending.rollout, self.rank, self.world, self.is_main, self.slices),
                              pending.iterations_done)

    def gather_pending(self, pending: PendingRollout | None) -> PendingRollout | None:
        """The shards of a half-used rollout joined on rank 0 for the checkpoint (None elsewhere)."""
        if self.world == 1:
            return pending
        shards: list[Any] = [None] * self.world
        tdist.all_gather_object(shards, None if pending is None else pending.rollout)
        if pending is None or not self.is_main:
            return None
        return PendingRollout(join_rollouts(shards, self.slices), pending.iterations_done)

    def whole_batch(self, t: torch.Tensor) -> torch.Tensor:
        """A per-completion tensor of this rank's rows joined with every rank's into the whole batch (CPU)."""
        if self.world == 1:
            return t
        parts: list[Any] = [None] * self.world
        with self._timed():
            tdist.all_gather_object(parts, t.cpu())
        return join_rows(parts, self.slices)

    def own_rows(self, batch: int) -> slice | torch.Tensor:
        """This rank's rows of a whole batch of `batch` completions (its shard, as scatter_rollout keeps)."""
        return rank_rows(batch, self.rank, self.world, self.slices)

    # ---------------------------------------------------------------- loss and step

    def global_counts(self, loss_mask: torch.Tensor) -> tuple[float, int]:
        """(loss tokens, sequences) of the whole step across ranks: the dapo and grpo/dr_grpo normalisers."""
        tokens, seqs = self.sum(float(loss_mask.sum()), float(loss_mask.shape[0]))
        return tokens, int(seqs)

    def sum(self, *values: float) -> tuple[float, ...]:
        """Sums over ranks (e.g. entropy totals that drive a controller every rank must agree on)."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        with self._timed():
            tdist.all_reduce(t)
        return tuple(t.tolist())

    def backward(self, loss: torch.Tensor) -> None:
        if self.ds_engine is not None:
            # DeepSpeed averages gradients over ranks; a globally normalised loss wants their sum
            scale = self.world if self.loss_sums else 1
            self.ds_engine.backward(loss * scale, scale_wrt_gas=False)  # the loss already carries 1/micro-batches
            self.ds_engine.step()  # applies the update (clip, AdamW) only at the accumulation boundary
        else:
            loss.backward()

    def step(self, policy, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> float:
        """Reduce gradients, clip, update, zero; returns the gradient norm before clipping."""
        if self.ds_engine is not None:
            norm = self.ds_engine.get_global_grad_norm()
            return float(norm) if norm is not None else math.nan
        params = [p for p in policy.parameters() if p.requires_grad]
        if self.world > 1:
            self._all_reduce_grads(params)
        grad_norm = clipped_step(params, optimizer, max_grad_norm)
        optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _all_reduce_grads(self, params: list[torch.nn.Parameter], bucket_bytes: int = 32 << 20) -> None:
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        t0 = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        for p, g in zip(params, grads):
            p.grad = g
        bucket: list[torch.Tensor] = []
        size = 0
        for i, g in enumerate(grads):
            bucket.append(g)
            size += g.numel() * g.element_size()
            if size >= bucket_bytes or i == len(grads) - 1:
                flat = _flatten_dense_tensors(bucket)
                tdist.all_reduce(flat)
                if not self.loss_sums:
                    flat /= self.world
                for g_, new in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    g_.copy_(new)
                bucket, size = [], 0
        self.comm_s += time.perf_counter() - t0

    def reduce_metrics(self, acc: dict[str, float]) -> dict[str, float]:
        """Per-rank training metrics to global ones: the loss summed (or averaged, bnpo), means averaged."""
        if self.world == 1 and not self.stage:
            return acc
        out = dict(acc)
        if self.world > 1:
            keys = [k for k, v in acc.items() if isinstance(v, (int, float)) and (k == "loss" or k not in NOT_AVERAGED)]
            vals = torch.tensor([acc[k] for k in keys], dtype=torch.float64, device=self._comm_device)
            with self._timed():
                tdist.all_reduce(vals)
            for k, v in zip(keys, vals.tolist()):
                out[k] = v if (k == "loss" and self.loss_sums) else v / self.world
        total = self.comm_seconds()
        out["timing/comm_s"] = total - self._comm_reported  # this step's share (rank 0's view)
        self._comm_reported = total
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on one: stop requests must be agreed on, step for step."""
        if self.world == 1:
            return flag
        t = torch.tensor([1 if flag else 0], device=self._comm_device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return bool(t.item())

    # ---------------------------------------------------------------- weights and state

    def _buckets(self, policy, bucket_bytes: int) -> Iterator[list[tuple[str, torch.nn.Parameter]]]:
        bucket: list[tuple[str, torch.nn.Parameter]] = []
        size = 0
        for name, p in policy.named_parameters():
            numel = getattr(p, "ds_numel", p.numel())
            bucket.append((name, p))
            size += numel * p.element_size()
            if size >= bucket_bytes:
                yield bucket
                bucket, size = [], 0
        if bucket:
            yield bucket

    def gathered(self, policy, bucket_bytes: int = PUSH_BUCKET_BYTES) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The policy's full weights, a bucket at a time (ZeRO-3 gathers each bucket on every rank; call
        it on all ranks). Elsewhere the parameters are whole and this is one pass over them."""
        if not self.params_sharded:
            yield [(n, p.detach()) for n, p in policy.named_parameters()]
            return
        import deepspeed

        for bucket in self._buckets(policy, bucket_bytes):
            with deepspeed.zero.GatheredParameters([p for _, p in bucket]):
                yield [(n, p.detach()) for n, p in bucket]

    def model_state(self, policy) -> dict[str, torch.Tensor] | None:
        """Full weights for save_pretrained under ZeRO-3 (on rank 0; gathered bucket by bucket, kept on
        CPU); None where the module's own parameters are whole."""
        if not self.params_sharded:
            return None
        state: dict[str, torch.Tensor] = {}
        for bucket in self.gathered(policy):
            if self.is_main:
                state.update({n: t.to("cpu", copy=True) for n, t in bucket})
        return state if self.is_main else None

    def optimizer_state(self, policy, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The optimizer's full state as torch AdamW's state_dict over the trainable parameters (in
        model order), whatever the stage; None on ranks other than 0 under DeepSpeed."""
        if self.ds_engine is None:
            return optimizer.state_dict()
        from deepspeed.utils import safe_get_full_optimizer_state

        base = self.ds_engine.optimizer.optimizer  # the torch AdamW over DeepSpeed's flat partitions
        params = [p for p in policy.parameters() if p.requires_grad]
        step = next((st["step"] for st in base.state.values() if "step" in st), torch.tensor(0.0))
        state: dict[int, dict[str, torch.Tensor]] = {}
        for i, p in enumerate(params if _has_adam_state(base) else []):  # no state before the first update
            entry: dict[str, torch.Tensor] = {"step": step.detach().to("cpu", copy=True)}
            for key in ("exp_avg", "exp_avg_sq"):
                t = safe_get_full_optimizer_state(p, key)  # collective under ZeRO-3
                if t is not None and self.is_main:
                    entry[key] = t.detach().to("cpu", copy=True)
            state[i] = entry
        if not self.is_main:
            return None
        group = {k: v for k, v in base.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(params)))
        return {"state": state, "param_groups": [group]}

    def load_optimizer_state(self, policy, optimizer: torch.optim.Optimizer, sd: dict[str, Any]) -> None:
        """Load a full (single-rank format) optimizer state into this rank's optimizer or its partitions."""
        if self.ds_engine is None:
            optimizer.load_state_dict(sd)
            return
        from deepspeed.utils import safe_set_full_optimizer_state

        params = [p for p in policy.parameters() if p.requires_grad]
        if len(sd["state"]) not in (0, len(params)):
            raise RuntimeError(f"checkpoint optimizer holds {len(sd['state'])} parameters, the model trains {len(params)}")
        base = self.ds_engine.optimizer.optimizer
        if not sd["state"]:
            return
        if not _has_adam_state(base):  # AdamW creates its states at the first update: make them now, to be filled
            # ZeRO-3 lists its fp32 partitions in param_groups only while stepping them
            flats = getattr(self.ds_engine.optimizer, "fp32_partitioned_groups_flat", None) or \
                [f for group in base.param_groups for f in group["params"]]
            for flat in flats:
                base.state[flat] = {"step": torch.tensor(0.0, device=flat.device), "exp_avg": torch.zeros_like(flat),
                                        "exp_avg_sq": torch.zeros_like(flat)}
            link = getattr(self.ds_engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)  # ZeRO-1/2
            if link is not None:
                link()
        for i, p in enumerate(params):
            for key in ("exp_avg", "exp_avg_sq"):
                value = sd["state"][i][key].to(self.device or "cpu")
                safe_set_full_optimizer_state(p, value, key)
        step = sd["state"][0]["step"]
        for st in base.state.values():
            st["step"] = step.clone().to(st["step"].device)
        lr = sd["param_groups"][0].get("lr")
        if lr is not None:
            for group in base.param_groups:
                group["lr"] = lr

    def close(self) -> None:
        if tdist.is_available() and tdist.is_initialized():
            try:
                tdist.barrier()
            finally:
                tdist.destroy_process_group()


def _has_adam_state(optimizer: torch.optim.Optimizer) -> bool:
    return any("exp_avg" in st for st in optimizer.state.values())  # state is a defaultdict: entries may be empty


def setup(spec: RunSpec) -> Ranks:
    """Join the process group when started as a rank (torchrun's environment), or for DeepSpeed on one
    process; a plain single-process run gets a Ranks on which every hook is the identity."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    stage = spec.resources.deepspeed_stage
    # a loss normalised by the whole step's counts: the true gradient is the sum of the ranks' gradients; a mean
    # of per-micro-batch means (bnpo) averages them instead
    loss_sums = LOSS_TYPES[spec.algorithm.loss_type].global_normaliser
    slices = spec.rollout.steps_per_generation
    if world == 1 and not stage:
        return Ranks(loss_sums=loss_sums, slices=slices)
    if "MASTER_ADDR" not in os.environ:  # DeepSpeed on one process, started without torchrun
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                          WORLD_SIZE="1")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = spec.on_gpu(torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if use_cuda else "gloo"
    if not tdist.is_initialized():
        if stage:
            import deepspeed

            deepspeed.init_distributed(dist_backend=backend)
        else:
            tdist.init_process_group(backend, device_id=device if use_cuda else None)
    return Ranks(rank=rank, world=world, local_rank=local_rank, stage=stage, device=device, loss_sums=loss_sums,
                 slices=slices)
