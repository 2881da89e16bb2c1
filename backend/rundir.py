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

Every file is untrusted on read (a run directory may be copied in, edited, or torn by a crash): readers return
only JSON objects with the documented field types, and a status.json that is not one reads as state "broken"
with the reason in "error", so one bad run shows as broken and the rest of the studio works. Writers write
strict JSON: NaN and ±inf become null (`to_json`).

Readers (the studio, the CLI) use this module and never the trainer's internals. `create_run` is the one
writer of a new run directory (the launcher and `python -m backend.train --config` both call it); it takes a
spec already checked (`checks.validate_or_raise`), since the run directory's format sits below the capability
check and must not import it.
"""

from __future__ import annotations

import json
import math
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
BROKEN = "broken"  # what a watcher reads for a status.json that is not a JSON object
_NUMBER = (int, float)
# status.json's fields and their types; a field of another type is dropped on read
STATUS_TYPES: dict[str, type | tuple[type, ...]] = {
    "state": str, "error": str, "preset": str, "base_dir": str, "pid": int, "step": int, "total_steps": int,
    "pid_create_time": _NUMBER, "started_at": _NUMBER, "updated_at": _NUMBER, "reward": _NUMBER, "step_s": _NUMBER,
    "eta_s": _NUMBER, "elapsed_s": _NUMBER, "created_at": _NUMBER, "warnings": list}


def _finite(o: Any) -> Any:
    """`o` with NaN and ±inf as None (JSON has neither), numpy and torch values as plain Python ones."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if hasattr(o, "tolist"):  # numpy scalars and arrays, tensors
        return _finite(o.tolist())
    return o


def to_json(obj: Any, indent: int | None = None) -> str:
    """Strict JSON text, as every run-directory file is written: NaN and ±inf become null."""
    return json.dumps(_finite(obj), default=str, allow_nan=False, indent=indent)


def read_json_object(path: Path) -> tuple[dict[str, Any], str]:
    """A file holding one JSON object: (its fields, ""), ({}, "") when it does not exist, or ({}, why not) when
    it is unreadable, not UTF-8, not JSON, or JSON but not an object."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, ""
    except OSError as err:
        return {}, f"cannot be read ({err.strerror or err})"
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return {}, "is not UTF-8 text"
    except ValueError:
        return {}, "is not JSON"
    if not isinstance(obj, dict):
        return {}, f"holds a JSON {type(obj).__name__}, not an object"
    return obj, ""


def _typed_status(raw: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in raw.items():
        want = STATUS_TYPES.get(k)
        if want is not None and (not isinstance(v, want) or isinstance(v, bool)):
            continue
        out[k] = [str(w) for w in v if isinstance(w, str)] if k == "warnings" else v
    return out


def atomic_write_text(path: Path, text: str) -> None:
    # unique per writer (process and thread), so concurrent writers never rename each other's file away
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException as err:  # a full disk: no half-written temp file is left beside it
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise _naming(err, path) from err
        raise


def _naming(err: OSError, path: Path) -> OSError:
    """`err` with the file it was writing: a write's "No space left on device" names none."""
    return err if err.filename else OSError(err.errno, err.strerror, str(path))


def read_jsonl(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Rows (JSON objects) from byte `offset` on, and the offset after the last complete line.

    A torn last line (a writer mid-append) is left for the next read rather than failing; a line that is not a
    JSON object (corrupt, not UTF-8, or a bare value such as `42`) is skipped.
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
                row = json.loads(line)
            except ValueError:
                continue  # a corrupt line (e.g. a crash mid-write before a resume) is skipped, not fatal
            if isinstance(row, dict):
                rows.append(row)
    return rows, offset + end


def _step_of(row: dict[str, Any]) -> int | None:
    s = row.get("step", 0)
    return int(s) if isinstance(s, _NUMBER) and not isinstance(s, bool) and math.isfinite(s) else None


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
        """status.json's fields of the documented types (STATUS_TYPES); {} when there is none; state "broken"
        with the reason in "error" when it is not a JSON object."""
        raw, problem = read_json_object(self.status_path)
        if problem:
            return {"state": BROKEN, "error": f"{self.status_path.name} {problem}"}
        return _typed_status(raw)

    def write_status(self, **fields: Any) -> dict[str, Any]:
        status = read_json_object(self.status_path)[0]  # a broken file is replaced by what is written now
        status.update(fields)
        status["updated_at"] = time.time()
        atomic_write_text(self.status_path, to_json(status, indent=1))
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
        lines = "".join(to_json(r) + "\n" for r in rows)
        if lines:
            try:
                with path.open("a") as f:
                    f.write(lines)
                    f.flush()
            except OSError as err:
                raise _naming(err, path) from err

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
            kept = [r for r in rows if (s := _step_of(r)) is not None and s <= step]
            atomic_write_text(path, "".join(to_json(r) + "\n" for r in kept))

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
        scored = [(float(r[metric]), _step_of(r)) for r in rows
                  if _step_of(r) in saved and isinstance(r.get(metric), _NUMBER) and r[metric] == r[metric]]
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
    path = Path(folder) / "status.json"
    st, problem = read_json_object(path)
    if problem:
        return {"state": "failed", "error": f"{path} {problem}"}
    if st.get("state") == "running" and not process_alive(st.get("pid"), st.get("pid_create_time")):
        st["state"] = "failed"
        st["error"] = st.get("error") or "the evaluation process is gone"
    return st


def process_alive(pid: int | None, create_time: float | None) -> bool:
    """True when `pid` runs and is the same process (its start time matches), not a reused pid."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return not isinstance(create_time, _NUMBER) or abs(p.create_time() - create_time) < 1.0
    except (psutil.Error, OverflowError, ValueError):
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
