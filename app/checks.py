"""Checks the Build tab runs before anything trains: model config, dataset preview, GPUs, reward test.

No weights are loaded: the model check reads config.json and safetensors headers only.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import struct
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from backend.spec import RunSpec, is_hub_id, split_source

PROJECT_ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- model

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


# ----------------------------------------------------------------------------- data

def read_rows(path: Path, n: int = 5) -> list[dict[str, Any]]:
    """The first n rows of a local source without loading all of it."""
    if path.is_dir():
        from datasets import Dataset, load_from_disk

        ds = load_from_disk(str(path))
        if not isinstance(ds, Dataset):
            ds = ds["train"] if "train" in ds else next(iter(ds.values()))
        return ds.select(range(min(n, len(ds)))).to_list()
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        out = []
        with path.open() as f:
            for line in f:
                if line.strip():
                    out.append(json.loads(line))
                    if len(out) >= n:
                        break
        return out
    if suffix == ".json":
        data = json.loads(path.read_text())
        rows = data if isinstance(data, list) else next((v for v in data.values() if isinstance(v, list)), [])
        return rows[:n]
    if suffix == ".csv":
        with path.open(newline="") as f:
            return [row for _, row in zip(range(n), csv.DictReader(f))]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        batch = next(pf.iter_batches(batch_size=n), None)
        return batch.to_pylist() if batch is not None else []
    raise ValueError(f"unsupported format {suffix!r}")


@lru_cache(maxsize=4)
def _tokenizer(model_dir: str, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)


def preview_rows(spec: RunSpec, base: Path, n: int = 5) -> tuple[list[dict[str, Any]], str]:
    """First rows of the first local source, each with the prompt exactly as the model sees it.

    Returns (rows, note) where each row has 'source', 'rendered', 'columns' and 'images'.
    """
    from backend.data import render_prompt

    note = ""
    local = []
    for ref in spec.data.sources:
        path, _ = split_source(ref)
        if not is_hub_id(path):
            local.append(path)
    if not local:
        return [], "hub datasets are previewed after download; no local source"
    src = local[0]
    p = Path(src) if Path(src).is_absolute() else base / src
    rows = read_rows(p, n)
    tok = None
    mdir = find_model_dir(spec.model.name_or_path, base)
    if mdir is not None:
        try:
            tok = _tokenizer(str(mdir), spec.model.trust_remote_code)
        except Exception as err:  # show the rows anyway, without the template
            note = f"tokenizer not loaded ({type(err).__name__}: {err}); prompts shown without a chat template"
    else:
        note = "model not available locally; prompts shown without a chat template"
    out = []
    for row in rows:
        try:
            rendered = render_prompt(row, spec.data, tok) if tok is not None else _plain(row, spec)
        except Exception as err:
            rendered = f"⚠ {err}"
        images = row.get(spec.data.images_column) if spec.data.images_column else None
        if isinstance(images, str):
            images = [images]
        out.append({"source": src, "rendered": rendered, "columns": row,
                    "images": [str(i) for i in images or [] if isinstance(i, str)]})
    return out, note


def _plain(row: dict[str, Any], spec: RunSpec) -> str:
    prompt = row.get(spec.data.prompt_column, "")
    text = json.dumps(prompt, ensure_ascii=False) if isinstance(prompt, list) else str(prompt)
    return f"{spec.data.system_prompt}\n{text}" if spec.data.system_prompt else text


# ----------------------------------------------------------------------------- GPUs

@lru_cache(maxsize=1)
def detect_gpus() -> tuple[tuple[int, str, float], ...]:
    """(index, name, memory GiB) of visible NVIDIA GPUs via nvidia-smi; () when none (no torch import)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            try:
                gpus.append((int(parts[0]), parts[1], float(parts[2]) / 1024))
            except ValueError:
                continue
    return tuple(gpus)


def plan(spec: RunSpec, gpus: tuple[tuple[int, str, float], ...]) -> tuple[bool, list[str]]:
    """The placement planner's verdict in plain words: (ok, lines)."""
    r, res = spec.rollout, spec.resources
    lines: list[str] = []
    ok = True
    visible = [g[0] for g in gpus]
    on_cpu = res.device == "cpu" or (res.device == "auto" and not gpus)
    if res.device == "cuda" and not gpus:
        return False, ["device is cuda but no GPU is visible on this machine; choose cpu"]
    if on_cpu:
        if r.engine != "hf":
            return False, [f"engine {r.engine} needs GPUs; use hf on CPU"]
        threads = res.num_threads or "default"
        return True, [f"CPU: training and sampling (hf engine) in one process, torch threads: {threads}"]
    train = res.train_gpus or ([g for g in visible if g not in res.rollout_gpus] if r.placement == "separate" else visible)
    missing = sorted(set(res.train_gpus + res.rollout_gpus) - set(visible))
    if missing:
        ok = False
        lines.append(f"GPUs {missing} are not visible (visible: {visible})")
    if r.placement == "colocate":
        sleep = "sleeps while training" if r.sleep else "stays resident"
        lines.append(f"colocated: training and {r.engine} sampling share GPUs {train}; engine {sleep}, "
                     f"memory fraction {r.gpu_memory_utilization}")
    else:
        lines.append(f"separate: training on GPUs {train}, {r.engine} sampling on GPUs {res.rollout_gpus} "
                     f"({r.data_parallel_size} instance(s) x TP {r.tensor_parallel_size})")
        if r.engine == "hf":
            ok = False
            lines.append("separate rollout GPUs need vllm or lmdeploy")
        if set(train) & set(res.rollout_gpus):
            ok = False
            lines.append("training and rollout GPU sets overlap")
    if len(train) > 1:
        lines.append(f"data parallel training over {len(train)} GPUs" +
                     (f", DeepSpeed ZeRO-{res.deepspeed_stage}" if res.deepspeed_stage else ""))
    if r.async_generation:
        lines.append("async: sampling batch t+1 while training on batch t (one step off-policy)")
    return ok, lines


# ----------------------------------------------------------------------------- rewards

def score_rewards(spec: RunSpec, base: Path, rows: int = 8, completions: str = "solution",
                 timeout_s: float = 180.0) -> dict[str, Any]:
    """Score a few dataset rows with the spec's rewards through `python -m backend.rewards check --json`, in a
    separate process (user reward code never runs in the studio process).

    Returns {'functions': [...], 'samples': [...]} (partial failures included), or {'error': str}, or
    {'unavailable': str} when the rewards layer has no checker."""
    if importlib.util.find_spec("backend.rewards.check") is None:
        return {"unavailable": "backend.rewards.check is missing"}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "spec.yaml"
        cfg.write_text(spec.to_yaml())
        cmd = [sys.executable, "-m", "backend.rewards", "check", "--spec", str(cfg), "--rows", str(rows),
               "--completions", completions, "--base-dir", str(base), "--json"]
        try:
            proc = subprocess.run(cmd, cwd=str(base), capture_output=True, text=True, timeout=timeout_s, env=_env())
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f}s"}
    if proc.returncode in (0, 1) and proc.stdout.strip():
        try:
            return json.loads(proc.stdout)  # NaN is accepted by Python's json
        except json.JSONDecodeError:
            pass
    err = proc.stderr.strip().splitlines()
    return {"error": "\n".join(err[-6:]) if err else f"exit status {proc.returncode}"}


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH", "")]))
    return env
