"""Export a servable model: merge a LoRA adapter into its base and save a standard transformers folder.

    python -m backend.eval.export --model RUN_DIR[:STEP] --out DIR [--dtype bfloat16] [--push org/name]

The folder holds config.json, model.safetensors (sharded past 5 GB), the tokenizer and
generation_config.json: what vLLM, LMDeploy and transformers load directly. Full-weight checkpoints
are re-saved the same way (without optimizer state). `--push` uploads with huggingface_hub and fails
with a clear message when the hub cannot be reached (this machine may be offline).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from backend.eval.refs import ModelChoice, ModelRefError, load_model, load_processor, load_tokenizer, resolve_model
from backend.multimodal import is_audio_config, is_vision_config


class ExportError(RuntimeError):
    pass


@dataclass(frozen=True)
class Exported:
    path: Path
    size_bytes: int
    merged_adapter: bool


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


def export_model(choice: ModelChoice, out: Path, dtype: str = "auto") -> Exported:
    """Merge (when an adapter) and save to `out` (created; must be empty if it exists)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"export folder {out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(choice, "cpu", dtype, merge=True)
    tok = load_tokenizer(choice)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if is_vision_config(model.config) or is_audio_config(model.config):  # the image (audio) processor's config too
        load_processor(choice, tok, audio=not is_vision_config(model.config)).save_pretrained(out)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)
    return Exported(out, folder_size(out), choice.is_adapter)


def push_to_hub(folder: Path, repo_id: str, token: str | None = None) -> str:
    """Upload the folder; a hub that cannot be reached raises ExportError saying so."""
    import os

    from huggingface_hub import HfApi

    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        raise ExportError(f"cannot push to {repo_id}: HF_HUB_OFFLINE is set (this machine works offline); "
                          f"the model is saved in {folder}")
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id)
    except Exception as err:  # connection, auth, DNS: all end the same way for the user
        raise ExportError(f"cannot push to {repo_id}: {type(err).__name__}: {err}. "
                          f"The model is saved in {folder}") from None
    return f"https://huggingface.co/{repo_id}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backend.eval.export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="RUN_DIR, RUN_DIR:STEP, a checkpoint's model dir, an adapter dir")
    ap.add_argument("--out", required=True, help="new (or empty) folder to write")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--push", default="", help="hub repo id to upload to (needs network and a token)")
    a = ap.parse_args(argv)
    try:
        ex = export_model(resolve_model(a.model), Path(a.out), a.dtype)
    except (ModelRefError, ExportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"saved {'merged ' if ex.merged_adapter else ''}model to {ex.path} ({human_size(ex.size_bytes)})")
    if a.push:
        try:
            print(f"pushed to {push_to_hub(ex.path, a.push)}")
        except ExportError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
