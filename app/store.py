"""Incremental readers of run directories, shared by every browser session of the studio.

Each run's metrics.jsonl and samples.jsonl are read from the byte offset where the last read stopped,
so a live dashboard costs only the new lines per tick. samples.jsonl can be large (every completion of
every logged step), so only per-step byte ranges and rewards are kept; a step's rows are read on demand.
A file that shrinks or is replaced (resume truncates rows past the checkpoint) resets its cache.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.figures import MetricTable
from backend.rundir import RunDir


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_dev


@dataclass
class _Samples:
    offset: int = 0
    file_id: tuple[int, int] | None = None
    ranges: dict[int, list[int]] = field(default_factory=dict)  # step -> [start byte, end byte]
    rewards: dict[int, list[float]] = field(default_factory=dict)


@dataclass
class RunCache:
    path: Path
    metrics_offset: int = 0
    metrics_id: tuple[int, int] | None = None
    table: MetricTable = field(default_factory=MetricTable)
    version: int = 0  # bumps whenever the table grows or resets: lets sessions skip redrawing
    samples: _Samples = field(default_factory=_Samples)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh_metrics(self) -> MetricTable:
        run = RunDir(self.path)
        with self.lock:
            fid = _file_id(run.metrics_path)
            size = run.metrics_path.stat().st_size if fid else 0
            if fid != self.metrics_id or size < self.metrics_offset:
                self.metrics_offset, self.table, self.metrics_id = 0, MetricTable(), fid
                self.version += 1
            if fid is None:
                return self.table
            rows, self.metrics_offset = run.read_metrics(self.metrics_offset)
            if rows:
                self.table.extend(rows)
                self.version += 1
            return self.table

    def refresh_samples(self) -> _Samples:
        path = RunDir(self.path).samples_path
        with self.lock:
            s = self.samples
            fid = _file_id(path)
            if fid is None:
                self.samples = _Samples()
                return self.samples
            if fid != s.file_id or path.stat().st_size < s.offset:
                s = self.samples = _Samples(file_id=fid)
            with path.open("rb") as f:
                f.seek(s.offset)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a torn last line waits for the next refresh
            pos = s.offset
            for line in data[:end].split(b"\n")[:-1] if end else []:
                start, pos = pos, pos + len(line) + 1
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    step = int(row.get("step", 0))
                except (ValueError, TypeError, AttributeError):
                    continue
                rng = s.ranges.setdefault(step, [start, pos])
                rng[1] = pos
                rng[0] = min(rng[0], start)
                r = row.get("reward")
                if isinstance(r, (int, float)):
                    s.rewards.setdefault(step, []).append(float(r))
            s.offset += end
            return s

    def sample_steps(self) -> list[int]:
        return sorted(self.refresh_samples().ranges)

    def step_rows(self, step: int) -> list[dict[str, Any]]:
        s = self.refresh_samples()
        rng = s.ranges.get(step)
        if not rng:
            return []
        with (self.path / "samples.jsonl").open("rb") as f:
            f.seek(rng[0])
            data = f.read(rng[1] - rng[0])
        out = []
        for line in data.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("step") == step:
                out.append(row)
        return out

    def step_rewards(self, step: int) -> list[float]:
        return list(self.refresh_samples().rewards.get(step, []))


class RunStore:
    """Per-run caches, bounded (least recently used runs are dropped)."""

    def __init__(self, max_runs: int = 64) -> None:
        self._caches: OrderedDict[Path, RunCache] = OrderedDict()
        self._lock = threading.Lock()
        self.max_runs = max_runs

    def get(self, path: str | Path) -> RunCache:
        p = Path(path).resolve()
        with self._lock:
            cache = self._caches.get(p)
            if cache is None:
                cache = self._caches[p] = RunCache(p)
            self._caches.move_to_end(p)
            while len(self._caches) > self.max_runs:
                self._caches.popitem(last=False)
            return cache

    def forget(self, path: str | Path) -> None:
        with self._lock:
            self._caches.pop(Path(path).resolve(), None)
