"""The model check on the Build page: architecture and parameter count from config.json and the
safetensors headers, without loading weights (a 7B model is checked in milliseconds)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from backend.data import is_hub_id


def safetensors_params(model_dir: Path) -> int | None:
    """Exact parameter count from the safetensors headers (8-byte length + JSON), without reading weights."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > 100_000_000:  # not a sane header
                return None
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            size = 1
            for d in meta.get("shape", []):
                size *= int(d)
            total += size
    return total


def estimate_params(cfg: dict[str, Any]) -> int | None:
    """Decoder-only transformer estimate from config.json (Llama/Qwen/Mistral layout; MoE experts counted)."""
    c = cfg.get("text_config") or cfg
    try:
        h, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(c.get("num_attention_heads") or 1)
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or h // heads)
    inter = int(c.get("intermediate_size") or 4 * h)
    experts = int(c.get("num_experts") or c.get("num_local_experts") or 1)
    moe_inter = int(c.get("moe_intermediate_size") or inter)
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if c.get("attention_bias") or c.get("model_type", cfg.get("model_type", "")).startswith("qwen2"):
        attn += heads * hd + 2 * kv * hd  # q/k/v biases (Qwen2 always has them)
    mlp = 3 * h * inter if experts == 1 else experts * 3 * h * moe_inter + h * experts
    per_layer = attn + mlp + 2 * h
    emb = vocab * h
    head = 0 if c.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)) else vocab * h
    return layers * per_layer + emb + head + h


def human_count(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return str(n)


def find_model_dir(ref: str, base: Path) -> Path | None:
    """A local model directory, or the hub cache's snapshot of a hub id (no download here)."""
    p = Path(ref).expanduser()
    p = p if p.is_absolute() else base / p
    if p.is_dir():
        return p
    if is_hub_id(ref):
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(ref, "config.json")
            if isinstance(hit, str):
                return Path(hit).parent
        except Exception:
            return None
    return None


def model_summary(model_dir: Path) -> dict[str, Any]:
    cfg_path = model_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    text = cfg.get("text_config") or cfg
    exact = safetensors_params(model_dir)
    tok_cfg = model_dir / "tokenizer_config.json"
    has_template = (model_dir / "chat_template.jinja").exists() or (
        tok_cfg.exists() and "chat_template" in json.loads(tok_cfg.read_text() or "{}"))
    return {
        "architecture": ", ".join(cfg.get("architectures") or []) or cfg.get("model_type", "?"),
        "model_type": cfg.get("model_type", "?"),
        "parameters": exact if exact is not None else estimate_params(cfg),
        "parameters_exact": exact is not None,
        "hidden_size": text.get("hidden_size"),
        "layers": text.get("num_hidden_layers"),
        "heads": text.get("num_attention_heads"),
        "kv_heads": text.get("num_key_value_heads"),
        "vocab_size": text.get("vocab_size"),
        "max_positions": text.get("max_position_embeddings"),
        "dtype": cfg.get("torch_dtype") or cfg.get("dtype") or text.get("dtype"),
        "multimodal": "vision_config" in cfg,
        "chat_template": has_template,
    }
