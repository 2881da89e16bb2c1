"""Shared pieces of the benchmarks: our trainer on a spec in a throwaway run dir, and TRL's on the same task."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from backend.launcher import create_run
from backend.rundir import read_jsonl
from backend.spec import RunSpec, load_spec

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets/tiny-cpu.yaml"


def tiny_spec(overrides: list[str] | None = None) -> RunSpec:
    return load_spec(TINY, ["output.eval_steps=0", "output.save_steps=0", "output.log_samples_steps=0",
                            *(overrides or [])])


def run_ours(spec: RunSpec, on_step: Any = None) -> list[dict[str, Any]]:
    """Train in this process; returns the metrics rows."""
    from backend.train.loop import GRPOTrainer

    with tempfile.TemporaryDirectory() as tmp:
        spec = spec.model_copy(deep=True)
        spec.output.runs_dir = tmp
        run = create_run(spec, ROOT)
        trainer = GRPOTrainer(spec, run, ROOT)
        if on_step is not None:
            trainer.on_step = on_step
        trainer.train()
        return read_jsonl(run.metrics_path)[0]


def trl_trainer(spec: RunSpec, callbacks: list[Any] | None = None, gpu: bool = False):
    """TRL's GRPOTrainer configured like `spec`, at its best on this CPU: float32, no gradient checkpointing
    (its defaults, bf16 and checkpointing, run about 3x slower here without native bf16)."""
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from backend.rewards.registry import BUILTIN_REWARDS

    a, r = spec.algorithm, spec.rollout
    tok = AutoTokenizer.from_pretrained(ROOT / spec.model.name_or_path)
    model = AutoModelForCausalLM.from_pretrained(ROOT / spec.model.name_or_path, dtype=torch.float32)
    ds = load_dataset("json", data_files=str(ROOT / spec.data.sources[0]), split="train")
    rewards = [BUILTIN_REWARDS[f.name].bind(f.params) for f in spec.rewards.functions]
    out = tempfile.mkdtemp(prefix="trl-bench-")
    cfg = GRPOConfig(
        output_dir=out, use_cpu=not gpu, bf16=gpu, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=spec.completions_per_step // a.gradient_accumulation_steps,
        gradient_accumulation_steps=a.gradient_accumulation_steps, num_generations=r.num_generations,
        max_completion_length=r.max_completion_length, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
        learning_rate=a.learning_rate, lr_scheduler_type="constant", warmup_steps=0, beta=a.beta,
        loss_type=a.loss_type, scale_rewards=a.scale_rewards, epsilon=a.epsilon, max_steps=a.max_steps,
        num_iterations=a.num_iterations, max_grad_norm=a.max_grad_norm, weight_decay=a.weight_decay,
        logging_steps=1, report_to="none", save_strategy="no", seed=a.seed, reward_weights=[f.weight for f in spec.rewards.functions],
        disable_tqdm=True,
    )
    return GRPOTrainer(model=model, reward_funcs=rewards, args=cfg, train_dataset=ds, processing_class=tok,
                       callbacks=callbacks or [])


class StepClock:
    """A TRL callback that records the wall time at each optimizer step's end."""

    def __init__(self) -> None:
        self.times: list[float] = [time.time()]

    def __getattr__(self, name: str):  # every other callback event is a no-op
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        self.times.append(time.time())
