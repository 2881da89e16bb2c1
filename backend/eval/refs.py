"""Which weights a model reference names, and loading them: the one resolver for eval, compare, chat, export.

A reference is one of
- `RUN_DIR`          the run's latest checkpoint (its base model when it has none yet)
- `RUN_DIR:N`        checkpoint step N; `RUN_DIR:base` the run's base model
- `PATH`             a transformers model directory, or a LoRA adapter directory (adapter_config.json;
                     its base from the adapter's base_model_name_or_path)
Relative model paths inside a run's spec resolve against the run's launch directory (status.json
base_dir), as the trainer resolved them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from backend import models
from backend.models import DTYPES, load_media_processor, model_class, model_ref
from backend.rundir import RunDir
from backend.spec import RunSpec, SpecError, load_spec


class ModelRefError(ValueError):
    pass


@dataclass(frozen=True)
class ModelChoice:
    label: str  # "base", "step-40", or the directory name
    weights: Path  # a model directory or an adapter directory
    adapter_base: str | None  # base model of an adapter (path or hub id), None for full weights
    run: RunDir | None = None
    spec: RunSpec | None = None
    step: int | None = None
    base_dir: Path = Path(".")

    @property
    def is_adapter(self) -> bool:
        return self.adapter_base is not None


def _is_run(p: Path) -> bool:
    return (p / "spec.yaml").is_file()


def _run_base_dir(run: RunDir, fallback: Path) -> Path:
    bd = run.read_status().get("base_dir")
    return Path(bd) if bd and Path(bd).is_dir() else fallback


def _adapter_base(weights: Path, spec: RunSpec | None, base_dir: Path) -> str | None:
    cfg = weights / "adapter_config.json"
    if not cfg.is_file():
        return None
    if spec is not None:
        return model_ref(spec, base_dir)
    try:
        base = json.loads(cfg.read_text()).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError) as err:
        raise ModelRefError(f"{cfg}: unreadable adapter config: {err}") from None
    if not base:
        raise ModelRefError(f"{cfg} names no base_model_name_or_path")
    return base


def resolve_model(ref: str, base_dir: str | Path = ".") -> ModelChoice:
    """See the module docstring; a reference that names nothing loadable raises ModelRefError saying why."""
    base_dir = Path(base_dir)
    head, sep, tail = ref.rpartition(":")
    path_s, which = (head, tail) if sep and _is_run(_abs(head, base_dir)) else (ref, "")
    p = _abs(path_s, base_dir)
    if _is_run(p):
        run = RunDir(p)
        try:
            spec = load_spec(run.spec_path)
        except SpecError as err:
            raise ModelRefError(f"{p}: its spec.yaml is invalid: {err}") from None
        rbase = _run_base_dir(run, base_dir)
        if which == "base":
            return ModelChoice("base", Path(model_ref(spec, rbase)), None, run, spec, 0, rbase)
        if which:
            if not which.isdigit():
                raise ModelRefError(f"{ref!r}: after ':' give a checkpoint step or 'base', not {which!r}")
            ckpt = run.checkpoints_dir / f"step-{int(which)}"
            if not (ckpt / "COMPLETE").exists():
                have = [c.name for c in run.checkpoints()] or ["none"]
                raise ModelRefError(f"{ref!r}: run has no complete checkpoint step-{int(which)} (has: {', '.join(have)})")
        else:
            ckpt = run.latest_checkpoint()
            if ckpt is None:
                return ModelChoice("base", Path(model_ref(spec, rbase)), None, run, spec, 0, rbase)
        weights = ckpt / "model"
        return ModelChoice(ckpt.name, weights, _adapter_base(weights, spec, rbase), run, spec,
                           int(ckpt.name.split("-")[1]), rbase)
    if not p.is_dir():
        raise ModelRefError(f"model {ref!r}: no such directory (give a model folder, an adapter folder, "
                            f"or a run directory, optionally RUN_DIR:STEP)")
    if not (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():
        raise ModelRefError(f"model {ref!r}: {p} has neither config.json nor adapter_config.json")
    return ModelChoice(p.name, p, _adapter_base(p, None, base_dir), base_dir=base_dir)


def _abs(p: str, base_dir: Path) -> Path:
    q = Path(p).expanduser()
    return q if q.is_absolute() else base_dir / q


def _tokenizer_dir(choice: ModelChoice) -> str:
    if (choice.weights / "tokenizer_config.json").is_file() or not choice.is_adapter:
        return str(choice.weights)
    return str(choice.adapter_base)


def load_tokenizer(choice: ModelChoice):
    """The chosen model's tokenizer (backend.models.load_tokenizer), from the adapter's base unless the weights'
    folder has its own."""
    return models.load_tokenizer(_tokenizer_dir(choice), bool(choice.spec and choice.spec.model.trust_remote_code))


def load_processor(choice: ModelChoice, tokenizer, audio: bool = False):
    """The model's media processor (backend.models.load_media_processor), from the weights' folder when it has the
    processor's config (a trainer checkpoint saves it there), else from the adapter's base."""
    trust = bool(choice.spec and choice.spec.model.trust_remote_code)
    has = any((choice.weights / n).is_file() for n in ("preprocessor_config.json", "processor_config.json"))
    return load_media_processor(str(choice.weights if has or not choice.is_adapter else choice.adapter_base),
                                tokenizer, audio, trust)


def model_config(choice: ModelChoice):
    """The transformers config of the model a choice loads (an adapter's: its base's)."""
    from transformers import AutoConfig

    trust = bool(choice.spec and choice.spec.model.trust_remote_code)
    return AutoConfig.from_pretrained(str(choice.adapter_base or choice.weights), trust_remote_code=trust)


def load_model(choice: ModelChoice, device: str | torch.device = "cpu", dtype: str = "auto", merge: bool = True):
    """The causal LM (or vision-/audio-language model, the class the trainer loads: backend.models.model_class) with its
    adapter applied (merged into the weights when `merge`, the fast path)."""
    trust = bool(choice.spec and choice.spec.model.trust_remote_code)
    if dtype == "auto" and choice.spec is not None:
        dtype = choice.spec.model.dtype
    kw = {"dtype": DTYPES.get(dtype, "auto"), "trust_remote_code": trust}
    if not choice.is_adapter:
        return model_class(str(choice.weights), trust).from_pretrained(str(choice.weights), **kw).to(device).eval()
    from peft import PeftModel

    base = model_class(str(choice.adapter_base), trust).from_pretrained(str(choice.adapter_base), **kw).to(device)
    model = PeftModel.from_pretrained(base, str(choice.weights))
    return (model.merge_and_unload() if merge else model).eval()
