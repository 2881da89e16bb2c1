"""The planner: where a run's training and engine instances go on a machine, in sentences for the studio's GPU
panel and the CLI.

Built on the one capability check: `plan(...).ok` is exactly `checks.check(...) == []`, so a spec the planner
calls OK is a spec the launcher starts, and the planner words the layout rather than judging it again. What it
reads of the spec (workers or not, on GPU or not, how weights reach the engine) are RunSpec's derived
properties, the ones the trainer acts on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from backend import checks
from backend.footprint import footprint, spec_shape
from backend.machine import Machine
from backend.spec import RunSpec, SpecIssue


@dataclass
class Plan:
    """The placement planner's verdict: ok is exactly `check(...) == []`; lines describe the layout."""

    ok: bool
    lines: list[str]
    issues: list[SpecIssue] = field(default_factory=list)


_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}


def gpu_roles(spec: RunSpec, machine: Machine) -> dict[int, str]:
    """Each visible GPU's role in this spec: 'training', 'rollout i' (engine instance i) or 'idle'."""
    r, res = spec.rollout, spec.resources
    visible = [g.index for g in machine.gpus]
    if res.device == "cpu" or not visible:
        return {}
    train = res.train_gpus or ([g for g in visible if g not in res.rollout_gpus][:1] if r.placement == "separate"
                               else visible[:1])
    roles = {g: "idle" for g in visible}
    for g in train:
        roles[g] = "training" + (" + rollout" if r.placement == "colocate" else "")
    if r.placement == "separate" and not r.worker_urls:
        tp = r.tensor_parallel_size
        for k, g in enumerate(res.rollout_gpus):
            roles[g] = f"rollout {k // tp}" if g not in train else "training + rollout"
    return roles


def memory_estimate(spec: RunSpec, params: int, machine: Machine) -> list[str]:
    """The engine's share of each rollout GPU from the parameter count, dtype and memory fraction (a planning aid;
    the training process's parts, and whether training fits beside a colocated engine, are backend.footprint's)."""
    r, m = spec.rollout, spec.model
    gib = 1024 ** 3
    engine = params * _BYTES.get(m.dtype, 2) / r.tensor_parallel_size / gib
    lines = [f"{engine:.1f} GiB of weights per rollout GPU (+ KV cache up to {r.gpu_memory_utilization:.0%} of the GPU)"]
    mem = min((g.memory_gib for g in machine.gpus), default=0.0)
    if mem and engine > mem * r.gpu_memory_utilization:
        lines.append(f"⚠ the engine's weights ({engine:.1f} GiB per GPU) exceed {r.gpu_memory_utilization:.0%} of "
                     f"a {mem:.0f} GiB GPU: raise tensor_parallel_size or gpu_memory_utilization")
    return lines


def weight_sync_line(spec: RunSpec, on_gpu: bool) -> str:
    """How new weights reach the engine after each update, in one sentence (the planner shows it)."""
    r = spec.rollout
    lora = ""
    if spec.adapter_push:
        lora = " LoRA: only the adapter is pushed (vLLM LoRA, a new adapter id per version)."
    elif spec.model.finetune == "lora":
        lora = f" LoRA: the adapter is merged into the base weights and those are pushed ({r.engine} takes no adapter)."
    if not spec.rollout_in_workers:
        if r.engine == "hf" and not r.async_generation:
            return "weights: the engine samples with the policy's own weights (nothing to push)"
        return f"weights: copied into the in-process {r.engine} engine after each update." + lora
    if spec.weight_sync_mode(on_gpu) == "collective":
        how = f"{'NCCL' if on_gpu else 'gloo'} broadcast from the trainer in {r.weight_sync_bucket_mb} MB buckets"
    else:
        how = "one shared-memory file the workers keep mapped" + (" (inline bytes to workers reached by URL)" if r.worker_urls else "")
    return f"weights to the rollout workers: {how}." + lora


def plan(spec: RunSpec, machine: Machine, base_dir: str | Path = ".", params: int | None = None,
         issues: list[SpecIssue] | None = None) -> Plan:
    """The planner's layout for the studio's GPU panel and the CLI: where training and each engine instance
    run, and (given the parameter count) a memory estimate. ok is exactly check() == []; a caller that has
    just run check(spec, base_dir, machine) passes its result as `issues` rather than paying for it twice."""
    issues = checks.check(spec, base_dir, machine) if issues is None else issues
    r, res = spec.rollout, spec.resources
    on_gpu = spec.on_gpu(bool(machine.gpus))
    lines: list[str] = []
    threads = res.num_threads or "default"
    if r.worker_urls:
        lines.append(f"{len(r.worker_urls)} {r.engine} rollout worker(s) reached by URL: {', '.join(r.worker_urls)}")
    if not on_gpu:
        if spec.rollout_in_workers:
            if not r.worker_urls:
                lines.append(f"CPU: training in the trainer process (torch threads: {threads}), sampling in "
                             f"{r.data_parallel_size} {r.engine} worker process(es) x {r.worker_threads} thread(s)")
        else:
            lines.append(f"CPU: training and sampling ({r.engine} engine) in one process, torch threads: {threads}")
        if res.world_size > 1:
            lines.append(f"data parallel training over {res.world_size} CPU ranks (gloo)"
                         + (f", DeepSpeed ZeRO-{res.deepspeed_stage}" if res.deepspeed_stage else ""))
    else:
        roles = gpu_roles(spec, machine)
        train = [g for g, role in roles.items() if role.startswith("training")]
        if r.placement == "colocate":
            sleep = "sleeps while training" if r.sleep else "stays resident"
            lines.append(f"colocated: training and {r.engine} sampling share GPUs {train}; engine {sleep}, "
                         f"memory fraction {r.gpu_memory_utilization}")
        elif not r.worker_urls:
            lines.append(f"separate: training on GPUs {train}, {r.engine} sampling on GPUs {res.rollout_gpus} "
                         f"({r.data_parallel_size} instance(s) x TP {r.tensor_parallel_size})")
        if roles:
            lines.append("chips: " + ", ".join(f"GPU {g} {role}" for g, role in roles.items()))
        if len(train) > 1:
            lines.append(f"data parallel training over {len(train)} GPUs"
                         + (f", DeepSpeed ZeRO-{res.deepspeed_stage}" if res.deepspeed_stage else ""))
        if params:
            lines += memory_estimate(spec, params, machine)
    shape = spec_shape(spec, base_dir)
    if shape is not None:  # the training process's parts (backend.footprint), after where things run
        lines.append(footprint(spec, shape).line())
    lines.append(weight_sync_line(spec, on_gpu))
    if r.async_generation:
        lines.append(f"async: sampling up to {r.max_staleness} update(s) ahead of training (off-policy by at most "
                     f"{r.max_staleness})")
    lines += [f"✗ {i}" for i in issues if i.field.startswith(("resources.", "rollout.", "model."))]
    return Plan(not issues, lines, issues)
