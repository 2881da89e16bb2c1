"""The Runs page: the run list, run controls, progress, live dashboard, log tail and samples browser.

Everything shown is read from run directories (never from trainer memory), incrementally through the
shared RunStore, so a refresh or a studio restart loses nothing. One timer drives the updates; each
session remembers what it last drew and skips unchanged outputs, which keeps many open tabs cheap.
`runs_page` wires the page (`runs?run=ID` selects a run, Clone opens the Build page on its spec,
"Evaluate this run" the Evaluate page on the run).
"""

from __future__ import annotations

import html
import shutil
import time
from typing import Any

import gradio as gr

from app.config import StudioConfig
from app.fields import Registry
from app.figures import CHART_IDS, MetricTable, build_dashboard, has_tool_metrics, reward_histogram
from app.locales import chart_words, state_label, t
from app.media import thumb_uris
from app.page import NAV_JS, forget_drawn, header, session_defaults, wire_language
from app.run_summary import FINAL_STATES, summarize, summary_markdown
from app.runlist import RUN_COLUMNS, RunInfo, controls, find_run, format_duration, progress, runs_table
from app.samples_view import EPISODE_LABELS, SampleFilter, render_step
from app.session import SessionMemo
from backend import launcher
from backend.rundir import ACTIVE_STATES, RESUMABLE_STATES, BestCheckpoint, RunDir

STATE_COLORS = {"running": "#16a34a", "starting": "#2563eb", "stopping": "#d97706", "stopped": "#6b7280",
                "finished": "#0f766e", "failed": "#dc2626", "broken": "#dc2626"}


TABLE_REDRAW_S = 4.0
MAIN_CHARTS = ("reward", "reward_spread", "lengths", "policy", "tools")  # tools: shown for agentic runs only
OPTIONAL_CHARTS = {"tools": has_tool_metrics}  # chart -> does the run log its metrics
MORE_CHARTS = ("optim", "timing", "throughput", "telemetry", "eval")
# Gradio's autoscroll misses a log tail filled while its accordion is closed: when the text changes, the newest
# line is brought into view
LOG_SCROLL_JS = """() => { requestAnimationFrame(() => { const t = document.querySelector('#log-tail textarea');
  if (t) { t.scrollTop = t.scrollHeight; } }); }"""


def episode_labels(lang: str) -> dict[str, str]:
    """The multi-turn sample view's words (app.samples_view.EPISODE_LABELS) in `lang`."""
    return {k: t(f"s_{k}", lang) for k in EPISODE_LABELS}


def chart_titles(lang: str) -> dict[str, str]:
    return {cid: t(f"chart_{cid}", lang) for cid in CHART_IDS}


def progress_html(info: RunInfo | None, tokens_per_s: float | None, lang: str, best: BestCheckpoint | None = None) -> str:
    if info is None:
        return f'<div class="gs-muted">{html.escape(t("no_run", lang))}</div>'
    p = progress(info, tokens_per_s)
    color = STATE_COLORS.get(info.state, "#6b7280")
    bits = [f'<span class="gs-badge" style="background:{color}" id="run-state">{html.escape(state_label(info.state, lang))}</span>',
            f"{t('progress_step', lang)} <b>{p.step}</b>/{p.total or '?'}",
            f"{t('elapsed', lang)} {format_duration(p.elapsed_s) or '–'}"]
    if p.eta_s is not None:
        bits.append(f"{t('eta', lang)} {format_duration(p.eta_s)}")
    if p.step_s:
        bits.append(f"{p.step_s:.2f} {t('per_step', lang)}")
    if p.tokens_per_s:
        bits.append(f"{p.tokens_per_s:,.0f} {t('tok_s', lang)}")
    reward = info.latest().reward  # the runs table's own text for this run (RunInfo.row)
    if reward:
        bits.append(f"{t('s_reward', lang)} {reward}")
    if best is not None:
        text = t("best_checkpoint", lang, step=best.step, metric=best.metric, value=f"{best.value:.3f}")
        bits.append(f'<span id="best-ckpt">{html.escape(text)}</span>')
    out = (f'<div class="gs-progress" data-state="{html.escape(info.state)}"><div class="gs-bar"><div style="width:{p.fraction * 100:.1f}%;'
           f'background:{color}"></div></div><div class="gs-progress-text">{" · ".join(bits)}</div></div>')
    if info.warnings:
        items = "".join(f"<li>{html.escape(w)}</li>" for w in info.warnings)
        out += (f'<div class="gs-warning" id="run-warnings"><b>⚠ {html.escape(t("run_warnings", lang))}</b>'
                f'<ul>{items}</ul></div>')
    if info.state in ("failed", "broken"):
        err = info.error or "the trainer process exited without writing an error (see the log below)"
        out += (f'<div class="gs-failed" id="run-error"><b>⚠ {html.escape(t("run_failed", lang))}</b>'
                f'<pre>{html.escape(err)}</pre></div>')
    return out


class RunsTab:
    def __init__(self, config: StudioConfig, reg: Registry, lang_input: Any, lang: str = "en") -> None:
        self.config, self.reg, self.lang_input = config, reg, lang_input
        infos, rows = runs_table(config.runs_dir)
        ids = [i.run_id for i in infos]
        self.table = gr.Dataframe(value=self._table_value(rows, lang), interactive=False, wrap=False,
                                  label=t("runs_table", lang), elem_id="runs-table", max_height=260)
        reg.label(self.table, "runs_table")
        ctl = controls(infos[0].state if infos else None)
        with gr.Row(equal_height=True):
            self.run_select = gr.Dropdown(ids, value=ids[0] if ids else None, label=t("run_select", lang), scale=3,
                                          elem_id="run-select")
            reg.label(self.run_select, "run_select")
            # Stop and Resume follow the selected run's state (see _controls)
            self.stop_btn = reg.value(gr.Button(t(ctl.stop_key, lang), variant="stop" if ctl.stop else "secondary",
                                                interactive=ctl.stop, scale=1, elem_id="stop-btn"), "stop")
            self.resume_btn = reg.value(gr.Button(t("resume", lang), interactive=ctl.resume, scale=1,
                                                  elem_id="resume-btn"), "resume")
            self.clone_btn = reg.value(gr.Button(t("clone", lang), scale=1, elem_id="clone-btn"), "clone")
            self.eval_btn = reg.value(gr.Button(t("evaluate_run", lang), scale=1, elem_id="evaluate-run-btn"),
                                      "evaluate_run")
            self.delete_btn = reg.value(gr.Button(t("delete", lang), scale=1, elem_id="delete-btn"), "delete")
        with gr.Row(visible=False) as self.confirm_row:
            self.confirm_btn = gr.Button(variant="stop", elem_id="confirm-delete-btn")
            self.cancel_btn = reg.value(gr.Button(t("cancel", lang), elem_id="cancel-delete-btn"), "cancel")
        self.controls_hint = gr.Markdown(self._hint(infos[0] if infos else None, lang), elem_id="run-controls-hint",
                                         elem_classes=["gs-note"])
        self.action_msg = gr.Markdown(elem_id="run-action-msg")
        self.progress = gr.HTML(elem_id="run-progress")
        # a run that has ended: what happened, on one screen, copyable as Markdown (app.run_summary)
        with gr.Accordion(t("sum_acc", lang), open=True, visible=False, elem_id="run-summary-acc") as self.summary_acc:
            reg.label(self.summary_acc, "sum_acc")
            self.summary = gr.Markdown(elem_id="run-summary")
            with gr.Accordion(t("sum_copy", lang), open=False, elem_id="run-summary-copy") as copy_acc:
                reg.label(copy_acc, "sum_copy")
                self.summary_code = gr.Code(language="markdown", interactive=False, show_label=False,
                                            elem_id="run-summary-md")

        with gr.Accordion(t("dashboard", lang), open=True) as acc:
            reg.label(acc, "dashboard")
            with gr.Row():
                self.smoothing = reg.label(gr.Slider(0, 0.99, value=0.0, step=0.01, label=t("smoothing", lang),
                                                     elem_id="smoothing"), "smoothing")
                self.x_mode = gr.Radio([(t("x_step", lang), "step"), (t("x_elapsed", lang), "elapsed"),
                                        (t("x_wall", lang), "wall")], value="step", label=t("x_axis", lang),
                                       elem_id="x-mode")
                reg.add(self.x_mode, lambda lg: {"label": t("x_axis", lg), "choices": [
                    (t("x_step", lg), "step"), (t("x_elapsed", lg), "elapsed"), (t("x_wall", lg), "wall")]})
            self.plots: dict[str, gr.Plot] = {}
            self._chart_grid(MAIN_CHARTS)
            # the rest start collapsed and are not redrawn while collapsed: every visible chart costs the
            # browser a Plotly redraw per training step, which adds up with several open sessions
            with gr.Accordion(t("more_charts", lang), open=False, elem_id="more-charts") as self.more_acc:
                reg.label(self.more_acc, "more_charts")
                self._chart_grid(MORE_CHARTS)

        with gr.Accordion(t("samples", lang), open=True, elem_id="samples-acc") as sacc:
            reg.label(sacc, "samples")
            with gr.Row():
                self.step = gr.Slider(0, 1, value=0, step=1, label=t("sample_step", lang), scale=3, elem_id="sample-step")
                reg.label(self.step, "sample_step")
                self.follow = reg.label(gr.Checkbox(True, label=t("follow_latest", lang), scale=1,
                                                    elem_id="follow-latest"), "follow_latest")
            with gr.Row():
                # text, not Number: an empty box means "no bound" (a Number would send 0)
                self.rmin = reg.label(gr.Textbox(label=t("reward_min", lang), scale=1, elem_id="sample-rmin"),
                                      "reward_min")
                self.rmax = reg.label(gr.Textbox(label=t("reward_max", lang), scale=1, elem_id="sample-rmax"),
                                      "reward_max")
                self.text = reg.label(gr.Textbox(label=t("text_filter", lang), scale=2, elem_id="sample-text"),
                                      "text_filter")
            self.hist = gr.Plot(show_label=False, elem_id="chart-hist")
            self.samples = gr.HTML(elem_id="samples-view")

        with gr.Accordion(t("log_tail", lang), open=False, elem_id="log-acc") as self.log_acc:
            lacc = self.log_acc
            reg.label(lacc, "log_tail")
            self.log = gr.Textbox(lines=14, max_lines=14, show_label=False, autoscroll=True, interactive=False,
                                  elem_id="log-tail", buttons=["copy"])

    def _chart_grid(self, ids: tuple[str, ...]) -> None:
        for i in range(0, len(ids), 2):
            with gr.Row(equal_height=True):
                for cid in ids[i:i + 2]:
                    self.plots[cid] = gr.Plot(show_label=False, elem_id=f"chart-{cid}", elem_classes=["gs-chart"],
                                              visible=cid not in OPTIONAL_CHARTS)

    # ------------------------------------------------------------------------- helpers

    @staticmethod
    def _table_value(rows: list[list[Any]], lang: str) -> dict[str, Any]:
        headers = [t(f"col_{c}", lang) for c in RUN_COLUMNS]
        data = [[r[0], r[1], state_label(r[2], lang), *r[3:]] for r in rows]
        return {"headers": headers, "data": data or [["", "", "", "", "", "", ""]]}

    def _run(self, run_id: str | None) -> RunDir | None:
        return find_run(self.config.runs_dir, run_id or "")

    @staticmethod
    def _hint(info: RunInfo | None, lang: str) -> str:
        """Why Resume is greyed out ('' when it is offered or no run is selected)."""
        if info is None or controls(info.state).resume:
            return ""
        return t("why_no_resume", lang, run=info.run_id, state=state_label(info.state, lang))

    def _controls(self, info: RunInfo | None, lang: str, sess: dict[str, Any]) -> list[Any]:
        """Stop, Resume, the hint and the action message for the selected run; unchanged ones are skipped.
        The action message ("Stopping ... Click again to kill it now") is cleared once the run it spoke of
        has left the active states."""
        ctl = controls(info.state if info else None)
        sig = (ctl, lang, info.run_id if info else None)
        out: list[Any] = [gr.skip()] * 3
        if sess.get("controls") != sig:
            sess["controls"] = sig
            out = [gr.update(value=t(ctl.stop_key, lang), interactive=ctl.stop, variant="stop" if ctl.stop else "secondary"),
                   gr.update(interactive=ctl.resume), self._hint(info, lang)]
        now = (info.run_id, info.state) if info else None
        prev, sess["state"] = sess.get("state"), now
        settled = prev is not None and now is not None and prev[0] == now[0] and prev[1] in ACTIVE_STATES \
            and now[1] not in ACTIVE_STATES
        return [*out, "" if settled else gr.skip()]

    # ------------------------------------------------------------------------- live refresh

    def refresh_outputs(self) -> list[Any]:
        return [self.table, self.run_select, self.progress, self.stop_btn, self.resume_btn, self.controls_hint,
                self.action_msg, self.log, self.summary_acc, self.summary, self.summary_code, *self.plots.values()]

    def refresh(self, m: dict[str, Any]) -> list[Any]:
        """One live tick for session memo `m` (see app.session): outputs that did not change are skipped
        (no payload, no browser redraw)."""
        run_id, smoothing, x_mode, lang, panels = m["run_id"], m["smoothing"], m["x_mode"], m["lang"], m["panels"]
        sess = m.setdefault("runs_sess", {})
        now = time.time()
        infos, rows = runs_table(self.config.runs_dir, now)
        ids = [i.run_id for i in infos]
        if run_id not in ids:
            run_id = ids[0] if ids else None
        m["run_id"] = run_id
        # The table redraws at once when runs come, go or change state, and when the selected run's row changes
        # (its step and reward are the status line's: the two never disagree); other runs' new steps and
        # rewards at most every TABLE_REDRAW_S (a table redraw is not cheap in the page).
        selected = next((tuple(r[:-1]) for r in rows if r[0] == run_id), None)
        shape = (tuple((r[0], r[2]) for r in rows), lang, selected)
        content = tuple(tuple(r[:-1]) for r in rows)
        prev = sess.get("table")
        if prev is None or prev[0] != shape or (prev[1] != content and now - prev[2] >= TABLE_REDRAW_S):
            table_up = self._table_value(rows, lang)
            sess["table"] = (shape, content, now)
        else:
            table_up = gr.skip()
        select_sig = (tuple(ids), run_id)
        select_up = gr.skip() if sess.get("select") == select_sig else gr.update(choices=ids, value=run_id)
        sess["select"] = select_sig
        info = next((i for i in infos if i.run_id == run_id), None)

        table = _EMPTY
        version: Any = "none"
        best = None
        if info is not None:
            cache = self.config.store.get(info.path)
            table = cache.refresh_metrics()
            version = cache.version
            best = RunDir(info.path).best_checkpoint()
        plots: dict[str, Any] = {}
        for group, chart_ids in (("main", MAIN_CHARTS), ("more", MORE_CHARTS)):
            if group == "more" and "more" not in (panels or []):
                sess["dash_more"] = None  # redrawn when opened
                plots.update(dict.fromkeys(chart_ids, gr.skip()))
                continue
            view = (run_id, round(float(smoothing or 0), 3), x_mode, lang, best)
            prev = sess.get(f"dash_{group}")
            # New steps alone redraw at most every redraw_s (a Plotly redraw per chart per step is what
            # loads the browser most); a changed view (run, smoothing, axis, language) redraws at once.
            throttled = prev is not None and prev[0] == view and now - prev[2] < self.config.redraw_s
            if (prev is not None and prev[:2] == (view, version)) or throttled:
                plots.update(dict.fromkeys(chart_ids, gr.skip()))
                continue
            sess[f"dash_{group}"] = (view, version, now)
            empty = t("no_data" if info is not None else "no_runs", lang)
            figs = build_dashboard(table, chart_titles(lang), x_mode or "step", float(smoothing or 0), empty,
                                   only=chart_ids, best=best, names=chart_words(lang))
            for cid, shown in OPTIONAL_CHARTS.items():
                if cid in figs:
                    figs[cid] = gr.update(value=figs[cid], visible=shown(table))
            plots.update(figs)
        plot_list = [plots[c] for c in self.plots]

        tps = table.last("throughput/completion_tokens_per_s") if info is not None else None
        prog = progress_html(info, tps, lang, best)
        prog_up = gr.skip() if sess.get("progress") == prog else prog
        sess["progress"] = prog
        ctl_up = self._controls(info, lang, sess)
        sum_up = self._summary(info, version, lang, sess)
        if info is None:
            return [table_up, select_up, prog_up, *ctl_up, gr.skip(), *sum_up, *plot_list]
        log_up: Any = gr.skip()
        if "log" in (panels or []):
            run = RunDir(info.path)
            try:
                st = run.log_path.stat()
                log_sig = (run_id, st.st_size, st.st_mtime)
            except OSError:
                log_sig = (run_id, 0, 0)
            if sess.get("log") != log_sig:
                log_up = run.log_tail(12000)
            sess["log"] = log_sig
        else:
            sess["log"] = None
        return [table_up, select_up, prog_up, *ctl_up, log_up, *sum_up, *plot_list]

    def _summary(self, info: RunInfo | None, version: Any, lang: str, sess: dict[str, Any]) -> list[Any]:
        """The ended run's summary (hidden while a run is active); rebuilt when the run, its state, its data or
        the language change."""
        ended = info is not None and info.state in FINAL_STATES
        sig = (info.run_id, info.state, info.step, version, lang) if ended and info is not None else None
        if sess.get("summary", "unset") == sig:
            return [gr.skip()] * 3
        sess["summary"] = sig
        if not ended or info is None:
            return [gr.update(visible=False), gr.skip(), gr.skip()]
        md = summary_markdown(summarize(RunDir(info.path)), lang)
        return [gr.update(visible=True), md, md]

    def samples_outputs(self) -> list[Any]:
        return [self.step, self.samples, self.hist]

    def refresh_samples(self, m: dict[str, Any]) -> list[Any]:
        run_id, step, follow, lang = m["run_id"], m["step"], m["follow"], m["lang"]
        sess = m.setdefault("samples_sess", {})
        run = self._run(run_id)
        if run is None:
            sig = ("none", lang)
            if sess.get("sig") == sig:
                return [gr.skip(), gr.skip(), gr.skip()]
            sess["sig"] = sig
            return [gr.update(maximum=1, value=0), f'<div class="gs-muted">{t("no_samples", lang)}</div>',
                    reward_histogram([], t("chart_hist", lang), empty_message=t("no_samples", lang),
                                     names=chart_words(lang))]
        cache = self.config.store.get(run.path)
        steps = cache.sample_steps()
        if not steps:
            sig = (run_id, "empty", lang)
            if sess.get("sig") == sig:
                return [gr.skip(), gr.skip(), gr.skip()]
            sess["sig"] = sig
            return [gr.update(maximum=1, value=0), f'<div class="gs-muted">{t("no_samples", lang)}</div>',
                    reward_histogram([], t("chart_hist", lang), empty_message=t("no_samples", lang),
                                     names=chart_words(lang))]
        if follow or step is None:
            chosen = steps[-1]
        else:
            chosen = min(steps, key=lambda s: (abs(s - step), -s))
        m["step"] = chosen
        flt = SampleFilter(_bound(m["rmin"]), _bound(m["rmax"]), (m["text"] or "").strip())
        view = (run_id, chosen if not follow else None, flt, lang)
        prev = sess.get("view")
        # following the latest step, new steps re-render the samples at most every samples_redraw_s
        if follow and prev is not None and prev[0] == view and time.time() - prev[1] < self.config.samples_redraw_s:
            return [gr.skip(), gr.skip(), gr.skip()]
        sess["view"] = (view, time.time())
        sig = (run_id, len(steps), steps[-1], chosen, flt, lang)
        slider_sig = (steps[-1], chosen)
        # the minimum stays 0: a value sent back while the page still holds an older range is never rejected
        slider_up = gr.skip() if sess.get("slider") == slider_sig else gr.update(maximum=max(steps[-1], 1), value=chosen)
        sess["slider"] = slider_sig
        if sess.get("sig") == sig:
            return [slider_up, gr.skip(), gr.skip()]
        sess["sig"] = sig
        labels = {"prompt": t("s_prompt", lang), "solution": t("s_solution", lang), "completion": t("s_completion", lang),
                  "reward": t("s_reward", lang), "advantage": t("s_adv", lang), "length": t("s_len", lang),
                  "group": t("s_group", lang), "empty": t("samples_none", lang), "best": t("s_best", lang),
                  "worst": t("s_worst", lang), "replayed": t("s_replayed", lang), **episode_labels(lang)}
        view_html = render_step(cache.step_rows(chosen), flt, labels,
                                image_uris=lambda refs: thumb_uris(refs, self.config.workspace))
        groups = [(t("hist_first", lang, s=steps[0]), cache.step_rewards(steps[0]))]
        if chosen not in (steps[0], steps[-1]):
            groups.append((t("hist_chosen", lang, s=chosen), cache.step_rewards(chosen)))
        if steps[-1] != steps[0]:
            groups.append((t("hist_latest", lang, s=steps[-1]), cache.step_rewards(steps[-1])))
        hist = reward_histogram(groups, t("chart_hist", lang), empty_message=t("no_samples", lang),
                                names=chart_words(lang))
        return [slider_up, view_html, hist]

    # ------------------------------------------------------------------------- controls

    def on_stop(self, run_id: str | None, lang: str) -> str:
        run = self._run(run_id)
        if run is None:
            return t("no_run", lang)
        force = run.state() == "stopping"  # the second click kills the whole process group
        result = launcher.stop(run, force=force)
        key = {"stopping": "stopping", "killed": "killed"}.get(result, "not_running")
        return t(key, lang, run=run.run_id)

    def on_resume(self, run_id: str | None, lang: str) -> str:
        run = self._run(run_id)
        if run is None:
            return t("no_run", lang)
        state = run.state()
        if state not in RESUMABLE_STATES:  # the button is greyed; a click from a page not yet refreshed lands here
            return "⚠ " + t("why_no_resume", lang, run=run.run_id, state=state_label(state, lang))
        try:
            launcher.resume(run, self.config.workspace.root, self.config.workspace)
        except Exception as err:  # still running, no checkpoint, ...: say so next to the buttons
            return "⚠ " + html.escape(t("resume_failed", lang, err=err))
        return t("resumed", lang, run=run.run_id)

    def on_delete(self, run_id: str | None, lang: str) -> tuple[Any, Any, str]:
        run = self._run(run_id)
        if run is None:
            return gr.update(visible=False), gr.skip(), t("no_run", lang)
        return gr.update(visible=True), gr.update(value=t("confirm_delete", lang, run=run.run_id)), ""

    def on_confirm_delete(self, run_id: str | None, lang: str) -> tuple[Any, str]:
        run = self._run(run_id)
        if run is None:
            return gr.update(visible=False), "⚠ " + t("delete_refused", lang, run=html.escape(str(run_id)))
        if run.state() in ACTIVE_STATES:  # state() reads a dead process's active state as failed
            return gr.update(visible=False), "⚠ " + t("delete_active", lang, run=run.run_id)
        root = self.config.runs_dir
        target = run.path.resolve()
        if target.parent != root or target == root or run.path.is_symlink():  # find_run checked; never outside runs
            return gr.update(visible=False), "⚠ " + t("delete_refused", lang, run=run.run_id)
        shutil.rmtree(target)
        self.config.store.forget(target)
        return gr.update(visible=False), t("deleted", lang, run=run.run_id)

    def wire_controls(self, memo: SessionMemo, live_runs: Any, live_samples: Any) -> None:
        """User actions: store the new view in the session memo, then redraw what depends on it."""
        kw: dict[str, Any] = {"show_progress": "hidden", "concurrency_limit": 8, "trigger_mode": "always_last"}
        r_out, s_out = self.refresh_outputs(), self.samples_outputs()

        def then_runs(ev: Any) -> None:
            ev.then(live_runs, None, r_out, concurrency_id="refresh", **kw).then(
                live_samples, None, s_out, concurrency_id="samples", **kw)

        then_runs(self.run_select.change(memo.setter("run_id"), self.run_select, None, queue=False))
        self.smoothing.release(memo.setter("smoothing"), self.smoothing, None, queue=False).then(
            live_runs, None, r_out, concurrency_id="refresh", **kw)
        self.x_mode.change(memo.setter("x_mode"), self.x_mode, None, queue=False).then(
            live_runs, None, r_out, concurrency_id="refresh", **kw)
        for acc, name in ((self.more_acc, "more"), (self.log_acc, "log")):
            acc.expand(_panel(memo, name, True), None, None, queue=False).then(
                live_runs, None, r_out, concurrency_id="refresh", **kw)
            acc.collapse(_panel(memo, name, False), None, None, queue=False)

        def on_step(value: float, request: gr.Request) -> bool:
            m = memo.get(request)
            m["step"], m["follow"] = value, False  # moving the slider stops following the latest step
            return False

        self.step.release(on_step, self.step, self.follow, queue=False).then(
            live_samples, None, s_out, concurrency_id="samples", **kw)
        self.follow.input(memo.setter("follow"), self.follow, None, queue=False).then(
            live_samples, None, s_out, concurrency_id="samples", **kw)
        for comp, key in ((self.rmin, "rmin"), (self.rmax, "rmax"), (self.text, "text")):
            comp.change(memo.setter(key), comp, None, queue=False)
            for ev in (comp.submit, comp.blur):
                ev(memo.setter(key), comp, None, queue=False).then(live_samples, None, s_out, concurrency_id="samples",
                                                                    **kw)
        self.table.select(_select_row, None, self.run_select)
        self.log.change(None, None, None, js=LOG_SCROLL_JS)  # in the browser only, when new lines arrived
        msg_in = [self.run_select, self.lang_input]
        plain = {k: v for k, v in kw.items() if k != "trigger_mode"}
        self.stop_btn.click(self.on_stop, msg_in, self.action_msg).then(live_runs, None, r_out, **plain)
        self.resume_btn.click(self.on_resume, msg_in, self.action_msg).then(live_runs, None, r_out, **plain)
        self.delete_btn.click(self.on_delete, msg_in, [self.confirm_row, self.confirm_btn, self.action_msg])
        self.cancel_btn.click(lambda: gr.update(visible=False), None, self.confirm_row)
        self.confirm_btn.click(self.on_confirm_delete, msg_in, [self.confirm_row, self.action_msg]).then(
            live_runs, None, r_out, **plain)


def _panel(memo: SessionMemo, name: str, opened: bool) -> Any:
    def update(request: gr.Request) -> None:
        m = memo.get(request)
        rest = [p for p in m["panels"] if p != name]
        m["panels"] = [*rest, name] if opened else rest
    return update


def _bound(text: str | None) -> float | None:
    try:
        return float(text) if text is not None and str(text).strip() else None
    except ValueError:
        return None


def _select_row(evt: gr.SelectData) -> Any:
    row = evt.row_value or []
    return gr.update(value=row[0]) if row and row[0] else gr.skip()


_EMPTY = MetricTable()


def runs_page(demo: gr.Blocks, config: StudioConfig, lang: str) -> None:
    reg = Registry()
    radio, store = header(reg, lang, "subtitle_runs")
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

    def on_evaluate(run_id: str | None, lang: str) -> list[Any]:  # the Evaluate page opens on the run
        if find_run(config.runs_dir, run_id or "") is None:
            return [t("no_run", lang), ""]
        return [gr.skip(), f"evaluate?model={run_id}"]

    runs.eval_btn.click(on_evaluate, [runs.run_select, radio], [runs.action_msg, nav], queue=False).then(
        None, nav, None, js=NAV_JS)
    wire_language(demo, reg, radio, store, on_change=forget_drawn(memo), then=(tick, [], [*r_out, *s_out]))
