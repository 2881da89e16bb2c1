"""The memory a run needs, by part, before it starts: what the planner shows and what the check refuses.

`footprint(spec, shape)` adds up, per process that trains (the trainer; per GPU on a GPU), in bytes:
  weights        the policy's parameters in their training dtype (float32 master weights for full fine-tuning)
  gradients      one per trainable parameter (float32)
  optimizer      AdamW's two moments per trainable parameter (float32)
  reference      the frozen reference model when algorithm.beta > 0 (full fine-tuning; LoRA disables the adapter)
  logits         the LM head's logits alive at once: one slice of `logprob_chunk_tokens` (the slice, its softmax and
                 the backward's copy), and the sliced backward's float32 accumulator of the head's gradient
  activations    what autograd keeps for the backward of one micro-batch: per token and layer the inputs of the
                 norms, projections and MLP (float32), plus the attention probabilities of the math kernel; with
                 gradient checkpointing one hidden state per token and layer, plus one layer's while it recomputes
  engine         the sampler's own memory: the KV cache of a rollout (rows x tokens x layers x keys and values) and
                 its decode-step logits; a copy of the weights when the engine does not share them (async hf,
                 colocated vLLM / LMDeploy reserve gpu_memory_utilization of the GPU instead, counted there)
It is an estimate for planning, not a bound: bench/RESULTS.md compares it with what bench.memory measures (the
allocator, the interpreter and libraries come on top). `memory_issues` refuses a run whose estimate exceeds the
machine's memory (GPU memory per training GPU, else the host's RAM), naming the options that lower each large
part.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.machine import Machine
from backend.spec import RunSpec, SpecIssue

GIB = 2**30
LOGITS_BUDGET_MB = 256  # what one LM-head slice may hold (its logits, their softmax and the backward's copy)
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
_FLOAT = 4


def auto_chunk(vocab_size: int, budget_mb: int = LOGITS_BUDGET_MB) -> int:
    """Tokens per LM-head slice so that one slice's logits, their softmax and the backward's copy (~3 x chunk x V
    floats) stay within `budget_mb`; at least 16 tokens."""
    return max(16, (budget_mb << 20) // (3 * _FLOAT * max(1, vocab_size)))


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads of a decoder-only model's config.json (Llama / Qwen / Mistral layout)."""

    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool

    @property
    def params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * self.heads * self.head_dim * 2 + h * kv * 2  # q and o, k and v
        mlp = 3 * h * self.intermediate
        return self.layers * (attn + mlp + 2 * h) + self.vocab * h * (1 if self.tied else 2) + h

    @staticmethod
    def from_config(cfg: dict[str, Any]) -> ModelShape | None:
        c = cfg.get("text_config") or cfg
        try:
            h, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
            return ModelShape(int(c["vocab_size"]), h, int(c["num_hidden_layers"]),
                              int(c.get("intermediate_size") or 4 * h), heads,
                              int(c.get("num_key_value_heads") or heads), int(c.get("head_dim") or h // heads),
                              bool(cfg.get("tie_word_embeddings", c.get("tie_word_embeddings", False))))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None

    @staticmethod
    def of_model_dir(path: Path) -> ModelShape | None:
        try:
            cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return ModelShape.from_config(cfg) if isinstance(cfg, dict) else None


@dataclass(frozen=True)
class Footprint:
    """Bytes per part (the module docstring); `total` is their sum."""

    weights: int
    gradients: int
    optimizer: int
    reference: int
    logits: int
    activations: int
    engine: int

    @property
    def total(self) -> int:
        return sum(self.parts().values())

    def parts(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "reference": self.reference, "logits": self.logits, "activations": self.activations,
                "engine": self.engine}

    def line(self) -> str:
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.parts().items() if v)
        return f"memory ≈ {self.total / GIB:.1f} GiB per training process ({parts} GiB)"


# what lowers each part, for the refusal's sentence
_REMEDIES = {
    "logits": "algorithm.logprob_chunk_tokens (smaller slices)",
    "activations": "model.gradient_checkpointing, algorithm.gradient_accumulation_steps (smaller micro-batches), "
                   "rollout.max_completion_length",
    "engine": "rollout.max_completion_length, algorithm.prompts_per_step or rollout.num_generations",
    "reference": "algorithm.beta = 0 (no reference model) or model.finetune = lora",
    "optimizer": "model.finetune = lora",
    "gradients": "model.finetune = lora",
    "weights": "a smaller model or model.dtype bfloat16",
}


def spec_shape(spec: RunSpec, base_dir: str | Path) -> ModelShape | None:
    """The shape of the spec's model when it is a local directory (relative to base_dir); None otherwise."""
    path = Path(spec.model.name_or_path).expanduser()
    path = path if path.is_absolute() else Path(base_dir) / path
    return ModelShape.of_model_dir(path) if path.is_dir() else None


def footprint(spec: RunSpec, shape: ModelShape, prompt_tokens: int = 256) -> Footprint:
    """The estimate of the module docstring; `prompt_tokens`: the longest prompt in tokens (a guess without data)."""
    m, a, r = spec.model, spec.algorithm, spec.rollout
    n = shape.params
    full = m.finetune == "full"
    # LoRA: r x (in + out) per wrapped projection; counted as if every linear layer were wrapped (an upper bound)
    lora = 0 if full else shape.layers * m.lora_rank * (4 * 2 * shape.hidden + 3 * (shape.hidden + shape.intermediate))
    trainable = n if full else lora
    on_cpu = spec.resources.device == "cpu"
    dtype = _FLOAT if full or (m.dtype == "auto" and on_cpu) else _DTYPE_BYTES.get(m.dtype, 2)
    weights = n * dtype + (lora * _FLOAT if not full else 0)
    reference = n * dtype if a.beta > 0 and full else 0
    rows = max(1, spec.completions_per_step // a.gradient_accumulation_steps)  # a micro-batch's completions
    Lc, G = r.max_completion_length, r.num_generations
    tokens = rows * (Lc + max(1, prompt_tokens // G))  # a group's prompt runs once (shared-prompt packing)
    chunk = a.logprob_chunk_tokens or auto_chunk(shape.vocab)
    h = shape.hidden
    # a slice's logits, softmax and backward copy; plus the sliced backward's float32 head-gradient accumulator
    logits = 3 * _FLOAT * shape.vocab * min(tokens, chunk) + (shape.vocab * h * _FLOAT if full else 0)
    layers = shape.layers
    per_token_layer = (6 * h + 3 * shape.intermediate) * _FLOAT
    seq = prompt_tokens + Lc
    attention = rows * shape.heads * seq * seq * _FLOAT  # per layer, the math kernel's probabilities
    if m.gradient_checkpointing:
        activations = tokens * h * layers * _FLOAT + tokens * per_token_layer + attention
    else:
        activations = tokens * per_token_layer * layers + attention * layers
    B = spec.completions_per_rollout  # the engine samples a whole rollout at once (steps_per_generation)
    kv = B * seq * layers * 2 * shape.kv_heads * shape.head_dim * _FLOAT
    engine = kv + 3 * B * shape.vocab * _FLOAT
    if r.engine == "hf" and r.async_generation and not spec.rollout_in_workers:
        engine += n * dtype  # its own copy of the weights
    if spec.rollout_in_workers or r.engine != "hf":
        engine = 0  # another process, or an engine that reserves its own share of the GPU
    return Footprint(weights, trainable * _FLOAT, 2 * trainable * _FLOAT, reference, logits, activations, engine)


def colocated_need(spec: RunSpec, fp: Footprint, gpu_bytes: float) -> int:
    """What a training GPU must hold when a vLLM / LMDeploy engine shares it (placement colocate): the engine
    reserves gpu_memory_utilization of the GPU. Awake all along, it sits beside the training peak; asleep while
    training (rollout.sleep), it wakes beside what training keeps resident (weights, AdamW's moments, the
    reference), and the training peak needs the GPU alone. 0 when no such engine shares the GPU."""
    r = spec.rollout
    if r.engine == "hf" or r.placement != "colocate" or spec.rollout_in_workers:
        return 0
    reserve = int(r.gpu_memory_utilization * gpu_bytes)
    if not r.sleep:
        return fp.total + reserve
    return max(fp.total, fp.weights + fp.optimizer + fp.reference + reserve)


def memory_issues(spec: RunSpec, base_dir: str | Path, machine: Machine) -> list[SpecIssue]:
    """A refusal when the estimate exceeds the memory a training process has (the smallest training GPU's, else
    the host's RAM), naming what lowers the largest parts; [] when it fits or the model's shape is unknown. On a
    GPU shared with a colocated engine, its reserve counts too (`colocated_need`)."""
    shape = spec_shape(spec, base_dir)
    if shape is None:
        return []
    fp = footprint(spec, shape)
    gpu = spec.on_gpu(bool(machine.gpus))
    have = min((g.memory_gib for g in machine.gpus), default=0.0) * GIB if gpu else machine.ram_gib * GIB
    if not have:
        return []
    shared = colocated_need(spec, fp, have) if gpu else 0
    if shared > have:
        r = spec.rollout
        awake = "asleep while training" if r.sleep else "awake all along (rollout.sleep off)"
        return [SpecIssue("rollout.gpu_memory_utilization",
                          f"training (about {fp.total / GIB:.1f} GiB) and the colocated {r.engine} engine "
                          f"({r.gpu_memory_utilization:.0%} of the GPU, {awake}) need about {shared / GIB:.1f} GiB, "
                          f"more than one {have / GIB:.0f} GiB GPU: "
                          + ("turn on rollout.sleep, " if not r.sleep else "")
                          + "lower rollout.gpu_memory_utilization, or use rollout.placement separate")]
    if fp.total <= have:
        return []
    big = sorted(fp.parts().items(), key=lambda kv: -kv[1])[:3]
    lower = "; ".join(f"{k} {v / GIB:.1f} GiB: {_REMEDIES[k]}" for k, v in big if v)
    where = "per training GPU" if gpu else "of RAM on this machine"
    return [SpecIssue("model.name_or_path", f"the run needs about {fp.total / GIB:.1f} GiB, more than the "
                                            f"{have / GIB:.1f} GiB {where}; the largest parts and what lowers them: "
                                            f"{lower}")]
