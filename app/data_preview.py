"""The dataset preview on the Build page: the first rows of the first local source, each with the prompt
exactly as the model will see it (chat template applied with the model's own tokenizer, cached).

Only the first rows are read (streaming), and every text cell is clipped to PREVIEW_CHARS before it is
rendered: a 50 MB prompt took 152 s and 1 GB to template and show whole. A clipped cell says how much is left.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from app.model_info import find_model_dir
from backend.data import is_hub_dataset, split_source
from backend.spec import RunSpec

PREVIEW_CHARS = 2000


def _clip(value: Any) -> Any:
    """`value` with every string longer than PREVIEW_CHARS cut there, saying how much was left out."""
    if isinstance(value, str) and len(value) > PREVIEW_CHARS:
        return f"{value[:PREVIEW_CHARS]} … [{len(value) - PREVIEW_CHARS:,} more characters]"
    if isinstance(value, list):
        return [_clip(v) for v in value]
    if isinstance(value, dict):
        return {k: _clip(v) for k, v in value.items()}
    return value


@lru_cache(maxsize=4)
def _tokenizer(model_dir: str, trust_remote_code: bool) -> Any:
    from backend.models import load_tokenizer  # transformers loads on the first preview, not with the page

    return load_tokenizer(model_dir, trust_remote_code)


def preview_rows(spec: RunSpec, base: Path, n: int = 5) -> tuple[list[dict[str, Any]], str]:
    """First rows of the first local source, each with the prompt exactly as the model sees it.

    Returns (rows, note) where each row has 'source', 'rendered', 'columns' and 'images' (the row's image
    paths; thumbnails of every kind of image cell come from app.media).
    """
    from backend.data import head_rows, render_prompt
    from backend.multimodal import render_mm_text

    note = ""
    local = []
    for ref in spec.data.sources:
        path, _ = split_source(ref)
        if not is_hub_dataset(path, base):
            local.append(path)
    if not local:
        return [], "hub datasets are previewed after download; no local source"
    src = local[0]
    p = Path(src) if Path(src).is_absolute() else base / src
    rows = [_clip(r) for r in head_rows(p, n)]
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
            if tok is None:
                rendered = _plain(row, spec)
            elif spec.data.images_column or spec.data.videos_column or spec.data.audios_column:  # media placeholders
                rendered = render_mm_text(row, spec.data, tok)
            else:
                rendered = render_prompt(row, spec.data, tok)
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
