"""What one studio process serves: its workspace, runs folder and presets folder."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from app.paths import Workspace
from app.store import RunStore
from backend.project import PROJECT_ROOT


@dataclass
class StudioConfig:
    workspace: Workspace
    runs_dir: Path
    presets_dir: Path
    export_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="grpo-studio-export-")))
    store: RunStore = field(default_factory=RunStore)
    # Live-update periods. Each redraw costs every open browser Plotly and layout work, so new steps are
    # drawn at most every redraw_s; a changed view (run, axis, smoothing, filters) is drawn at once.
    refresh_s: float = 2.0  # run list, progress, log
    redraw_s: float = 2.0  # charts
    samples_redraw_s: float = 5.0  # samples browser and reward histogram, when following the latest step

    @classmethod
    def create(cls, workspace: str | Path = ".", runs_dir: str | Path | None = None,
               presets_dir: str | Path | None = None, allow_paths: list[str] | None = None) -> StudioConfig:
        root = Path(workspace).resolve()
        runs = Path(runs_dir) if runs_dir else root / "runs"
        runs = (runs if runs.is_absolute() else root / runs).resolve()
        presets = Path(presets_dir) if presets_dir else PROJECT_ROOT / "presets"
        presets = (presets if presets.is_absolute() else root / presets).resolve()
        runs.mkdir(parents=True, exist_ok=True)
        # the runs and presets folders were named by the operator, so they are trusted roots too
        ws = Workspace(root, [runs, presets, *[Path(p) for p in allow_paths or []]])
        return cls(ws, runs, presets)

    def runs_dir_for_form(self) -> str:
        """output.runs_dir as the form shows it (relative to the workspace when inside)."""
        return self.workspace.rel(self.runs_dir)

    def same_runs_dir(self, value: str) -> bool:
        p = Path(value).expanduser()
        p = p if p.is_absolute() else self.workspace.root / p
        return p.resolve() == self.runs_dir
