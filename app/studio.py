"""Assemble the studio: four pages (Build a run, Runs, Compare, Evaluate) of one Gradio app.

The live views are pages of their own, not tabs of one page, because Gradio's page does work per event
that grows with (components taking part in any event) x (components on the page): the Build form has
~70 fields taking part in validation, and next to it every one-second dashboard tick cost ~250 ms of
browser time. On its own page the dashboard's tick is cheap. Pages link through the URL
(`runs?run=ID` after Start, `?clone=ID` from a run); the language choice is kept in the browser.
"""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from app.build_tab import BuildTab, validate_form
from app.compare_tab import CompareTab
from app.config import StudioConfig
from app.eval_tab import EvalTab
from app.eval_view import EVAL_CSS
from app.fields import Registry
from app.form import fields
from app.locales import LANG_NAMES, LANGS, t
from app.runlist import find_run
from app.runs_tab import RunsTab
from app.samples_view import SAMPLES_CSS
from app.session import SessionMemo
from backend import launcher
from backend.spec import SpecError, load_spec

CSS = SAMPLES_CSS + EVAL_CSS + """
.gs-error textarea, .gs-error input, .gs-error .wrap { border-color: #dc2626 !important; }
.gs-error .info, .gs-error [data-testid="block-info"] + div, .gs-error-text { color: #dc2626 !important; }
.gs-actions { position: sticky; bottom: 0; z-index: 20; padding: 8px; box-shadow: 0 -2px 8px rgba(0,0,0,.08);
  background: var(--background-fill-primary, #fff); }
.gs-note { font-size: 12px; color: var(--body-text-color-subdued, #6b7280); }
.gs-small { font-size: 12px; }
.gs-muted { color: #6b7280; padding: 8px; }
.gs-progress { padding: 4px 0; }
.gs-bar { height: 10px; border-radius: 6px; background: #e5e7eb; overflow: hidden; }
.gs-bar > div { height: 100%; border-radius: 6px; transition: width .6s; }
.gs-progress-text { font-size: 13px; margin-top: 6px; }
.gs-badge { color: #fff; border-radius: 10px; padding: 1px 8px; font-size: 12px; font-weight: 600; }
.gs-failed { border: 2px solid #dc2626; background: rgba(220,38,38,.07); border-radius: 8px; padding: 8px 12px;
  margin-top: 8px; color: #991b1b; }
.gs-failed pre { white-space: pre-wrap; margin: 4px 0 0; font-size: 12px; }
.gs-warning { border: 2px solid #d97706; background: rgba(217,119,6,.07); border-radius: 8px; padding: 8px 12px;
  margin-top: 8px; color: #92400e; }
.gs-warning ul { margin: 4px 0 0 18px; font-size: 13px; }
.gs-preview { border: 1px solid var(--border-color-primary, #e5e7eb); border-radius: 8px; padding: 6px 10px;
  margin: 6px 0; }
.gs-preview-head { font-size: 12px; color: #6b7280; }
.gs-rendered { white-space: pre-wrap; background: var(--background-fill-secondary, #f3f4f6); padding: 6px;
  border-radius: 6px; font-size: 12px; }
.gs-thumbs { display: flex; gap: 6px; flex-wrap: wrap; margin: 4px 0; }
.gs-thumb { max-width: 160px; max-height: 160px; border-radius: 4px; image-rendering: pixelated; }
#gs-header h1 { margin: 0; font-size: 22px; }
"""


PAGE_NAMES = {"build": "Build a run · 构建训练", "runs": "Runs · 运行", "compare": "Compare · 对比",
              "evaluate": "Evaluate · 评测"}
NAV_JS = "(url) => { if (url) { window.location.assign(url); } }"
LANG_KEY = "grpo-studio-lang"


def create_studio(config: StudioConfig, lang: str = "en") -> gr.Blocks:
    with gr.Blocks(title="GRPO Studio") as demo:
        _build_page(demo, config, lang)
    demo.pages[0] = ("", PAGE_NAMES["build"], True)
    with demo.route(PAGE_NAMES["runs"], "runs"):
        _runs_page(demo, config, lang)
    with demo.route(PAGE_NAMES["compare"], "compare"):
        _compare_page(demo, config, lang)
    with demo.route(PAGE_NAMES["evaluate"], "evaluate"):
        _eval_page(demo, config, lang)
    return demo


def _header(reg: Registry, lang: str, subtitle_key: str) -> tuple[gr.Radio, gr.BrowserState]:
    with gr.Row(equal_height=True, elem_id="gs-header"):
        header = gr.Markdown(f"# {t('title', lang)}\n{t(subtitle_key, lang)}")
        reg.add(header, lambda lg: {"value": f"# {t('title', lg)}\n{t(subtitle_key, lg)}"})
        radio = gr.Radio([(LANG_NAMES[code], code) for code in LANGS], value=lang, label=t("language", lang),
                         scale=0, min_width=220, elem_id="lang-switch")
        reg.label(radio, "language")
    # the choice follows the user from page to page (and across restarts of the page, not of the studio)
    store = gr.BrowserState(lang, storage_key=LANG_KEY, secret="grpo-studio-language")
    return radio, store


def _wire_language(demo: gr.Blocks, reg: Registry, radio: gr.Radio, store: gr.BrowserState,
                   on_change: Any = None, then: tuple[Any, list[Any], list[Any]] | None = None) -> None:
    """Relabel the page when the language changes; apply the stored choice when the page opens."""
    comps = reg.components()

    def relabel(lang: str, request: gr.Request) -> list[Any]:
        if on_change is not None:
            on_change(lang, request)
        return [*reg.updates(lang), lang]

    ev = radio.change(relabel, radio, [*comps, store], queue=False, show_progress="hidden")
    if then is not None:
        fn, ins, outs = then
        ev.then(fn, ins, outs, show_progress="hidden")

    def restore(stored: str, current: str) -> Any:
        return stored if stored in LANGS and stored != current else gr.skip()

    demo.load(restore, [store, radio], radio, queue=False, show_progress="hidden")


def _build_page(demo: gr.Blocks, config: StudioConfig, lang: str) -> None:
    reg = Registry()
    radio, store = _header(reg, lang, "subtitle")
    build = BuildTab(config, reg, radio, lang)
    nav = gr.Textbox(visible=False, elem_id="nav-url")
    ins = build.inputs
    vfn, vin, vout = build.validate_event_args

    def on_start(preset: str, lang: str, *args: Any) -> list[Any]:
        v = validate_form(build.config, build.form.values(args))
        if not v.ok or v.spec is None:
            return ["⚠ " + t("invalid_form", lang), ""]
        try:
            run = launcher.launch(v.spec, base_dir=config.workspace.root, preset=preset or "",
                                  workspace=config.workspace)
        except SpecError as err:
            return ["⚠ " + html.escape(t("start_failed", lang, err="; ".join(map(str, err.issues)))), ""]
        except Exception as err:  # spawn failures: shown, the studio keeps serving
            return ["⚠ " + html.escape(t("start_failed", lang, err=f"{type(err).__name__}: {err}")), ""]
        return [t("started", lang, run=run.run_id), f"runs?run={run.run_id}"]

    build.start.click(on_start, [build.preset, radio, *ins], [build.message, nav], concurrency_limit=1,
                      concurrency_id="start").then(None, nav, None, js=NAV_JS)

    # `?clone=RUN_ID` (the Runs page's "Clone into form"): the run's frozen spec fills the form
    def on_open(lang: str, request: gr.Request) -> list[Any]:
        rid = request.query_params.get("clone", "") if request else ""
        if not rid:
            return [gr.skip(), *[gr.skip() for _ in fields()]]
        run = find_run(config.runs_dir, rid)
        try:
            if run is None:
                raise LookupError(rid)
            spec = load_spec(run.spec_path)
        except (LookupError, SpecError) as err:
            return ["⚠ " + html.escape(t("clone_failed", lang, err=err)), *[gr.skip() for _ in fields()]]
        return [t("cloned", lang, run=rid), *build.fill(spec)]

    demo.load(on_open, radio, [build.message, *ins], show_progress="hidden").then(vfn, vin, vout,
                                                                                  show_progress="hidden")
    _wire_language(demo, reg, radio, store, then=(_reset_prev(vfn), vin, vout))


def _reset_prev(validate: Any) -> Any:
    """Validation after a language switch re-sends every field's help (the previous messages are forgotten)."""
    def run(lang: str, prev: dict[str, str], *args: Any) -> list[Any]:
        return validate(lang, {}, *args)
    return run


def _runs_page(demo: gr.Blocks, config: StudioConfig, lang: str) -> None:
    reg = Registry()
    radio, store = _header(reg, lang, "subtitle_runs")
    runs = RunsTab(config, reg, radio, lang)
    nav = gr.Textbox(visible=False, elem_id="nav-url")
    timer = gr.Timer(config.refresh_s)
    memo = SessionMemo(session_defaults(lang, runs.run_select.value))
    r_out, s_out = runs.refresh_outputs(), runs.samples_outputs()
    kw: dict[str, Any] = {"show_progress": "hidden", "concurrency_limit": 8}

    def live_runs(request: gr.Request) -> list[Any]:
        return runs.refresh(memo.get(request))

    def live_samples(request: gr.Request) -> list[Any]:
        return runs.refresh_samples(memo.get(request))

    # one ticking event with no inputs (see app.session)
    def tick(request: gr.Request) -> list[Any]:
        m = memo.get(request)
        return [*runs.refresh(m), *runs.refresh_samples(m)]

    timer.tick(tick, None, [*r_out, *s_out], trigger_mode="once", concurrency_id="tick", **kw)
    runs.wire_controls(memo, live_runs, live_samples)

    def on_open(request: gr.Request) -> None:  # `runs?run=ID` selects that run
        rid = request.query_params.get("run", "") if request else ""
        if rid and find_run(config.runs_dir, rid) is not None:
            memo.get(request)["run_id"] = rid

    demo.load(on_open, None, None, queue=False).then(tick, None, [*r_out, *s_out], **kw)

    def on_clone(run_id: str | None, lang: str) -> list[Any]:
        if find_run(config.runs_dir, run_id or "") is None:
            return [t("no_run", lang), ""]
        return [gr.skip(), f"./?clone={run_id}"]

    runs.clone_btn.click(on_clone, [runs.run_select, radio], [runs.action_msg, nav], queue=False).then(
        None, nav, None, js=NAV_JS)
    _wire_language(demo, reg, radio, store, on_change=_forget_drawn(memo), then=(tick, [], [*r_out, *s_out]))


def _compare_page(demo: gr.Blocks, config: StudioConfig, lang: str) -> None:
    reg = Registry()
    radio, store = _header(reg, lang, "subtitle_compare")
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
    _wire_language(demo, reg, radio, store, on_change=_forget_drawn(memo), then=(live, [], c_out))


def _eval_page(demo: gr.Blocks, config: StudioConfig, lang: str) -> None:
    reg = Registry()
    radio, store = _header(reg, lang, "subtitle_eval")
    ev = EvalTab(config, reg, radio, lang)
    timer = gr.Timer(config.refresh_s)
    memo = SessionMemo({"lang": lang, "eval_out": None, "eval_sess": {}, "cmp_sel": []})
    ev.wire(memo, radio)

    def tick(request: gr.Request) -> list[Any]:
        return ev.tick(memo.get(request))

    timer.tick(tick, None, ev.tick_outputs(), trigger_mode="once", show_progress="hidden", concurrency_limit=8,
               concurrency_id="eval-tick")
    demo.load(tick, None, ev.tick_outputs(), show_progress="hidden")

    def forget(lang: str, request: gr.Request) -> None:
        m = memo.get(request)
        m["lang"], m["eval_sess"] = lang, {}

    _wire_language(demo, reg, radio, store, on_change=forget, then=(tick, [], ev.tick_outputs()))


def session_defaults(lang: str, run_id: str | None) -> dict[str, Any]:
    """A new browser session's view: what the freshly rendered page shows."""
    return {"lang": lang, "run_id": run_id, "smoothing": 0.0, "x_mode": "step", "panels": [], "step": 0,
            "follow": True, "rmin": "", "rmax": "", "text": "", "cmp_runs": [], "cmp_metric": "reward",
            "cmp_smoothing": 0.0, "cmp_x": "step", "runs_sess": {}, "samples_sess": {}, "compare_sess": {}}


def _forget_drawn(memo: SessionMemo) -> Any:
    def reset(lang: str, request: gr.Request) -> None:
        m = memo.get(request)
        m["lang"] = lang
        m["runs_sess"], m["samples_sess"], m["compare_sess"] = {}, {}, {}  # titles changed: redraw everything
    return reset
