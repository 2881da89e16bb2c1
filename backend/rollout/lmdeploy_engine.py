"""LMDeploy rollout engine, run only inside a rollout worker under LMDeploy's own environment.

UNTESTED HERE. lmdeploy 0.18's wheel resolves (`pip download --no-deps lmdeploy==0.18.0` works) but
needs CUDA and pins torch <= 2.12.1, torchvision <= 0.27.1 and peft <= 0.14.0, so it cannot share the
trainer's environment (torch 2.13) and cannot run on a machine without a GPU. It is written against
lmdeploy 0.18's API (pipeline.infer, GenerationConfig, the engines' update_params) and driven through
the worker protocol: set rollout.worker_python to that environment's interpreter
(`bash scripts/setup_lmdeploy_env.sh` makes one on a CUDA machine). bench/gpu_check.sh is where it
gets exercised when a GPU is at hand.

Mapping onto the engine contract (base.py):
- prompts go in as token ids (`input_ids`, no chat template: the trainer already rendered it);
- n samples per group are n requests with seeds derived from the group's seed (lmdeploy's `n` does not
  take a seed per sample), `logprobs=1` for the sampled tokens' logprobs;
- update_weights: `update_params(UpdateParamsRequest(serialized_named_tensors=..., finished=...))` in
  buckets, tensors on this worker's GPU serialized with torch's ForkingPickler (CUDA IPC handles), the
  format LMDeploy's own RL integrations use; TurboMind takes new weights the same way where it supports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from backend.rollout.base import Completion, PromptInput, RolloutEngine, SamplingParams, derive_seed, group_seeds

if TYPE_CHECKING:
    from backend.rollout.worker import WorkerConfig

BUCKET_BYTES = 512 << 20  # a few hundred MB per update_params call


class LMDeployEngine(RolloutEngine):
    def __init__(self, cfg: WorkerConfig):
        from lmdeploy import PytorchEngineConfig, TurbomindEngineConfig, pipeline

        common = dict(tp=cfg.tensor_parallel_size, cache_max_entry_count=cfg.gpu_memory_utilization)
        if cfg.max_model_len:
            common["session_len"] = cfg.max_model_len
        backend = PytorchEngineConfig(**common) if cfg.lmdeploy_backend == "pytorch" else TurbomindEngineConfig(**common)
        self.cfg = cfg
        self.pipe = pipeline(cfg.model, backend_config=backend)
        self.tok = self.pipe.tokenizer

    def generate(self, prompts: list[PromptInput], sampling: SamplingParams) -> list[list[Completion]]:
        from lmdeploy import GenerationConfig

        prompts = group_seeds(prompts, sampling)
        configs, ids = [], []
        for p in prompts:
            for j in range(sampling.n):
                seed = None if p.seed is None else derive_seed(p.seed, j)
                configs.append(GenerationConfig(max_new_tokens=sampling.max_tokens, temperature=sampling.temperature,
                                                top_p=sampling.top_p, top_k=sampling.top_k, random_seed=seed, logprobs=1))
                ids.append(p.token_ids)
        outs = self.pipe.infer([""] * len(ids), gen_config=configs, do_preprocess=False, input_ids=ids)
        result: list[list[Completion]] = []
        for k in range(len(prompts)):
            group = []
            for o in outs[k * sampling.n:(k + 1) * sampling.n]:
                tok_ids = list(o.token_ids)
                lps = [row[t] for row, t in zip(o.logprobs, tok_ids)] if o.logprobs else None
                group.append(Completion(tok_ids, self.tok.decode(tok_ids, skip_special_tokens=True),
                                        "length" if o.finish_reason == "length" else "stop", lps))
            result.append(group)
        return result

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int = 0,
                       adapter: dict | None = None) -> None:
        if adapter is not None:
            raise ValueError("the LMDeploy engine takes merged weights, not a LoRA adapter")
        import pybase64
        from lmdeploy.serve.openai.protocol import UpdateParamsRequest
        from torch.multiprocessing.reductions import ForkingPickler

        engine = self.pipe.async_engine.engine
        items = [(n, t.to("cuda", non_blocking=True)) for n, t in named_tensors]
        buckets, cur, size = [], [], 0
        for n, t in items:
            cur.append((n, t))
            size += t.numel() * t.element_size()
            if size >= BUCKET_BYTES:
                buckets.append(cur)
                cur, size = [], 0
        if cur or not buckets:
            buckets.append(cur)
        torch.cuda.synchronize()
        for i, bucket in enumerate(buckets):
            blob = pybase64.b64encode(ForkingPickler.dumps(bucket)).decode()
            engine.update_params(UpdateParamsRequest(serialized_named_tensors=blob, finished=i == len(buckets) - 1))

    def close(self) -> None:
        self.pipe.close()
