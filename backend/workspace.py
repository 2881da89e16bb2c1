"""Workspace confinement: the roots a run's paths must stay in, so a spec nobody vetted cannot read or run
anything elsewhere.

A spec may come from a browser (the studio can be reachable from a network, with auth) or from a run directory
someone copied in (Resume), so a field such as "../../etc/passwd", a plugin in /tmp or an interpreter that is a
script must be refused before anything reads or runs it. The studio and the launcher confine through this one
class; the check (`backend.checks`) reports what leaves it. Messages say only that a path is outside, never
whether it exists there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from backend.data import is_hub_id, split_source, split_subset


class PathError(ValueError):
    """A path that leaves the workspace (or is otherwise unusable)."""


@dataclass
class Workspace:
    """The root relative paths in a RunSpec resolve against, plus trusted extras.

    `extra` holds roots the operator named (the runs dir, --allow-path), never anything a browser user or a
    run directory supplied.
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
        # a hub id is one that names nothing under the root (not the process's cwd: a link in the workspace
        # pointing outside is a path, and is confined)
        if allow_hub and is_hub_id(split_subset(path)[0], self.root):  # a dataset's 'org/name:subset'
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
