"""Pure helpers of the Evaluate page: model and data choices, eval commands, progress and comparison views.

The page launches `python -m backend.eval` (and `backend.eval.export`) as child processes and follows
an evaluation only through its folder (status.json, results.json, samples.jsonl) via backend.rundir.
"""

from __future__ import annotations

import html
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.paths import PathError, Workspace
from app.runlist import format_duration
from backend.eval.benchmarks import BENCHMARKS
from backend.eval.compare import Comparison, PromptRow
from backend.eval.options import EvalConfig, to_argv
from backend.project import PROJECT_ROOT
from backend.rundir import list_evals, list_runs, read_eval_status

TINY_MODEL = PROJECT_ROOT / "assets" / "tiny-add"
ASSET_DATA = PROJECT_ROOT / "assets" / "data"
EVAL_COLORS = {"running": "#2563eb", "finished": "#0f766e", "failed": "#dc2626"}


def model_choices(runs_dir: Path, ws: Workspace) -> list[str]:
    """Run references (RUN_ID:base, RUN_ID = latest checkpoint, RUN_ID:STEP) and the shipped tiny model."""
    out = []
    for run in list_runs(runs_dir):
        out += [run.run_id, f"{run.run_id}:base"]
        out += [f"{run.run_id}:{c.name.split('-')[1]}" for c in reversed(run.checkpoints())]
    out.append(ws.rel(TINY_MODEL))
    return out


def data_choices(ws: Workspace) -> list[tuple[str, str]]:
    """(label, value): the run's held-out data, the named benchmark formats, the shipped data files."""
    out = [("(run's data.eval_sources)", "")]
    out += [(f"{b.title} · {name} (sample shipped; {name}=FILE for yours)", name) for name, b in BENCHMARKS.items()]
    out += [(ws.rel(p), ws.rel(p)) for p in sorted(ASSET_DATA.glob("*.jsonl"))]
    return out


def _inside(ws: Workspace, user: str) -> Path:
    """A user path inside the workspace, or inside the project's assets (the shipped models and data)."""
    p = Path(user).expanduser()
    p = p if p.is_absolute() else ws.root / p
    assets = (PROJECT_ROOT / "assets").resolve()
    if p.resolve().is_relative_to(assets):
        return p.resolve()
    return ws.resolve(user)


def resolve_model_ref(value: str, runs_dir: Path, ws: Workspace) -> str:
    """A choice (RUN_ID[:STEP|:base]) or a path -> the reference `python -m backend.eval --model` takes."""
    value = (value or "").strip()
    if not value:
        raise PathError("choose a model")
    rid, sep, which = value.partition(":")
    if (runs_dir / rid / "spec.yaml").is_file() and "/" not in rid:
        return str(runs_dir / rid) + (f":{which}" if sep else "")
    return str(_inside(ws, value))


def resolve_data_ref(value: str, ws: Workspace) -> str:
    value = (value or "").strip()
    if not value or value.lower() in BENCHMARKS:
        return value
    name, sep, path = value.partition("=")
    if sep and name.strip().lower() in BENCHMARKS:
        return f"{name.strip()}={_inside(ws, path.strip())}"
    return str(_inside(ws, value))


def eval_command(cfg: EvalConfig) -> list[str]:
    """The child process that runs one evaluation (its options projected by backend.eval.options.to_argv)."""
    return [sys.executable, "-m", "backend.eval", *to_argv(cfg)]


def all_evals(runs_dir: Path, evals_dir: Path) -> dict[str, Path]:
    """label -> folder of every evaluation: RUN_ID/NAME under runs, evals/NAME in the workspace's evals folder."""
    out: dict[str, Path] = {}
    for run in list_runs(runs_dir):
        for f in run.evals():
            out[f"{run.run_id}/{f.name}"] = f
    for f in list_evals(evals_dir):
        out[f"evals/{f.name}"] = f
    return out


def progress_html(folder: Path | None, labels: dict[str, str]) -> str:
    if folder is None:
        return f'<div class="gs-muted" id="eval-state" data-state="none">{html.escape(labels["none"])}</div>'
    st = read_eval_status(folder)
    state = st.get("state", "starting")
    done, total = int(st.get("done", 0)), int(st.get("total", 0) or 0)
    frac = done / total if total else 0.0
    color = EVAL_COLORS.get(state, "#6b7280")
    bits = [f'<span class="gs-badge" style="background:{color}">{html.escape(labels.get(state, state))}</span>',
            f"{done}/{total or '?'} {html.escape(labels['prompts'])}"]
    if st.get("samples_per_s"):
        bits.append(f"{st['samples_per_s']:.1f} {html.escape(labels['samples_s'])}")
    if state == "running" and st.get("eta_s") is not None:
        bits.append(f"{html.escape(labels['eta'])} {format_duration(st['eta_s']) or '0s'}")
    bits.append(html.escape(folder.name))
    out = (f'<div class="gs-progress" id="eval-state" data-state="{html.escape(state)}"><div class="gs-bar">'
           f'<div style="width:{frac * 100:.1f}%;background:{color}"></div></div>'
           f'<div class="gs-progress-text">{" · ".join(bits)}</div></div>')
    if state == "failed":
        out += f'<div class="gs-failed"><pre>{html.escape(str(st.get("error") or ""))}</pre></div>'
    return out


def metrics_rows(results: dict[str, Any]) -> list[list[Any]]:
    rows = [[k, _fmt(v)] for k, v in results.get("metrics", {}).items()]
    rows += [[k, _fmt(v)] for k, v in results.get("thinking", {}).items()]
    sps = results.get("timing", {}).get("samples_per_s")
    if sps:
        rows.append(["samples/s", _fmt(sps)])
    return rows


def _fmt(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


def comparison_table(cmp: Comparison) -> dict[str, Any]:
    return {"headers": ["model", *cmp.metric_names],
            "data": [[r[0], *[_fmt(v) if v is not None else "" for v in r[1:]]] for r in cmp.table]}


def side_by_side_html(cmp: Comparison, rows: list[PromptRow], limit: int = 100,
                      image_uris: Callable[[list[str]], list[str]] | None = None) -> str:
    """Each prompt with every model's answer in a column: right answers green, wrong red; answers that
    differ from the baseline's are outlined. `image_uris` turns a multimodal prompt's media references
    (samples.jsonl's images) into image sources shown above it (app.media.thumb_uris keeps them in the workspace)."""
    if not rows:
        return '<div class="gs-muted" id="cmp-empty">no prompts match this filter</div>'
    head = "".join(f"<th>{html.escape(lb)}</th>" for lb in cmp.labels)
    body = []
    for r in rows[:limit]:
        cells = []
        for j, ans in enumerate(r.answers):
            cls = "gs-right" if r.right[j] else "gs-wrong"
            diff = " gs-diff" if j and ans.strip() != r.answers[0].strip() else ""
            cells.append(f'<td class="{cls}{diff}"><pre>{html.escape(ans)}</pre>'
                         f'<span class="gs-small">{r.correct_rate[j]:.2f} correct · reward {r.reward[j]:.2f}</span></td>')
        thumbs = "".join(f'<img class="gs-thumb" src="{html.escape(u)}" alt="image">'
                         for u in image_uris(r.images)) if image_uris is not None and r.images else ""
        body.append(f'<tr><td>{thumbs}<pre>{html.escape(r.prompt)}</pre><span class="gs-small">gold: '
                    f'{html.escape(str(r.solution))}</span></td>{"".join(cells)}</tr>')
    more = f'<div class="gs-muted">{len(rows) - limit} more in the CSV</div>' if len(rows) > limit else ""
    return (f'<table class="gs-sbs" id="cmp-table"><tr><th>prompt</th>{head}</tr>{"".join(body)}</table>{more}')


EVAL_CSS = """
.gs-sbs { border-collapse: collapse; width: 100%; font-size: 13px; }
.gs-sbs td, .gs-sbs th { border: 1px solid var(--border-color-primary, #e5e7eb); padding: 4px 6px; vertical-align: top; }
.gs-sbs pre { white-space: pre-wrap; margin: 0; }
.gs-right { background: rgba(22,163,74,.10); }
.gs-wrong { background: rgba(220,38,38,.08); }
.gs-diff { outline: 2px solid #f59e0b; outline-offset: -2px; }
"""
