"""Pure helpers of the Evaluate page: model and data choices, eval commands, progress and comparison views.

The page launches `python -m backend.eval` (and `backend.eval.export`) as child processes and follows
an evaluation only through its folder (status.json, results.json, samples.jsonl) via backend.rundir.
"""

from __future__ import annotations

import html
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.paths import PathError, Workspace
from app.runlist import format_duration, format_time
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
    """key -> folder of every evaluation: RUN_ID/NAME under runs, evals/NAME in the workspace's evals folder
    (NAME/0, NAME/1 for the members of a comparison). Keys are the picker's values; eval_label names them."""
    out: dict[str, Path] = {}
    for run in list_runs(runs_dir):
        for f in run.evals():
            out[f"{run.run_id}/{f.relative_to(run.eval_dir).as_posix()}"] = f
    root = Path(evals_dir)
    for f in list_evals(root):
        out[f"evals/{f.relative_to(root).as_posix()}"] = f
    return out


def eval_label(folder: Path, run_id: str = "") -> str:
    """A picker label that says what was evaluated: model · data · time (from the folder's settings; the
    folder's name when it has none). An evaluation of a run's checkpoint names the run (`RUN_ID:step-N`)."""
    try:
        doc = json.loads((folder / "results.json").read_text())
    except (OSError, json.JSONDecodeError):
        doc = read_eval_status(folder).get("settings") or {}
    model, data = doc.get("model_label"), doc.get("data_label") or doc.get("data")
    when = doc.get("finished_at") or _mtime(folder / "status.json")
    if not model:
        return folder.name
    model = f"{run_id}:{model}" if run_id else model
    return " · ".join(str(x) for x in (model, data, format_time(when)) if x)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


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


def results_table(results: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The Results panel: one column per (label, results.json) and, for a pair, the second minus the first, so
    "base vs this checkpoint" reads as a comparison and not as one unlabelled set of numbers."""
    columns = [dict(metrics_rows(r)) for _, r in results]
    names = list(dict.fromkeys(k for c in columns for k in c))
    headers = ["metric", *[label for label, _ in results]]
    data = [[k, *[c.get(k, "") for c in columns]] for k in names]
    if len(results) == 2:
        headers.append(f"Δ {results[1][0]} − {results[0][0]}")
        for row in data:
            row.append(_fmt(_diff(row[2], row[1])))
    return {"headers": headers, "data": data}


def _fmt(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


def comparison_table(cmp: Comparison) -> dict[str, Any]:
    """One row per model and, for each model after the baseline, its difference to the baseline."""
    data = [[r[0], *[_fmt(v) if v is not None else "" for v in r[1:]]] for r in cmp.table]
    base = cmp.table[0]
    for r in cmp.table[1:]:
        data.append([f"Δ {r[0]} − {base[0]}", *[_fmt(_diff(v, b)) for v, b in zip(r[1:], base[1:], strict=True)]])
    return {"headers": ["model", *cmp.metric_names], "data": data}


def _diff(v: Any, base: Any) -> Any:
    num = (int, float)
    if isinstance(v, num) and isinstance(base, num) and not isinstance(v, bool) and not isinstance(base, bool):
        return v - base
    return ""


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
