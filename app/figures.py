"""Plotly figures from metric rows: pure functions, no Gradio and no file access.

Metrics are held column-wise (`MetricTable`, NumPy arrays with NaN for absent values) so a run
with 20,000 steps is appended to incrementally and drawn from at most ~2,000 points per trace.

Figures are Plotly's JSON spec ({data, layout}) in a small `Figure` class rather than
plotly.graph_objects: validating graph objects costs ~50-100 ms per chart, which a live dashboard
redrawing nine charts per session per tick cannot afford. `Figure.to_go()` gives a validated
graph_objects figure when wanted (the tests use it to check every spec).

Every word a figure shows (legend names, axis titles) is English here and goes through `names`, a map from
the English text (or a metric key) to the page's language (app.locales.CHART_WORDS); a name with `{}` is a
template filled with its series' `arg` (a phase or a GPU), so the template is what gets translated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_POINTS = 2000
X_MODES = ("step", "elapsed", "wall")
PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
           "#4b5563", "#65a30d"]
EVAL_COLORS = ["#111827", "#b45309"]  # held-out curves: dark, apart from the training palette


# ----------------------------------------------------------------------------- the table

class MetricTable:
    """Metric rows as float columns; keys that appear late (eval/*) are NaN-padded before they appear."""

    def __init__(self, rows: Iterable[dict[str, Any]] = ()) -> None:
        self.cols: dict[str, np.ndarray] = {}
        self.n = 0
        self.extend(list(rows))

    def extend(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        keys: dict[str, None] = {}
        for r in rows:
            keys.update(dict.fromkeys(r))
        m = len(rows)
        for k in set(self.cols) | set(keys):
            if k in keys:
                new = _floats([r.get(k) for r in rows])
            else:
                new = np.full(m, np.nan)
            old = self.cols.get(k)
            if old is None:
                old = np.full(self.n, np.nan)
            self.cols[k] = np.concatenate([old, new])
        self.n += m

    def __len__(self) -> int:
        return self.n

    def get(self, key: str) -> np.ndarray:
        return self.cols.get(key, np.full(self.n, np.nan))

    def has(self, key: str) -> bool:
        c = self.cols.get(key)
        return c is not None and bool(np.isfinite(c).any())

    def keys_like(self, prefix: str = "", suffix: str = "") -> list[str]:
        return sorted(k for k in self.cols if k.startswith(prefix) and k.endswith(suffix) and self.has(k))

    def metric_names(self) -> list[str]:
        """Plottable metrics (everything numeric but the axes)."""
        return sorted(k for k in self.cols if k not in ("step", "time", "elapsed_s") and self.has(k))

    def last(self, key: str) -> float | None:
        c = self.cols.get(key)
        if c is None:
            return None
        ok = np.flatnonzero(np.isfinite(c))
        return float(c[ok[-1]]) if len(ok) else None


def _floats(values: list[Any]) -> np.ndarray:
    try:
        return np.array([np.nan if v is None else v for v in values], dtype=float)
    except (TypeError, ValueError):  # a stray string or dict: drop just those cells
        out = np.full(len(values), np.nan)
        for i, v in enumerate(values):
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[i] = v
        return out


def x_values(table: MetricTable, x_mode: str) -> np.ndarray:
    """The x column: step, elapsed hours, or wall-clock time (local, as datetime64)."""
    if x_mode == "elapsed":
        e = table.get("elapsed_s")
        if not np.isfinite(e).any():
            t = table.get("time")
            e = t - np.nanmin(t) if np.isfinite(t).any() else e
        return e / 3600.0
    if x_mode == "wall":
        t = table.get("time")
        offset = -_local_utc_offset_s()
        ms = np.where(np.isfinite(t), (t - offset) * 1000.0, np.nan)
        out = np.full(len(t), np.datetime64("NaT"), dtype="datetime64[ms]")
        ok = np.isfinite(ms)
        out[ok] = ms[ok].astype("int64").astype("datetime64[ms]")
        return out
    s = table.get("step")
    return s if np.isfinite(s).any() else np.arange(1, table.n + 1, dtype=float)


def _local_utc_offset_s() -> float:
    import time

    return -(time.altzone if time.localtime().tm_isdst > 0 else time.timezone)


# ----------------------------------------------------------------------------- downsampling and smoothing

def _valid(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(y)
    if x.dtype.kind == "M":
        ok &= ~np.isnat(x)
    else:
        ok &= np.isfinite(x)
    return x[ok], y[ok]


def downsample_minmax(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Keep each bucket's min and max (spikes survive, unlike striding); at most max_points points."""
    n = len(y)
    if n <= max_points:
        return x, y
    buckets = max(1, max_points // 2)
    size = math.ceil(n / buckets)
    pad = buckets * size - n
    yp = np.concatenate([y, np.full(pad, np.nan)]).reshape(buckets, size)
    lo = np.nanargmin(np.where(np.isnan(yp), np.inf, yp), axis=1)
    hi = np.nanargmax(np.where(np.isnan(yp), -np.inf, yp), axis=1)
    base = np.arange(buckets) * size
    idx = np.unique(np.concatenate([base + lo, base + hi, [n - 1]]))
    idx = idx[idx < n]
    return x[idx], y[idx]


def downsample_mean(x: np.ndarray, ys: Sequence[np.ndarray], max_points: int = MAX_POINTS
                    ) -> tuple[np.ndarray, list[np.ndarray], int]:
    """Bucket means sharing one x (for bands and smoothing); returns the bucket size too."""
    n = len(x)
    if n <= max_points:
        return x, list(ys), 1
    size = math.ceil(n / max_points)
    m = n // size * size
    idx = np.arange(size - 1, m, size)
    xs = x[idx]  # a bucket is drawn at its last x: the newest point is never hidden
    outs = [np.nanmean(y[:m].reshape(-1, size), axis=1) for y in ys]
    if m < n:  # the remainder becomes a last, shorter bucket
        xs = np.concatenate([xs, x[-1:]])
        outs = [np.concatenate([o, [np.nanmean(y[m:])]]) for o, y in zip(outs, ys)]
    return xs, outs, size


def ema(y: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's debiased exponential moving average; weight 0 returns y unchanged."""
    if weight <= 0 or len(y) == 0:
        return y
    out = np.empty(len(y))
    last, num = 0.0, 0
    w = float(weight)
    for i, v in enumerate(y.tolist()):
        if v != v:  # NaN: hold the previous value
            out[i] = last / (1 - w ** num) if num else np.nan
            continue
        last = last * w + (1 - w) * v
        num += 1
        out[i] = last / (1 - w ** num)
    return out


def prepare(x: np.ndarray, y: np.ndarray, smoothing: float = 0.0, max_points: int = MAX_POINTS
            ) -> tuple[np.ndarray, np.ndarray]:
    """One series ready to draw: NaNs dropped, downsampled, smoothed."""
    x, y = _valid(x, y)
    if smoothing > 0:
        x, (y,), size = downsample_mean(x, [y], max_points)
        return x, ema(y, smoothing ** size)  # a bucket of `size` steps decays like `size` single steps
    return downsample_minmax(x, y, max_points)


# ----------------------------------------------------------------------------- figures

class Figure:
    """A Plotly figure as its JSON spec. Gradio's gr.Plot accepts any object with `to_json()` as plotly."""

    __slots__ = ("data", "layout")

    def __init__(self, data: list[dict[str, Any]] | None = None, layout: dict[str, Any] | None = None) -> None:
        self.data: list[dict[str, Any]] = data or []
        self.layout: dict[str, Any] = layout or {}

    def add_trace(self, trace: dict[str, Any]) -> None:
        self.data.append(trace)

    def to_plotly_json(self) -> dict[str, Any]:
        return {"data": [_jsonable(t) for t in self.data], "layout": _jsonable(self.layout)}

    def to_json(self) -> str:
        return json.dumps(self.to_plotly_json(), separators=(",", ":"), allow_nan=False)

    def to_go(self) -> Any:
        import plotly.graph_objects as go

        return go.Figure(self.to_plotly_json())


def _array(a: np.ndarray) -> list[Any]:
    if a.dtype.kind == "M":
        return [None if np.isnat(v) else str(v) for v in a.astype("datetime64[ms]")]
    if a.dtype.kind == "f":
        r = np.round(a, 6)  # six digits are plenty on a chart and shrink the payload
        return [None if v != v or v in (math.inf, -math.inf) else v for v in r.tolist()]
    return a.tolist()


def _jsonable(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return _array(o)
    if isinstance(o, dict):
        return {k: _jsonable(v) for k, v in o.items() if v is not None}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, float) and (o != o or o in (math.inf, -math.inf)):
        return None
    return o


_AXIS = {"gridcolor": "#e5e7eb", "zeroline": False, "linecolor": "#d1d5db", "showline": True, "automargin": True}
_FONT = {"family": "Inter, system-ui, sans-serif", "size": 12, "color": "#374151"}


def _base_layout(title: str) -> dict[str, Any]:
    return {"title": {"text": title, "x": 0.01, "font": {"size": 14}}, "height": 290,
            "paper_bgcolor": "white", "plot_bgcolor": "white", "font": dict(_FONT),
            "margin": {"l": 50, "r": 16, "t": 40, "b": 30}, "xaxis": dict(_AXIS), "yaxis": dict(_AXIS),
            "legend": {"orientation": "h", "y": -0.12, "yanchor": "top", "font": {"size": 11}}}


def _tr(names: dict[str, str] | None, text: str) -> str:
    """`text` in the page's language (itself when `names` has no word for it)."""
    return (names or {}).get(text) or text


def _layout(fig: Figure, title: str, x_mode: str, secondary: bool = False, y2_title: str = "",
            names: dict[str, str] | None = None) -> Figure:
    lay = _base_layout(title)
    lay["hovermode"] = "x unified"
    lay["uirevision"] = title  # keep the user's zoom across live updates
    if x_mode == "elapsed":  # steps and clock times read as such; hours need saying
        lay["xaxis"]["title"] = {"text": _tr(names, "hours"), "standoff": 2}
    if x_mode == "step":
        lay["xaxis"].update(step_ticks(fig))
    if secondary:
        lay["margin"]["r"] = 50
        lay["yaxis2"] = {"overlaying": "y", "side": "right", "showgrid": False, "zeroline": False,
                         "title": {"text": y2_title}, "automargin": True}
    fig.layout.update(lay)
    return fig


def step_ticks(fig: Figure) -> dict[str, Any]:
    """Axis settings that keep step ticks whole: Plotly's automatic ticks on a few steps fall on 1.5, 2.5, ..."""
    xs = [float(v) for tr in fig.data for v in np.asarray(tr.get("x", []), dtype=float).ravel() if v == v]
    if xs and max(xs) - min(xs) < 10:
        return {"tickformat": "d", "tick0": 0, "dtick": 1}
    return {"tickformat": "d"}


def empty_figure(title: str, message: str = "no data yet") -> Figure:
    lay = _base_layout(title)
    lay["xaxis"] = {"visible": False}
    lay["yaxis"] = {"visible": False}
    lay["annotations"] = [{"text": message, "showarrow": False, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper",
                           "font": {"size": 13, "color": "#6b7280"}}]
    return Figure([], lay)


def _line(x: np.ndarray, y: np.ndarray, name: str, color: str, width: float = 1.6, dash: str | None = None,
          secondary: bool = False, **extra: Any) -> dict[str, Any]:
    return {"type": "scatter", "x": x, "y": y, "name": name, "mode": "lines" if len(x) > 1 else "markers",
            "line": {"color": color, "width": width, "dash": dash}, "yaxis": "y2" if secondary else None, **extra}


@dataclass(frozen=True)
class Series:
    key: str
    name: str = ""  # English; a template with {} when `arg` is given
    secondary: bool = False
    dash: str | None = None
    arg: str = ""

    def label(self, names: dict[str, str] | None) -> str:
        """The legend name: by metric key where `names` has one, else the (translated) name or the key."""
        own = (names or {}).get(self.key)
        if own:
            return own
        text = _tr(names, self.name or self.key)
        return text.format(self.arg) if self.arg else text


def line_figure(table: MetricTable, title: str, series: Sequence[Series], x_mode: str = "step",
                smoothing: float = 0.0, y2_title: str = "", empty_message: str = "no data yet",
                names: dict[str, str] | None = None) -> Figure:
    """One line per series the table has; `names` (metric key -> legend name, e.g. in the page's language)
    overrides a series' own name."""
    present = [s for s in series if table.has(s.key)]
    if not present:
        return empty_figure(title, empty_message)
    x = x_values(table, x_mode)
    fig = Figure()
    for i, s in enumerate(present):
        xs, ys = prepare(x, table.get(s.key), smoothing)
        fig.add_trace(_line(xs, ys, s.label(names), PALETTE[i % len(PALETTE)], dash=s.dash, secondary=s.secondary))
    return _layout(fig, title, x_mode, any(s.secondary for s in present), y2_title, names)


def reward_figure(table: MetricTable, title: str, x_mode: str = "step", smoothing: float = 0.0,
                  empty_message: str = "no data yet", best: Any = None, names: dict[str, str] | None = None) -> Figure:
    """Mean reward with a ±std band, plus each reward function's mean."""
    if not table.has("reward"):
        return empty_figure(title, empty_message)
    x = x_values(table, x_mode)
    r, s = table.get("reward"), table.get("reward_std")
    ok = np.isfinite(r) & (np.isfinite(x) if x.dtype.kind != "M" else ~np.isnat(x))
    xs, (rm, sm), size = downsample_mean(x[ok], [r[ok], np.nan_to_num(s[ok])])
    if smoothing > 0:
        rm, sm = ema(rm, smoothing ** size), ema(sm, smoothing ** size)
    fig = Figure()
    fig.add_trace({"type": "scatter", "x": xs, "y": rm + sm, "mode": "lines", "line": {"width": 0},
                   "showlegend": False, "hoverinfo": "skip"})
    fig.add_trace({"type": "scatter", "x": xs, "y": rm - sm, "mode": "lines", "line": {"width": 0}, "fill": "tonexty",
                   "fillcolor": "rgba(37,99,235,0.15)", "name": _tr(names, "± std"), "hoverinfo": "skip"})
    fig.add_trace({"type": "scatter", "x": xs, "y": rm, "name": _tr(names, "reward"),
                   "mode": "lines+markers" if len(xs) < 60 else "lines", "marker": {"size": 4},
                   "line": {"color": PALETTE[0], "width": 2}})
    for i, key in enumerate(table.keys_like("rewards/", "/mean")):
        fx, fy = prepare(x, table.get(key), smoothing)
        fig.add_trace(_line(fx, fy, key.split("/")[1], PALETTE[(i + 1) % len(PALETTE)], 1.3, "dot"))
    _eval_traces(fig, table, x, best, names)
    return _layout(fig, title, x_mode, names=names)


def _eval_traces(fig: Figure, table: MetricTable, x: np.ndarray, best: Any = None,
                 names: dict[str, str] | None = None) -> None:
    """Held-out eval reward (and the metric that picks the best checkpoint) beside the training reward, as
    markers at the evaluated steps; the best checkpoint as a star. `best` has .step, .metric, .value."""
    keys = ["eval/reward"]
    if best is not None and best.metric not in keys:
        keys.append(best.metric)
    for j, key in enumerate(k for k in keys if table.has(k)):
        y = table.get(key)
        ok = np.isfinite(y)
        if not ok.any():
            continue
        fig.add_trace({"type": "scatter", "x": _array(x[ok]), "y": _array(y[ok]), "name": _tr(names, "held-out {}").format(key[5:]),
                       "mode": "lines+markers", "marker": {"size": 7, "symbol": "diamond"},
                       "line": {"color": EVAL_COLORS[j % len(EVAL_COLORS)], "width": 1.5, "dash": "dash"}})
    if best is not None and table.has(best.metric) and table.has("step"):
        at = np.flatnonzero(table.get("step") == best.step)
        if at.size:
            fig.add_trace({"type": "scatter", "x": _array(x[at[-1:]]), "y": [best.value], "mode": "markers+text",
                           "name": _tr(names, "best checkpoint step-{}").format(best.step),
                           "text": [_tr(names, "best step-{}").format(best.step)],
                           "textposition": "top center",
                           "marker": {"size": 14, "symbol": "star", "color": "#f59e0b",
                                      "line": {"color": "#92400e", "width": 1}}})


def timing_figure(table: MetricTable, title: str, x_mode: str = "step", smoothing: float = 0.0,
                  empty_message: str = "no data yet", names: dict[str, str] | None = None) -> Figure:
    """Seconds per step split into phases, stacked (the step total as a line when the phases miss some time).

    The training phase is split into forward+backward and optimizer when the run logs both (runs before the
    split only have timing/train_s, which is then shown whole). An agentic run's timing/tools_s (tools and
    environment steps, docs/agent.md) is spent inside the rollout, so it is a dotted line, not a stacked phase."""
    train = ["timing/forward_backward_s", "timing/optimizer_s"]
    if not all(table.has(k) for k in train):
        train = ["timing/train_s"]
    phases = [k for k in ("timing/rollout_s", "timing/reward_s", *train, "timing/weight_sync_s") if table.has(k)]
    if not phases and not table.has("timing/step_s") and not table.has("timing/tools_s"):
        return empty_figure(title, empty_message)
    x = x_values(table, x_mode)
    fig = Figure()
    for i, k in enumerate(phases):
        xs, ys = prepare(x, np.nan_to_num(table.get(k)), smoothing)
        fig.add_trace(_line(xs, ys, _tr(names, k.split("/")[1].removesuffix("_s")), PALETTE[i], 0.8,
                            stackgroup="phases"))
    if table.has("timing/step_s"):
        xs, ys = prepare(x, table.get("timing/step_s"), smoothing)
        fig.add_trace(_line(xs, ys, _tr(names, "step"), "#111827", 1.0, "dot"))
    if table.has("timing/tools_s"):
        xs, ys = prepare(x, table.get("timing/tools_s"), smoothing)
        fig.add_trace(_line(xs, ys, Series("timing/tools_s", "tools (within rollout)").label(names),
                            PALETTE[len(phases) % len(PALETTE)], 1.3, "dot"))
    _layout(fig, title, x_mode, names=names)
    fig.layout["yaxis"]["title"] = {"text": _tr(names, "s")}
    return fig


def _gpu_keys(table: MetricTable, what: str) -> list[str]:
    return list(table.keys_like("system/gpu", what))


def _peak_series(table: MetricTable) -> list[Series]:
    """The peak memory of each phase of the step (backend.train.telemetry), dotted beside the RSS at its end."""
    out = []
    for prefix, name in (("system/peak_gb/", "peak GB"), ("system/peak_gpu_gb/", "GPU peak GB")):
        out += [Series(k, name + " {}", dash="dot", arg=k[len(prefix):]) for k in table.keys_like(prefix)]
    return out


# chart id -> series; titles come from the locale table so they switch language
def dashboard_series(table: MetricTable) -> dict[str, list[Series]]:
    return {
        "reward_spread": [Series("reward_std"), Series("frac_reward_zero_std", secondary=True)],
        "lengths": [Series("completions/mean_length", "mean"), Series("completions/min_length", "min", dash="dot"),
                    Series("completions/max_length", "max", dash="dot"),
                    Series("completions/clipped_ratio", "clipped ratio", secondary=True)],
        # each objective's own diagnostics: a series is drawn only when the run logs it
        "policy": [Series("kl"), Series("entropy"), Series("entropy_coef", "entropy coef", dash="dot"),
                   Series("clip_ratio/low_mean", "clip low", secondary=True),
                   Series("clip_ratio/high_mean", "clip high", secondary=True),
                   Series("clip_ratio/region_mean", "clip region", secondary=True),
                   Series("cispo_clip_ratio", "cispo clip", secondary=True),
                   Series("off_policy_mask/masked_ratio", "off-policy masked", secondary=True),
                   Series("entropy_mask/masked_ratio", "low-entropy masked", secondary=True)],
        "optim": [Series("loss"), Series("grad_norm"), Series("learning_rate", "lr", secondary=True)],
        "throughput": [Series("throughput/completion_tokens_per_s", "completion tokens/s"),
                       Series("staleness", secondary=True)],
        "telemetry": [Series("system/ram_gb", "RAM GB"),
                      *_peak_series(table),
                      *[Series(k, "{} mem GB", arg=k.split("/")[1].removesuffix("_mem_gb"))
                        for k in _gpu_keys(table, "_mem_gb")],
                      Series("system/cpu_percent", "CPU %", secondary=True),
                      *[Series(k, "{} util %", secondary=True, arg=k.split("/")[1].removesuffix("_util"))
                        for k in _gpu_keys(table, "_util")]],
        "eval": [Series(k) for k in table.keys_like("eval/")],
        "tools": list(TOOL_SERIES),
    }


# an agentic run's episodes (docs/agent.md): counts on the left axis, rates (0..1) on the right
TOOL_SERIES = (Series("tools/call_frequency", "tool calls / episode"), Series("episode/turns_mean", "turns / episode"),
               Series("tools/failure_frequency", "failed calls / calls", secondary=True, dash="dot"),
               Series("episode/cut_frequency", "episodes cut", secondary=True, dash="dot"))

CHART_IDS = ("reward", "reward_spread", "lengths", "policy", "optim", "timing", "throughput", "telemetry", "eval",
             "tools")
_Y2 = {"reward_spread": "frac zero std", "lengths": "clipped", "policy": "clipped / masked", "optim": "lr",
       "throughput": "staleness", "telemetry": "%", "tools": "rate"}


def has_tool_metrics(table: MetricTable) -> bool:
    """The run logs episode metrics (an agentic run): the Tools chart is shown only then."""
    return any(table.has(s.key) for s in TOOL_SERIES)


def build_dashboard(table: MetricTable, titles: dict[str, str], x_mode: str = "step", smoothing: float = 0.0,
                    empty_message: str = "no data yet", only: Sequence[str] | None = None,
                    best: Any = None, names: dict[str, str] | None = None) -> dict[str, Figure]:
    """Dashboard charts keyed by CHART_IDS (or just the `only` ones); `best` (backend.rundir.BestCheckpoint)
    is starred on the reward chart. `names` gives legend names by metric key, and a right axis's title by
    "y2/CHART_ID" (the page's language); without it the names are English."""
    wanted = [c for c in CHART_IDS if only is None or c in only]
    series = dashboard_series(table)
    out: dict[str, Figure] = {}
    for cid in wanted:
        title = titles.get(cid, cid)
        if cid == "reward":
            out[cid] = reward_figure(table, title, x_mode, smoothing, empty_message, best, names)
        elif cid == "timing":
            out[cid] = timing_figure(table, title, x_mode, smoothing, empty_message, names)
        else:
            y2 = (names or {}).get(f"y2/{cid}") or _tr(names, _Y2.get(cid, ""))
            out[cid] = line_figure(table, title, series[cid], x_mode, smoothing, y2, empty_message, names)
    return out


def reward_histogram(groups: Sequence[tuple[str, Sequence[float]]], title: str, bins: int = 30,
                     empty_message: str = "no samples yet", names: dict[str, str] | None = None) -> Figure:
    """Overlaid histograms of completion rewards, e.g. first vs chosen vs latest step."""
    groups = [(name, [v for v in vals if v is not None and math.isfinite(v)]) for name, vals in groups]
    groups = [(n, v) for n, v in groups if v]
    if not groups:
        return empty_figure(title, empty_message)
    lo = min(min(v) for _, v in groups)
    hi = max(max(v) for _, v in groups)
    size = (hi - lo) / bins if hi > lo else 1.0
    fig = Figure()
    for i, (name, vals) in enumerate(groups):
        fig.add_trace({"type": "histogram", "x": vals, "name": name, "opacity": 0.55,
                       "marker": {"color": PALETTE[i % len(PALETTE)]},
                       "xbins": {"start": lo - size / 2, "end": hi + size / 2, "size": size}})
    lay = _base_layout(title)
    lay["barmode"] = "overlay"
    lay["margin"]["b"] = 36
    lay["xaxis"]["title"] = {"text": _tr(names, "reward")}
    lay["yaxis"]["title"] = {"text": _tr(names, "completions")}
    fig.layout.update(lay)
    return fig


def compare_figure(tables: Sequence[tuple[str, MetricTable]], metric: str, title: str, x_mode: str = "step",
                   smoothing: float = 0.0, empty_message: str = "no data yet",
                   names: dict[str, str] | None = None) -> Figure:
    """One metric from several runs overlaid."""
    fig = Figure()
    for i, (name, table) in enumerate(tables):
        if not table.has(metric):
            continue
        xs, ys = prepare(x_values(table, x_mode), table.get(metric), smoothing)
        fig.add_trace(_line(xs, ys, name, PALETTE[i % len(PALETTE)]))
    if not fig.data:
        return empty_figure(title, empty_message)
    return _layout(fig, title, x_mode, names=names)
