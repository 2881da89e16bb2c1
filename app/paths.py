"""The studio's side of workspace confinement: uploads and safe file names.

Confinement itself (which paths are inside, what a reference resolves to) is `backend.workspace`'s, shared
with the launcher; this module adds what only the studio does: writing a browser's uploads into the workspace,
where a file named "../x.py" must never land elsewhere.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from backend.workspace import PathError
from backend.workspace import Workspace as _Confinement

__all__ = ["PathError", "Workspace", "safe_filename"]

_SAFE_NAME = re.compile(r"[^\w.-]+")


def safe_filename(name: str, default: str = "file") -> str:
    """A bare file name: no directories, no leading dots, only word characters, '.', '-'."""
    base = Path(str(name).replace("\\", "/")).name
    cleaned = _SAFE_NAME.sub("_", base).lstrip(".")
    return cleaned[:120] or default


@dataclass
class Workspace(_Confinement):
    """`backend.workspace.Workspace` plus the studio's uploads."""

    def save_upload(self, tmp_file: str, subdir: str = "uploads") -> str:
        """Copy an uploaded file (Gradio's temp copy) to <root>/<subdir>/<safe name>; return its form path."""
        src = Path(tmp_file)
        dest_dir = self.resolve(subdir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        dest = dest_dir / safe_filename(src.name)
        stem, suffix, n = dest.stem, dest.suffix, 1
        while dest.exists() and not _same_file(dest, src):
            dest = dest_dir / f"{stem}-{n}{suffix}"
            n += 1
        if not self.contains(dest):  # belt and braces: safe_filename already strips separators
            raise PathError(f"{dest} is outside the workspace")
        shutil.copyfile(src, dest)
        return self.rel(dest)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()
    except OSError:
        return False
