"""Workspace confinement: every path the studio reads or writes on a user's behalf stays inside it.

The studio may be reachable from a network (`--host 0.0.0.0` with auth), so a form field such as
"../../etc/passwd" or an uploaded file named "../x.py" must never make it read or write elsewhere.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from backend.data import is_hub_id, split_source


class PathError(ValueError):
    """A path that leaves the workspace (or is otherwise unusable)."""


_SAFE_NAME = re.compile(r"[^\w.-]+")


def safe_filename(name: str, default: str = "file") -> str:
    """A bare file name: no directories, no leading dots, only word characters, '.', '-'."""
    base = Path(str(name).replace("\\", "/")).name
    cleaned = _SAFE_NAME.sub("_", base).lstrip(".")
    return cleaned[:120] or default


@dataclass
class Workspace:
    """The root the studio works in (relative paths in a RunSpec resolve against it) plus trusted extras.

    `extra` holds roots the operator named on the command line (the runs dir, --allow-path), never
    anything a browser user supplied.
    """

    root: Path
    extra: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        self.extra = [Path(p).resolve() for p in self.extra]

    @property
    def roots(self) -> list[Path]:
        return [self.root, *self.extra]

    def contains(self, path: Path) -> bool:
        p = path.resolve()  # resolves symlinks too: a link pointing outside does not count as inside
        return any(p == r or p.is_relative_to(r) for r in self.roots)

    def resolve(self, user_path: str) -> Path:
        """The absolute path for `user_path` (relative to the root), or PathError when it leaves the workspace."""
        raw = str(user_path).strip()
        if not raw:
            raise PathError("empty path")
        if "\x00" in raw:
            raise PathError("invalid path")
        p = Path(raw).expanduser()
        p = p if p.is_absolute() else self.root / p
        if not self.contains(p):
            raise PathError(f"{raw} is outside the workspace ({self.root})")
        return p.resolve()

    def check_ref(self, ref: str, allow_hub: bool = True) -> str | None:
        """Error message for a model/data reference outside the workspace; hub ids pass. None = fine."""
        try:
            path, _ = split_source(ref)
        except ValueError:
            path = ref  # the count is reported by check_spec; only the path matters here
        if allow_hub and is_hub_id(path):
            return None
        try:
            self.resolve(path)
        except PathError as err:
            return str(err)
        return None

    def rel(self, path: Path) -> str:
        """Path as shown in the form: relative to the root when inside it."""
        p = Path(path).resolve()
        return str(p.relative_to(self.root)) if p.is_relative_to(self.root) else str(p)

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
