"""Loading a model and its tokenizer: the one place that resolves model paths, dtypes and devices.

Used by the trainer's builders, the rollout engines and worker, the reward model, the reward checker and
evaluation, so a tokenizer is loaded (with its pad fix) one way everywhere; loads weights only when asked
(nothing here touches a hub unless the spec names a hub id).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from backend.data import is_hub_id
from backend.spec import RunSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def resolve_device(spec: RunSpec) -> torch.device:
    if spec.on_gpu(torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("resources.device is 'cuda' but no CUDA GPU is visible; use device cpu or auto")
        gpus = spec.resources.train_gpus  # one at most: backend.checks rejects more before launch
        return torch.device(f"cuda:{gpus[0]}" if gpus else "cuda")
    return torch.device("cpu")


def model_ref(spec: RunSpec, base_dir: Path) -> str:
    ref = spec.model.name_or_path
    if is_hub_id(ref, base_dir) or Path(ref).is_absolute():
        return ref
    return str(base_dir / ref)


def load_tokenizer(ref: str | Path, trust_remote_code: bool = False):
    """The tokenizer at `ref` (a model directory or hub id), the one way every part loads one: left padding (a
    batch of prompts ends where generation starts) and a pad token (the eos token where the model has none, since
    batching and the reward model's last-token lookup need one)."""
    tok = _generic_tokenizer(Path(ref)) or AutoTokenizer.from_pretrained(str(ref), trust_remote_code=trust_remote_code)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _generic_tokenizer(path: Path):  # noqa: ANN202 - a transformers tokenizer, or None
    """A local tokenizer saved as the generic fast tokenizer (tokenizer_class TokenizersBackend or
    PreTrainedTokenizerFast, as the shipped tiny models are), loaded as exactly that. AutoTokenizer would pick the
    model type's class instead (Qwen2Tokenizer for a qwen2 config), which rebuilds the pre-tokenizer from its own
    rules and drops the whitespace characters a character-level vocabulary holds, so the tokens would not be the
    ones the model was trained on."""
    cfg = path / "tokenizer_config.json"
    if not (path / "tokenizer.json").is_file() or not cfg.is_file():
        return None
    try:
        declared = json.loads(cfg.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    if declared not in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        return None
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))


def spec_tokenizer(spec: RunSpec, base_dir: Path):
    """load_tokenizer for the spec's model (a relative path resolves against base_dir)."""
    return load_tokenizer(model_ref(spec, base_dir), spec.model.trust_remote_code)


def compute_dtype(spec: RunSpec) -> torch.dtype | None:
    """Full fine-tuning in bf16 keeps fp32 master weights (bf16 weights would swallow small Adam updates)
    and computes under bf16 autocast; this is that autocast dtype, or None for plain compute."""
    return torch.bfloat16 if spec.model.finetune == "full" and spec.model.dtype == "bfloat16" else None


def model_class(ref: str, trust_remote_code: bool = False):
    """AutoModelForCausalLM, or AutoModelForImageTextToText for a vision-language model, AutoModelForMultimodalLM
    for an audio-language model (Qwen2-VL, Qwen2-Audio and the like are not causal-LM auto classes, though they
    generate text the same way)."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoModelForMultimodalLM

    from backend.multimodal import is_audio_config, is_vision_config

    cfg = AutoConfig.from_pretrained(ref, trust_remote_code=trust_remote_code)
    if is_vision_config(cfg):
        return AutoModelForImageTextToText
    return AutoModelForMultimodalLM if is_audio_config(cfg) else AutoModelForCausalLM


def load_base(spec: RunSpec, base_dir: Path, device: torch.device, weights: str | None = None,
              dtype: torch.dtype | str | None = None) -> PreTrainedModel:
    ref = weights or model_ref(spec, base_dir)
    model = model_class(ref, spec.model.trust_remote_code).from_pretrained(
        ref, dtype=dtype or DTYPES[spec.model.dtype], trust_remote_code=spec.model.trust_remote_code,
    )
    return model.to(device)


def load_vision_processor(spec: RunSpec, base_dir: Path, tokenizer):
    """The processor for multimodal prompts (backend.multimodal): image processor + tokenizer for images and videos,
    the model's own processor for audio."""
    return load_media_processor(model_ref(spec, base_dir), tokenizer, bool(spec.data.audios_column),
                                spec.model.trust_remote_code)


def load_media_processor(ref: str, tokenizer, audio: bool = False, trust_remote_code: bool = False):
    """load_vision_processor for a model directory without a RunSpec (evaluation of a bare model or checkpoint)."""
    from backend.multimodal import AudioProcessor, VisionProcessor

    if audio:
        return AudioProcessor.from_pretrained(ref, trust_remote_code)
    return VisionProcessor.from_pretrained(ref, tokenizer, trust_remote_code)
