"""The GPU check behind bench/gpu_check.sh: nothing here installs or downloads anything.

1. The trainer in bf16 with the transformers engine on the tiny preset (a smoke test of the CUDA path).
2. A random-initialised model with Qwen2.5-1.5B's config (the tiny model's character tokenizer, so no hub),
   our trainer vs TRL's GRPOTrainer on the same GPU, same batch: seconds per step.
3. Where this venv has vLLM: the same 1.5B model with the vLLM engine colocated (sleep mode), then separate
   placement when a second GPU is visible.
Each part prints one line; a part that fails prints its error and the next one still runs.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import torch

from bench.common import ROOT, run_ours, tiny_spec

QWEN25_15B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
              "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 151936,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu", "bos_token_id": 1,
              "eos_token_id": 1, "use_sliding_window": False}


def make_model(where: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_src = json.loads((ROOT / "assets/tiny-add/config.json").read_text())
    cfg = AutoConfig.for_model(**{**QWEN25_15B, "eos_token_id": cfg_src.get("eos_token_id", 1),
                                  "bos_token_id": cfg_src.get("bos_token_id", 1)})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(where, safe_serialization=True)
    for f in (ROOT / "assets/tiny-add").iterdir():
        if "token" in f.name or f.suffix == ".jinja":
            shutil.copy(f, where / f.name)
    return where


def part(name: str, fn) -> None:
    t0 = time.time()
    try:
        print(f"[{name}] {fn()} ({time.time() - t0:.0f}s)", flush=True)
    except Exception:
        print(f"[{name}] FAILED ({time.time() - t0:.0f}s)\n{traceback.format_exc()[-1500:]}", flush=True)


def s_per_step(rows: list[dict]) -> str:
    timed = rows[2:]
    step = statistics.mean(r["timing/step_s"] for r in timed)
    roll = statistics.mean(r["timing/rollout_s"] for r in timed)
    return f"{step:.2f} s/step (rollout {roll:.2f} s), reward {rows[-1]['reward']:.3f}"


def main() -> None:
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    common = ["resources.device=cuda", "model.dtype=bfloat16", "algorithm.max_steps=8"]
    part("tiny bf16 hf", lambda: s_per_step(run_ours(tiny_spec(common))))
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_model(Path(tmp) / "qwen2.5-1.5b-random"))
        big = [*common, f"model.name_or_path={model}", "rollout.max_completion_length=64", "algorithm.prompts_per_step=8",
               "rollout.num_generations=8", "algorithm.gradient_accumulation_steps=2"]
        part("1.5B ours hf", lambda: s_per_step(run_ours(tiny_spec(big))))

        def trl() -> str:
            from bench.common import StepClock, trl_trainer

            spec = tiny_spec(big)
            clock = StepClock()
            trainer = trl_trainer(spec, [clock], gpu=True)
            trainer.train()
            t = clock.times
            return f"{(t[-1] - t[2]) / (len(t) - 3):.2f} s/step"

        part("1.5B TRL", trl)
        try:
            import vllm  # noqa: F401

            have_vllm = True
        except Exception as err:
            have_vllm = False
            print(f"[vllm] not in this venv ({type(err).__name__}): skipped", flush=True)
        if have_vllm:
            part("1.5B ours vllm colocate", lambda: s_per_step(run_ours(tiny_spec(
                [*big, "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.3"]))))
            if torch.cuda.device_count() > 1:
                part("1.5B ours vllm separate async", lambda: s_per_step(run_ours(tiny_spec(
                    [*big, "rollout.engine=vllm", "rollout.placement=separate", "resources.train_gpus=[0]",
                     "resources.rollout_gpus=[1]", "rollout.async_generation=true"]))))


if __name__ == "__main__":
    main()
