"""The Compare page: pick several runs and overlay any metric (live, like the dashboard, on a slower timer)."""

from __future__ import annotations

from typing import Any

import gradio as gr

from app.config import StudioConfig
from app.fields import Registry
from app.figures import compare_figure
from app.locales import chart_words, t
from app.page import forget_drawn, header, session_defaults, wire_language
from app.runlist import find_run
from app.session import SessionMemo
from backend.rundir import list_runs

DEFAULT_METRIC = "reward"


class CompareTab:
    def __init__(self, config: StudioConfig, reg: Registry, lang_input: Any, lang: str = "en") -> None:
        self.config, self.lang_input = config, lang_input
        ids = [r.run_id for r in list_runs(config.runs_dir)]
        with gr.Row():
            self.runs = gr.Dropdown(ids, value=ids[:2], multiselect=True, label=t("compare_runs", lang), scale=3,
                                    elem_id="compare-runs")
            reg.label(self.runs, "compare_runs")
            self.metric = gr.Dropdown([DEFAULT_METRIC], value=DEFAULT_METRIC, label=t("compare_metric", lang),
                                      allow_custom_value=True, scale=2, elem_id="compare-metric")
            reg.label(self.metric, "compare_metric")
        with gr.Row():
            self.smoothing = reg.label(gr.Slider(0, 0.99, value=0.0, step=0.01, label=t("smoothing", lang)), "smoothing")
            self.x_mode = gr.Radio([(t("x_step", lang), "step"), (t("x_elapsed", lang), "elapsed"),
                                    (t("x_wall", lang), "wall")], value="step", label=t("x_axis", lang))
            reg.add(self.x_mode, lambda lg: {"label": t("x_axis", lg), "choices": [
                (t("x_step", lg), "step"), (t("x_elapsed", lg), "elapsed"), (t("x_wall", lg), "wall")]})
        self.plot = gr.Plot(show_label=False, elem_id="chart-compare")
        self.initial_runs = ids[:2]

    def outputs(self) -> list[Any]:
        return [self.runs, self.metric, self.plot]

    def refresh(self, m: dict[str, Any]) -> list[Any]:
        """Live update for session memo `m`; unchanged outputs are skipped."""
        selected, metric, smoothing = m["cmp_runs"], m["cmp_metric"], m["cmp_smoothing"]
        x_mode, lang = m["cmp_x"], m["lang"]
        sess = m.setdefault("compare_sess", {})
        ids = [r.run_id for r in list_runs(self.config.runs_dir)]
        selected = m["cmp_runs"] = [s for s in (selected or []) if s in ids]
        runs_up = gr.skip() if sess.get("ids") == ids else gr.update(choices=ids, value=selected)
        sess["ids"] = ids
        tables, versions, metrics = [], [], set()
        for rid in selected:
            run = find_run(self.config.runs_dir, rid)
            if run is None:
                continue
            cache = self.config.store.get(run.path)
            table = cache.refresh_metrics()
            tables.append((rid, table))
            versions.append((rid, cache.version))
            metrics.update(table.metric_names())
        names = sorted(metrics) or [DEFAULT_METRIC]
        metric = metric or DEFAULT_METRIC
        metric_up = gr.skip() if sess.get("metrics") == names else gr.update(choices=names, value=metric)
        sess["metrics"] = names
        sig = (tuple(versions), metric, round(float(smoothing or 0), 3), x_mode, lang)
        if sess.get("plot") == sig:
            return [runs_up, metric_up, gr.skip()]
        sess["plot"] = sig
        fig = compare_figure(tables, metric, t("compare_title", lang, metric=metric), x_mode or "step",
                             float(smoothing or 0), t("no_data", lang), chart_words(lang))
        return [runs_up, metric_up, fig]

    def wire_controls(self, memo: SessionMemo, live: Any) -> None:
        kw: dict[str, Any] = {"show_progress": "hidden", "concurrency_limit": 8, "concurrency_id": "compare",
                              "trigger_mode": "always_last"}
        for ev, comp, key in ((self.runs.input, self.runs, "cmp_runs"), (self.metric.input, self.metric, "cmp_metric"),
                              (self.smoothing.release, self.smoothing, "cmp_smoothing"),
                              (self.x_mode.input, self.x_mode, "cmp_x")):
            ev(memo.setter(key), comp, None, queue=False).then(live, None, self.outputs(), **kw)


def compare_page(demo: gr.Blocks, config: StudioConfig, lang: str) -> None:
    reg = Registry()
    radio, store = header(reg, lang, "subtitle_compare")
    compare = CompareTab(config, reg, radio, lang)
    timer = gr.Timer(config.refresh_s * 2)  # finished runs dominate comparisons: a slower tick is plenty
    memo = SessionMemo({**session_defaults(lang, None), "cmp_runs": list(compare.initial_runs)})
    c_out = compare.outputs()

    def live(request: gr.Request) -> list[Any]:
        return compare.refresh(memo.get(request))

    timer.tick(live, None, c_out, trigger_mode="once", show_progress="hidden", concurrency_limit=8,
               concurrency_id="compare")
    compare.wire_controls(memo, live)
    demo.load(live, None, c_out, show_progress="hidden")
    wire_language(demo, reg, radio, store, on_change=forget_drawn(memo), then=(live, [], c_out))
