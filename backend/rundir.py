"""The run directory: the only channel between a trainer process and everything that watches it.

runs/<run_id>/
  spec.yaml        validated RunSpec, frozen at launch
  status.json      state, pid, process start time, step, total steps, error (written atomically);
                   created_at (the first start; started_at is the current session's), elapsed_s (training
                   time summed over sessions: a resume carries it on from the checkpoint)
  metrics.jsonl    one JSON object per optimizer step, append-only
  samples.jsonl    logged completions with their rewards
  train.log        the trainer's stdout and stderr
  checkpoints/step-N/
  eval/            during_training.jsonl (the trainer's eval_steps), one folder per evaluation
                   (backend/eval/run.py: status.json, results.json, samples.jsonl)

Readers (the studio, the CLI) use this module and never the trainer's internals. `create_run` is the one
writer of a new run directory (the launcher and `python -m backend.train --config` both call it); it takes a
spec already checked (`checks.validate_or_raise`), since the run directory's format sits below the capability
check and must not import it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from backend.spec import RunSpec, save_spec

ACTIVE_STATES = ("starting", "running", "stopping")
FINAL_STATES = ("stopped", "finished", "failed")
RESUMABLE_STATES = ("stopped", "failed")  # a finished run has nothing left to train; an active one is running


def atomic_write_text(path: Path, text: str) -> None:
    # unique per writer (process and thread), so concurrent writers never rename each other's file away
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_jsonl(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Rows from byte `offset` on, and the offset after the last complete line.

    A torn last line (a writer mid-append) is left for the next read rather than failing.
    """
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    rows = []
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a corrupt line (e.g. a crash mid-write before a resume) is skipped, not fatal
    return rows, offset + end


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    # paths
    @property
    def run_id(self) -> str:
        return self.path.name

    spec_path = property(lambda self: self.path / "spec.yaml")
    status_path = property(lambda self: self.path / "status.json")
    metrics_path = property(lambda self: self.path / "metrics.jsonl")
    samples_path = property(lambda self: self.path / "samples.jsonl")
    log_path = property(lambda self: self.path / "train.log")
    checkpoints_dir = property(lambda self: self.path / "checkpoints")
    eval_dir = property(lambda self: self.path / "eval")

    def exists(self) -> bool:
        return self.status_path.exists() or self.spec_path.exists()

    # status
    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def write_status(self, **fields: Any) -> dict[str, Any]:
        status = self.read_status()
        status.update(fields)
        status["updated_at"] = time.time()
        atomic_write_text(self.status_path, json.dumps(status, indent=1))
        return status

    def state(self) -> str:
        """The state as a watcher should show it: an active state whose process is gone is 'failed'."""
        st = self.read_status()
        state = st.get("state", "unknown")
        if state in ACTIVE_STATES and not process_alive(st.get("pid"), st.get("pid_create_time")):
            return "failed"
        return state

    # metrics and samples
    def append_jsonl(self, path: Path, rows: Iterable[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(r, default=_json_default) + "\n" for r in rows)
        if lines:
            with path.open("a") as f:
                f.write(lines)
                f.flush()

    def read_metrics(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        return read_jsonl(self.metrics_path, offset)

    def read_samples(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        return read_jsonl(self.samples_path, offset)

    def truncate_after_step(self, step: int) -> None:
        """Drop metric and sample rows past `step` (used on resume: those steps are redone)."""
        for path in (self.metrics_path, self.samples_path, self.eval_dir / "during_training.jsonl"):
            if not path.exists():
                continue
            rows, _ = read_jsonl(path)
            kept = [r for r in rows if r.get("step", 0) <= step]
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))

    # checkpoints
    def checkpoints(self) -> list[Path]:
        if not self.checkpoints_dir.is_dir():
            return []
        found = [p for p in self.checkpoints_dir.iterdir()
                 if re.fullmatch(r"step-\d+", p.name) and (p / "COMPLETE").exists()]
        return sorted(found, key=lambda p: int(p.name.split("-")[1]))

    def latest_checkpoint(self) -> Path | None:
        cps = self.checkpoints()
        return cps[-1] if cps else None

    # evaluation
    def eval_curve(self) -> list[dict[str, Any]]:
        """Rows of eval/during_training.jsonl: {"step", "eval/reward", "eval/rewards/<fn>/mean", ...}."""
        return read_jsonl(self.eval_dir / "during_training.jsonl")[0]

    def best_checkpoint(self, metric: str = "") -> BestCheckpoint | None:
        """The saved checkpoint with the highest eval metric among the steps evaluated during training.
        metric '' = the first of eval/rewards/<fn>/mean for a correctness reward (accuracy,
        multiple_choice, exact_match, countdown, counting), else eval/reward."""
        rows = self.eval_curve()
        if not rows:
            return None
        if not metric:
            keys = {k for r in rows for k in r}
            metric = next((f"eval/rewards/{fn}/mean" for fn in CORRECTNESS_REWARDS
                           if f"eval/rewards/{fn}/mean" in keys), "eval/reward")
        saved = {int(p.name.split("-")[1]) for p in self.checkpoints()}
        scored = [(float(r[metric]), int(r["step"])) for r in rows
                  if int(r.get("step", -1)) in saved and isinstance(r.get(metric), (int, float)) and r[metric] == r[metric]]
        if not scored:
            return None
        value, step = max(scored, key=lambda x: (x[0], -x[1]))  # ties: the earlier checkpoint
        return BestCheckpoint(step, metric, value, self.checkpoints_dir / f"step-{step}")

    def evals(self) -> list[Path]:
        """Evaluation folders under eval/, newest first."""
        return list_evals(self.eval_dir)

    def log_tail(self, max_bytes: int = 20000) -> str:
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", errors="replace")


CORRECTNESS_REWARDS = ("accuracy", "multiple_choice", "exact_match", "countdown", "counting")


@dataclass(frozen=True)
class BestCheckpoint:
    step: int
    metric: str
    value: float
    path: Path


def list_evals(folder: str | Path) -> list[Path]:
    """Evaluation folders (those with a status.json) under `folder`, newest first: those directly under it,
    and the members of a comparison folder (`python -m backend.eval.compare --out DIR` writes DIR/0, DIR/1, ...)."""
    root = Path(folder)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if not p.is_dir():
            continue
        if (p / "status.json").is_file():
            found.append(p)
        else:
            found += [m for m in p.iterdir() if m.name.isdigit() and (m / "status.json").is_file()]
    return sorted(found, key=lambda p: (p / "status.json").stat().st_mtime, reverse=True)


def read_eval_status(folder: str | Path) -> dict[str, Any]:
    """An evaluation folder's status.json as a watcher should see it: state running/finished/failed, done,
    total, samples_per_s, eta_s, error; a running eval whose process is gone reads as failed."""
    try:
        st = json.loads((Path(folder) / "status.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    if st.get("state") == "running" and not process_alive(st.get("pid"), st.get("pid_create_time")):
        st["state"] = "failed"
        st["error"] = st.get("error") or "the evaluation process is gone"
    return st


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def process_alive(pid: int | None, create_time: float | None) -> bool:
    """True when `pid` runs and is the same process (its start time matches), not a reused pid."""
    if not pid:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(p.create_time() - create_time) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def new_run_dir(runs_dir: str | Path, name: str) -> RunDir:
    """Create runs/<YYYYmmdd-HHMMSS>-<name>-<4 hex>/ (unique even for runs started in the same second)."""
    root = Path(runs_dir)
    root.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^\w.-]+", "-", name).strip("-")[:48] or "run"
    while True:
        rid = f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{secrets.token_hex(2)}"
        path = root / rid
        try:
            path.mkdir()
            return RunDir(path)
        except FileExistsError:
            continue


def created_at(run_id: str, status: dict[str, Any]) -> float | None:
    """When a run was first started: its status's created_at, else the time its id names (runs created
    before created_at was written), else None."""
    v = status.get("created_at")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    try:
        return time.mktime(time.strptime(run_id[:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        return None


def default_run_name(spec: RunSpec, preset: str = "") -> str:
    return spec.output.run_name or preset or Path(spec.model.name_or_path.rstrip("/")).name or "run"


def create_run(spec: RunSpec, base_dir: str | Path = ".", preset: str = "") -> RunDir:
    """A new run directory for `spec` (validated by the caller) with spec.yaml and a 'starting' status."""
    runs_dir = Path(spec.output.runs_dir)
    if not runs_dir.is_absolute():
        runs_dir = Path(base_dir) / runs_dir
    run = new_run_dir(runs_dir, default_run_name(spec, preset))
    save_spec(spec, run.spec_path)
    # relative paths in the spec (model, data, plugins) resolve against base_dir, also on a later resume
    run.write_status(state="starting", step=0, total_steps=spec.algorithm.max_steps, preset=preset, error="",
                     base_dir=str(Path(base_dir).resolve()), created_at=time.time())
    return run


def list_runs(runs_dir: str | Path) -> list[RunDir]:
    """Run directories under runs_dir, newest first."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    runs = [RunDir(p) for p in root.iterdir() if p.is_dir() and (p / "spec.yaml").exists()]
    return sorted(runs, key=lambda r: r.run_id, reverse=True)  # ids start with the start time
