"""Shared pieces of the benchmarks: our trainer on a spec in a throwaway run dir, and TRL's on the same task."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

from backend.rundir import create_run, read_jsonl
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
        trainer = GRPOTrainer(spec, run, ROOT).setup()
        if on_step is not None:
            trainer.on_step = on_step
        trainer.train()
        return read_jsonl(run.metrics_path)[0]


def trl_trainer(spec: RunSpec, callbacks: list[Any] | None = None, gpu: bool = False):
    """TRL's GRPOTrainer configured like `spec`: float32 weights, gradient checkpointing as ours has it
    (spec.model.gradient_checkpointing), and bf16 autocast exactly when ours has it (spec.model.dtype bfloat16) or on
    a GPU."""
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
        output_dir=out, use_cpu=not gpu, bf16=gpu or spec.model.dtype == "bfloat16", fp16=False,
        gradient_checkpointing=spec.model.gradient_checkpointing,
        per_device_train_batch_size=spec.completions_per_step // a.gradient_accumulation_steps,
        gradient_accumulation_steps=a.gradient_accumulation_steps, num_generations=r.num_generations,
        max_completion_length=r.max_completion_length, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
        learning_rate=a.learning_rate, beta=a.beta, warmup_steps=a.warmup_steps,
        lr_scheduler_type={"constant": "constant_with_warmup"}.get(a.lr_scheduler, a.lr_scheduler),
        loss_type=a.loss_type, scale_rewards=a.scale_rewards, epsilon=a.epsilon, max_steps=a.max_steps,
        num_iterations=a.num_iterations, max_grad_norm=a.max_grad_norm, weight_decay=a.weight_decay,
        logging_steps=1, report_to="none", save_strategy="no", seed=a.seed, reward_weights=[f.weight for f in spec.rewards.functions],
        disable_tqdm=True,
    )
    return GRPOTrainer(model=model, reward_funcs=rewards, args=cfg, train_dataset=ds, processing_class=tok,
                       callbacks=callbacks or [])


def best_time(fn: Callable[[], Any], reps: int = 10) -> float:
    """Seconds per call of fn: the best of 3 rounds of `reps` calls, after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def cpu_seconds() -> float:
    """CPU seconds of this process and its live child processes (rollout workers), so far."""
    total = time.process_time()
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # exited in between
            pass
    return total


class StepClock:
    """A TRL callback that records the wall time at each optimizer step's end."""

    def __init__(self) -> None:
        self.times: list[float] = [time.time()]
        self.cpu: list[float] = [time.process_time()]  # this process's CPU seconds: robust to a shared machine

    def __getattr__(self, name: str):  # every other callback event is a no-op
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        self.times.append(time.time())
        self.cpu.append(time.process_time())


def random_model(dest: Path, *, hidden: int | None = None, layers: int | None = None, intermediate: int | None = None,
                 heads: int | None = None, never_stop: bool = True, seed: int = 0) -> Path:
    """A random-initialised Qwen2 in `dest` with the tiny model's tokenizer; nothing is downloaded.

    Sizes default to the tiny model's config (a same-size copy). With `never_stop` the EOS token is a
    token added to the tokenizer past the model's vocabulary, which the model cannot emit: every
    completion runs to max_completion_length, in both trainers.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src = ROOT / "assets/tiny-add"
    cfg = AutoConfig.from_pretrained(src)
    for name, value in (("hidden_size", hidden), ("num_hidden_layers", layers), ("intermediate_size", intermediate),
                        ("num_attention_heads", heads), ("num_key_value_heads", heads)):
        if value is not None:
            setattr(cfg, name, value)
    if hidden is not None and heads is not None:
        cfg.head_dim = hidden // heads
    cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
    cfg.max_position_embeddings = 1024
    tok = AutoTokenizer.from_pretrained(src)
    if never_stop:
        tok.add_special_tokens({"eos_token": "<|never|>"})
        assert tok.eos_token_id >= cfg.vocab_size, "the never-emitted EOS must lie past the model's vocabulary"
    cfg.eos_token_id = tok.eos_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


def param_count(model_dir: Path) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())
