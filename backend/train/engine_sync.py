"""Keeping the rollout engine's weights in step with the policy: export, push, and what the engine holds.

`export()` takes a CPU snapshot of the policy as the engine names it: LoRA merged into base-model names (what
vLLM, LMDeploy and an hf worker hold), the adapter alone where the run pushes adapters (RunSpec.adapter_push),
or peft's own names for an engine that keeps them (an in-process copy of the peft model). Under ZeRO-3 every
rank calls it, since parameters are gathered in buckets; ranks without an engine get None.
`push(weights, version)` hands a snapshot to the engine; `sync(step)` does both (a no-op for an engine that
samples with the policy object itself). A colocated engine that sleeps is woken before a push: a level-2 sleep
dropped its weights.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from backend.rollout.base import RolloutEngine
from backend.spec import RunSpec
from backend.train.builders import adapter_config, adapter_state, engine_weights, lora_scalings, merge_lora_state


class EngineSync:
    def __init__(self, spec: RunSpec, policy: Any, engine: RolloutEngine | None, ranks: Any):
        self.policy, self.engine, self.ranks = policy, engine, ranks
        self.shares_policy = engine is not None and engine.shares(policy)
        self.version = 0  # the policy version (optimizer steps taken) of the weights the engine holds
        self.engine_sleeps = spec.engine_sleeps  # a colocated GPU engine sleeps while the trainer updates
        # LoRA with an engine that takes adapters: only the adapter is pushed
        self.adapter = adapter_config(policy) if spec.adapter_push and engine is not None else None

    def export(self) -> dict[str, torch.Tensor] | None:
        peft_names = self.engine is not None and self.engine.keeps_peft_names
        if self.ranks.params_sharded:
            out: dict[str, torch.Tensor] = {}
            for bucket in self.ranks.gathered(self.policy):
                if self.engine is not None:
                    out.update({n: t.detach().to("cpu", copy=True) for n, t in bucket})
            if self.engine is None:
                return None
            if self.adapter is not None:
                return adapter_state(self.policy, out)
            if hasattr(self.policy, "merge_adapter") and not peft_names:  # LoRA: merged on the gathered copies
                out = merge_lora_state(out, lora_scalings(self.policy))
            return out
        if self.engine is None:
            return None
        if self.adapter is not None:
            return adapter_state(self.policy)
        return engine_weights(self.policy, peft_names=peft_names)

    def push(self, weights: dict[str, torch.Tensor] | None, version: int) -> float:
        """Load `weights` (from export) into the engine as policy version `version`; returns the seconds."""
        t0 = time.time()
        if self.engine is not None and weights is not None:
            self.engine.update_weights(weights.items(), version, adapter=self.adapter)
        self.version = version
        return time.time() - t0

    def sync(self, step: int) -> float:
        """Give the engine the policy of `step` now (the sync path); returns the seconds."""
        if self.shares_policy:
            self.version = step
            return 0.0
        t0 = time.time()
        if self.engine_sleeps and self.engine is not None:
            self.engine.wake_up()
        self.push(self.export(), step)  # ZeRO-3: gathered in buckets, all ranks take part
        return time.time() - t0

    def close(self) -> None:
        if self.engine is not None and not self.shares_policy:
            self.engine.close()  # rollout workers exit with the run
