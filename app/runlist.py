"""The runs table and progress summary: pure functions over run directories' status files."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.rundir import ACTIVE_STATES, RESUMABLE_STATES, RunDir, created_at, list_runs

RUN_COLUMNS = ("run", "preset", "state", "step", "reward", "started", "duration")


def format_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return ""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m {s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h {m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d {h}h"


def format_time(ts: float | None) -> str:
    if not ts:
        return ""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


@dataclass
class RunInfo:
    run_id: str
    path: Path
    preset: str
    state: str
    step: int
    total_steps: int
    reward: float | None
    started_at: float | None
    updated_at: float | None
    error: str
    step_s: float | None
    eta_s: float | None
    warnings: list[str] = field(default_factory=list)
    created_at: float | None = None  # the first start (started_at is the current session's)
    trained_s: float | None = None  # training time over all sessions (status elapsed_s), as of updated_at

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def duration(self, now: float | None = None) -> float | None:
        """Training time: over every session when the trainer reported it (a resume keeps counting), else
        the current session's wall time."""
        now = now or time.time()
        if self.trained_s is not None:
            live = max(0.0, now - (self.updated_at or now)) if self.active else 0.0
            return self.trained_s + live
        if not self.started_at:
            return None
        end = now if self.active else (self.updated_at or now)
        return max(0.0, end - self.started_at)

    def latest(self) -> Latest:
        """The step and reward as shown, in the runs table and in the selected run's status line alike."""
        return latest(self)

    def row(self, now: float | None = None) -> list[Any]:
        last = self.latest()
        return [self.run_id, self.preset, self.state, last.step, last.reward,
                format_time(self.created_at or self.started_at), format_duration(self.duration(now))]


@dataclass(frozen=True)
class Latest:
    """A run's latest step and reward, as text: the one reading both the runs table and the status line show
    (both once disagreed: 1.109 in the table, 1.250 in the line)."""
    step: str  # "12/100" ("12" without a known total)
    reward: str  # "1.250"; "" before the first step


def latest(info: RunInfo) -> Latest:
    total = f"{info.step}/{info.total_steps}" if info.total_steps else str(info.step)
    return Latest(total, "" if info.reward is None else f"{info.reward:.3f}")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def run_info(run: RunDir) -> RunInfo:
    st = run.read_status()
    return RunInfo(
        run_id=run.run_id, path=run.path, preset=str(st.get("preset") or ""), state=run.state(),
        step=int(st.get("step") or 0), total_steps=int(st.get("total_steps") or 0), reward=_num(st.get("reward")),
        started_at=_num(st.get("started_at")), updated_at=_num(st.get("updated_at")),
        error=str(st.get("error") or ""), step_s=_num(st.get("step_s")), eta_s=_num(st.get("eta_s")),
        warnings=[str(w) for w in st.get("warnings") or [] if w], created_at=created_at(run.run_id, st),
        trained_s=_num(st.get("elapsed_s")),
    )


@dataclass(frozen=True)
class Controls:
    """What the Runs page's buttons offer for a run in a given state (None: no run selected)."""
    stop: bool  # only an active run can be stopped
    stop_key: str  # the Stop button's locale key: "force_kill" while stopping (a second click kills the group)
    resume: bool  # only a stopped or failed run: resuming a finished one would relaunch it for nothing


def controls(state: str | None) -> Controls:
    return Controls(state in ACTIVE_STATES, "force_kill" if state == "stopping" else "stop",
                    state in RESUMABLE_STATES)


def runs_table(runs_dir: str | Path, now: float | None = None) -> tuple[list[RunInfo], list[list[Any]]]:
    infos = [run_info(r) for r in list_runs(runs_dir)]
    return infos, [i.row(now) for i in infos]


def find_run(runs_dir: str | Path, run_id: str) -> RunDir | None:
    """The run directory named run_id, only when it is a direct child of runs_dir (no traversal)."""
    if not run_id or "/" in run_id or "\\" in run_id or run_id in (".", ".."):
        return None
    root = Path(runs_dir).resolve()
    p = (root / run_id).resolve()
    if p.parent != root or not p.is_dir():
        return None
    run = RunDir(p)
    return run if run.exists() else None


@dataclass
class Progress:
    fraction: float
    step: int
    total: int
    elapsed_s: float | None
    eta_s: float | None
    step_s: float | None
    tokens_per_s: float | None


def progress(info: RunInfo, tokens_per_s: float | None = None, now: float | None = None) -> Progress:
    frac = min(1.0, info.step / info.total_steps) if info.total_steps else 0.0
    eta = info.eta_s
    if eta is None and info.step_s and info.total_steps and info.active:
        eta = info.step_s * max(0, info.total_steps - info.step)
    if not info.active:
        eta = None
    return Progress(frac, info.step, info.total_steps, info.duration(now), eta, info.step_s, tokens_per_s)
