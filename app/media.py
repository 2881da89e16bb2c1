"""Images in the studio: small inline thumbnails (data URIs) for the dataset preview and the samples browser.

A reference is what a dataset cell or samples.jsonl holds: a path (resolved inside the workspace; a path
that leaves it is not shown), raw bytes or a datasets Image dict. Thumbnails are PNG data URIs, so Gradio
serves no files for them; they are cached by path and modification time.
"""

from __future__ import annotations

import base64
import io
from functools import lru_cache
from pathlib import Path
from typing import Any

from app.paths import PathError, Workspace
from backend.multimodal import MediaError, load_image, media_items

THUMB_PX = 160


def _uri(img: Any) -> str:
    img = img.copy()
    img.thumbnail((THUMB_PX, THUMB_PX))
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


@lru_cache(maxsize=512)
def _path_uri(path: str, _mtime: int) -> str | None:
    try:
        return _uri(load_image(path, Path("/")))
    except MediaError:
        return None


def thumb_uris(cell: Any, workspace: Workspace) -> list[str]:
    """Data URIs for the images of a dataset cell or a samples.jsonl 'images' list ('<N bytes>' markers and
    unreadable or out-of-workspace images are skipped)."""
    out = []
    for item in media_items(cell):
        if isinstance(item, dict) and not item.get("bytes"):
            item = item.get("path")
        if isinstance(item, str):
            if item.startswith("<"):  # samples.jsonl's marker for inline bytes: nothing to show
                continue
            try:
                p = workspace.resolve(item)
                uri = _path_uri(str(p), p.stat().st_mtime_ns)
            except (PathError, OSError):
                continue
        else:
            try:
                uri = _uri(load_image(item, workspace.root))
            except MediaError:
                continue
        if uri:
            out.append(uri)
    return out


def img_tags(uris: list[str], css_class: str = "gs-thumb") -> str:
    return "".join(f'<img class="{css_class}" src="{u}" alt="image">' for u in uris)
