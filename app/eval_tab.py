"""The Evaluate page: run an evaluation with live progress, compare models' answers, chat, export.

Evaluations and exports run as child processes (`python -m backend.eval`, `python -m backend.eval.export`,
started with backend.project.child_env()); the page follows them through their folders only. Chat loads
the chosen model into the studio process (cached, two at most) and streams the reply. `eval_page` wires
the page: one timer follows the running evaluation and the finished ones.
"""

from __future__ import annotations

import html
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import gradio as gr

from app.config import StudioConfig
from app.eval_view import (
    all_evals,
    comparison_table,
    data_choices,
    eval_command,
    eval_label,
    model_choices,
    progress_html,
    resolve_data_ref,
    resolve_model_ref,
    results_table,
    side_by_side_html,
)
from app.fields import UPLOAD_HEIGHT, Registry
from app.figures import reward_histogram
from app.locales import chart_words, t
from app.media import thumb_uris
from app.page import header, wire_language
from app.paths import PathError
from app.runlist import find_run
from app.session import SessionMemo
from backend.eval import options
from backend.eval.compare import FILTERS, CompareError, compare, load_eval
from backend.eval.options import EvalConfig
from backend.procs import spawn_group
from backend.project import child_env
from backend.rundir import read_eval_status, read_json_object

MAX_CHAT_MODELS = 2


class EvalTab:
    def __init__(self, config: StudioConfig, reg: Registry, lang_input: Any, lang: str = "en") -> None:
        self.config, self.lang_input = config, lang_input
        self.evals_dir = config.runs_dir.parent / "evals"  # evaluations of models that are not runs
        self._chat_models: OrderedDict[str, Any] = OrderedDict()
        self._chat_lock = threading.Lock()
        models = model_choices(config.runs_dir, config.workspace)
        # ---------------------------------------------------------------- evaluate
        with gr.Accordion(t("ev_run", lang), open=True) as acc:
            reg.label(acc, "ev_run")
            model_opt, data_opt, *main = options.form_fields("main")
            with gr.Row():
                self.model = gr.Dropdown(models, value=models[0], allow_custom_value=True, scale=3,
                                         label=options.label(model_opt, lang), info=t("ev_model_info", lang),
                                         elem_id="eval-model")
                reg.add(self.model, lambda lg, f=model_opt: {"label": options.label(f, lg),
                                                             "info": t("ev_model_info", lg)})
                self.data = gr.Dropdown(data_choices(config.workspace), value="", allow_custom_value=True, scale=3,
                                        label=options.label(data_opt, lang), info=t("ev_data_info", lang),
                                        elem_id="eval-data")
                reg.add(self.data, lambda lg, f=data_opt: {"label": options.label(f, lg), "info": t("ev_data_info", lg)})
            with gr.Row():
                self.options = {f.name: _option_widget(f, reg, lang) for f in main}
            with gr.Accordion(t("ev_columns", lang), open=False) as cols:
                reg.label(cols, "ev_columns")
                with gr.Row():
                    self.options.update({f.name: _option_widget(f, reg, lang) for f in options.form_fields("columns")})
            with gr.Row():
                self.run_btn = reg.value(gr.Button(t("ev_start", lang), variant="primary", elem_id="eval-start"),
                                         "ev_start")
                self.pair_btn = reg.value(gr.Button(t("ev_pair", lang), elem_id="eval-pair"), "ev_pair")
            self.message = gr.Markdown(elem_id="eval-message")
            self.progress = gr.HTML(elem_id="eval-progress")
            # hidden until there are results: an empty Dataframe shows placeholder headers "1 2 3"
            self.results = gr.Dataframe(interactive=False, elem_id="eval-results", label=t("ev_results", lang),
                                        visible=False)
            reg.label(self.results, "ev_results")
        # ---------------------------------------------------------------- compare
        with gr.Accordion(t("ev_compare", lang), open=True) as acc:
            reg.label(acc, "ev_compare")
            with gr.Row():
                self.cmp_evals = gr.Dropdown(self._finished()[1], value=[], multiselect=True, scale=3,
                                             label=t("ev_cmp_evals", lang),
                                             info=t("ev_cmp_info", lang), elem_id="cmp-evals")
                reg.label_info(self.cmp_evals, "ev_cmp_evals", "ev_cmp_info")
                self.cmp_filter = gr.Radio([(t(f"ev_f_{f}", lang), f) for f in FILTERS], value="all", scale=2,
                                           label=t("ev_filter", lang), elem_id="cmp-filter")
                reg.add(self.cmp_filter, lambda lg: {"label": t("ev_filter", lg),
                                                     "choices": [(t(f"ev_f_{f}", lg), f) for f in FILTERS]})
            self.cmp_msg = gr.Markdown(elem_id="cmp-msg")
            self.cmp_table = gr.Dataframe(interactive=False, elem_id="cmp-metrics", label=t("ev_cmp_table", lang),
                                          visible=False)
            reg.label(self.cmp_table, "ev_cmp_table")
            with gr.Row():
                self.cmp_hist = gr.Plot(show_label=False, elem_id="chart-cmp-hist")
                self.cmp_csv = gr.DownloadButton(t("ev_csv", lang), elem_id="cmp-csv", visible=False)
                reg.add(self.cmp_csv, lambda lg: {"label": t("ev_csv", lg)})
            self.cmp_view = gr.HTML(elem_id="cmp-view")
        # ---------------------------------------------------------------- chat
        with gr.Accordion(t("ev_chat", lang), open=False, elem_id="chat-acc") as acc:
            reg.label(acc, "ev_chat")
            with gr.Row():
                self.chat_a = gr.Dropdown(models, value=models[0], allow_custom_value=True, label=t("ev_chat_a", lang),
                                          elem_id="chat-model-a")
                reg.label(self.chat_a, "ev_chat_a")
                self.chat_b = gr.Dropdown(["", *models], value="", allow_custom_value=True, label=t("ev_chat_b", lang),
                                          elem_id="chat-model-b")
                reg.label(self.chat_b, "ev_chat_b")
            with gr.Row():
                self.chat_temp = reg.label(gr.Slider(0, 2, value=0.7, step=0.05, label=t("ev_chat_temp", lang)),
                                           "ev_chat_temp")
                self.chat_top_p = gr.Slider(0.05, 1, value=1.0, step=0.05, label="top_p")
                self.chat_max = reg.label(gr.Number(256, precision=0, label=t("ev_chat_max", lang),
                                                    elem_id="chat-max"), "ev_chat_max")
                self.chat_system = reg.label(gr.Textbox("", label=t("ev_system", lang)), "ev_system")
            with gr.Row():
                self.chat_view_a = gr.Chatbot(label="A", elem_id="chat-a", height=300)
                self.chat_view_b = gr.Chatbot(label="B", elem_id="chat-b", height=300)
            with gr.Row():
                self.chat_msg = gr.Textbox(scale=4, show_label=False, placeholder=t("ev_chat_ph", lang),
                                           elem_id="chat-input")
                reg.add(self.chat_msg, lambda lg: {"placeholder": t("ev_chat_ph", lg)})
                self.chat_image = reg.own_words(reg.label(
                    gr.Image(type="filepath", sources=["upload", "clipboard"], scale=1, height=UPLOAD_HEIGHT,
                             label=t("ev_chat_image", lang), elem_id="chat-image"), "ev_chat_image"))
                self.chat_send = reg.value(gr.Button(t("ev_send", lang), scale=1, elem_id="chat-send"), "ev_send")
                self.chat_clear = reg.value(gr.Button(t("ev_clear", lang), scale=1), "ev_clear")
        # ---------------------------------------------------------------- export
        with gr.Accordion(t("ev_export", lang), open=False, elem_id="export-acc") as acc:
            reg.label(acc, "ev_export")
            with gr.Row():
                self.exp_model = gr.Dropdown(models, value=models[0], allow_custom_value=True, scale=2,
                                             label=t("ev_model", lang), elem_id="export-model")
                reg.label(self.exp_model, "ev_model")
                self.exp_out = reg.label(gr.Textbox("exports/model", scale=2, label=t("ev_export_out", lang),
                                                    elem_id="export-out"), "ev_export_out")
                self.exp_push = reg.label(gr.Textbox("", scale=1, label=t("ev_push", lang), elem_id="export-push"),
                                          "ev_push")
                self.exp_btn = reg.value(gr.Button(t("ev_export_btn", lang), scale=1, elem_id="export-btn"),
                                         "ev_export_btn")
            self.exp_msg = gr.Markdown(elem_id="export-msg")

    # -------------------------------------------------------------------- evaluate

    def _config(self, model: str, data: str, values: tuple[Any, ...], out: Path | None = None) -> EvalConfig:
        """The form's EvalConfig (the workspace's references resolved); ValueError or PathError names the field."""
        ws, runs = self.config.workspace, self.config.runs_dir
        fixed = {"model": resolve_model_ref(model, runs, ws), "data": resolve_data_ref(data, ws),
                 "out": str(out) if out else ""}
        return options.from_form(dict(zip(self.options, values, strict=True)), **fixed)

    def _out_dir(self, model_ref: str, tag: str) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        head = model_ref.rpartition(":")[0] if ":" in Path(model_ref).name else model_ref
        run_dir = Path(head)
        root = run_dir / "eval" if (run_dir / "spec.yaml").is_file() else self.evals_dir
        out = root / f"{stamp}-studio-{tag}"
        k = 1
        while out.exists():
            k += 1
            out = root / f"{stamp}-studio-{tag}-{k}"
        out.mkdir(parents=True)
        return out

    def _spawn(self, cmd: list[str], out: Path) -> None:
        with (out / "eval.log").open("ab") as log:
            spawn_group(cmd, cwd=self.config.workspace.root, stdout=log)

    def on_run(self, request: gr.Request, lang: str, model: str, data: str, *values: Any) -> str:
        try:
            cfg = self._config(model, data, values)
        except (PathError, ValueError) as err:
            return "⚠ " + html.escape(t("ev_bad", lang, err=err))
        out = self._out_dir(cfg.model, "eval")
        cfg.out = str(out)
        self._spawn(eval_command(cfg), out)
        self.memo.get(request)["eval_out"] = str(out)
        return t("ev_started", lang, out=self.config.workspace.rel(out))

    def on_pair(self, request: gr.Request, lang: str, model: str, data: str, *values: Any) -> str:
        """Evaluate the run's base model and the chosen checkpoint with the same prompts and seed, then compare."""
        try:
            cfg = self._config(model, data, values)
        except (PathError, ValueError) as err:
            return "⚠ " + html.escape(t("ev_bad", lang, err=err))
        head = cfg.model.rpartition(":")[0] if ":" in Path(cfg.model).name else cfg.model
        if not (Path(head) / "spec.yaml").is_file():
            return "⚠ " + t("ev_pair_needs_run", lang)
        out = self._out_dir(cfg.model, "compare")
        cfg.out = str(out)
        self._spawn([sys.executable, "-m", "backend.eval.compare", "--model", f"{head}:base", "--model", cfg.model,
                     *options.to_argv(cfg, skip=("model",))], out)
        m = self.memo.get(request)
        m["eval_out"], m["pair"], m["pair_shown"] = str(out / "0"), [str(out / "0"), str(out / "1")], False
        return t("ev_started", lang, out=self.config.workspace.rel(out))

    def _finished(self) -> tuple[dict[str, Path], list[tuple[str, str]]]:
        """Every evaluation, and the picker's choices: the finished ones, named by model, data and time."""
        evals = all_evals(self.config.runs_dir, self.evals_dir)
        choices, seen = [], Counter[str]()
        for k, p in evals.items():
            if (p / "results.json").is_file():
                owner = k.split("/", 1)[0]
                label = eval_label(p, "" if owner == "evals" else owner)
                seen[label] += 1  # two evaluations of one model on one data in the same minute stay apart
                choices.append((label if seen[label] == 1 else f"{label} ({seen[label]})", k))
        return evals, choices

    def model_lists(self) -> list[Any]:
        """The model pickers (Evaluate, Chat A and B, Export): runs and checkpoints come and go while the studio
        serves, so the tick refreshes their choices."""
        return [self.model, self.chat_a, self.chat_b, self.exp_model]

    def tick_outputs(self) -> list[Any]:
        return [self.progress, self.results, self.cmp_evals, *self.model_lists()]

    def tick(self, m: dict[str, Any]) -> list[Any]:
        sess = m.setdefault("eval_sess", {})
        lang = m["lang"]
        pair = m.get("pair")
        if pair and m.get("eval_out") == pair[0] and (Path(pair[1]) / "status.json").is_file():
            m["eval_out"] = pair[1]  # the base is done: follow the second model
        out = Path(m["eval_out"]) if m.get("eval_out") else None
        labels = {k: t(f"ev_p_{k}", lang) for k in ("none", "running", "finished", "failed", "prompts", "samples_s", "eta")}
        prog = progress_html(out, labels)
        prog_up = gr.skip() if sess.get("progress") == prog else prog
        sess["progress"] = prog
        res_up: Any = gr.skip()
        shown = [Path(p) for p in pair] if pair and str(out) == pair[1] else [out] if out is not None else []
        if shown and read_eval_status(out).get("state") == "finished" and sess.get("results") != str(out):
            loaded = [read_json_object(f / "results.json") for f in shown]  # untrusted files (backend.rundir)
            if all(r and not problem and all(isinstance(r.get(k, {}), dict) for k in ("metrics", "thinking", "timing"))
                   for r, problem in loaded):
                res_up = gr.update(value=results_table([(r.get("model_label") or f.name, r)
                                                        for f, (r, _) in zip(shown, loaded, strict=True)]), visible=True)
                sess["results"] = str(out)
        evals, choices = self._finished()
        finished = [k for _, k in choices]
        cmp_up: Any = gr.skip()
        if sess.get("evals") != finished:
            sess["evals"] = finished
            value = [v for v in (m.get("cmp_sel") or []) if v in finished]
            if pair and all(Path(p).joinpath("results.json").is_file() for p in pair) and not m.get("pair_shown"):
                value = [k for p in pair for k, v in evals.items() if str(v) == p]  # the pair opens compared
                m["pair_shown"] = True
            m["cmp_sel"] = value
            cmp_up = gr.update(choices=choices, value=value)
        models = model_choices(self.config.runs_dir, self.config.workspace)
        models_up = [gr.skip()] * 4
        if sess.get("models") != models:
            sess["models"] = models
            models_up = [gr.update(choices=models), gr.update(choices=models), gr.update(choices=["", *models]),
                         gr.update(choices=models)]
        return [prog_up, res_up, cmp_up, *models_up]

    # -------------------------------------------------------------------- compare

    def compare_outputs(self) -> list[Any]:
        return [self.cmp_msg, self.cmp_table, self.cmp_view, self.cmp_hist, self.cmp_csv]

    def on_compare(self, selected: list[str] | None, which: str, lang: str) -> list[Any]:
        evals = all_evals(self.config.runs_dir, self.evals_dir)
        chosen = [s for s in (selected or []) if s in evals]
        if len(chosen) < 2:
            return [t("ev_cmp_pick", lang), gr.update(visible=False), "", None, gr.update(visible=False)]
        try:
            loaded = [load_eval(evals[s]) for s in chosen]
            for j, e in enumerate(loaded):  # numbered: two evaluations of the same model stay apart
                e.label = f"{j}:{e.label}"
            cmp = compare(loaded)
        except CompareError as err:
            return ["⚠ " + html.escape(str(err)), gr.update(visible=False), "", None, gr.update(visible=False)]
        rows = cmp.filtered(which or "all")
        csv_path = Path(tempfile.mkdtemp(prefix="grpo-compare-")) / "compare.csv"
        csv_path.write_text(cmp.to_csv(which or "all"))
        hist = reward_histogram(list(zip(cmp.labels, cmp.rewards, strict=True)), t("ev_hist", lang),
                                names=chart_words(lang))
        msg = t("ev_cmp_shown", lang, n=len(rows), total=len(cmp.rows))
        sbs = side_by_side_html(cmp, rows, image_uris=lambda refs: thumb_uris(refs, self.config.workspace))
        return [msg, gr.update(value=comparison_table(cmp), visible=True), sbs, hist,
                gr.update(value=str(csv_path), visible=True)]

    # -------------------------------------------------------------------- chat

    def _chat_model(self, value: str) -> Any:
        from backend.eval.chat import ChatModel

        ref = resolve_model_ref(value, self.config.runs_dir, self.config.workspace)
        with self._chat_lock:
            if ref not in self._chat_models:
                self._chat_models[ref] = ChatModel(ref, self.config.workspace.root)
                while len(self._chat_models) > MAX_CHAT_MODELS:
                    self._chat_models.popitem(last=False)
            self._chat_models.move_to_end(ref)
            return self._chat_models[ref]

    def on_chat(self, message: str, hist_a: list[dict[str, Any]] | None, hist_b: list[dict[str, Any]] | None,
                model_a: str, model_b: str, temp: float, top_p: float, max_tokens: Any, system: str, lang: str,
                image: str | None = None):
        """Send a message (with an optional image, for vision-language models) to one or two models; streams
        both histories. The image rides in the user turn's content, so later turns still see it."""
        from backend.eval.chat import ChatSettings

        hist_a, hist_b = list(hist_a or []), list(hist_b or [])
        if not (message or "").strip():
            yield hist_a, hist_b, gr.skip(), gr.skip()
            return
        s = ChatSettings(temperature=float(temp), top_p=float(top_p), max_new_tokens=max(1, int(max_tokens or 256)),
                         system_prompt=system or "")
        targets = [(model_a, hist_a)] + ([(model_b, hist_b)] if (model_b or "").strip() else [])
        for _, h in targets:
            h.append({"role": "user", "content": [{"path": image}, message] if image else message})
            h.append({"role": "assistant", "content": ""})
        for model, h in targets:
            try:
                chat = self._chat_model(model)
                convo = [{"role": x["role"], "content": _text(x["content"]), "images": _images(x["content"])}
                         for x in h[:-1]]
                for partial in chat.stream(convo, s):
                    h[-1] = {"role": "assistant", "content": partial}
                    yield hist_a, hist_b, "", None
            except Exception as err:  # a model that does not load is shown in the chat, the studio keeps serving
                h[-1] = {"role": "assistant", "content": f"⚠ {type(err).__name__}: {err}"}
                yield hist_a, hist_b, "", None

    # -------------------------------------------------------------------- export

    def on_export(self, model: str, out: str, push: str, lang: str) -> str:
        ws = self.config.workspace
        try:
            ref = resolve_model_ref(model, self.config.runs_dir, ws)
            dest = ws.resolve(out)
        except PathError as err:
            return "⚠ " + html.escape(t("ev_bad", lang, err=err))
        cmd = [sys.executable, "-m", "backend.eval.export", "--model", ref, "--out", str(dest)]
        if push.strip():
            cmd += ["--push", push.strip()]
        try:
            p = subprocess.run(cmd, cwd=str(ws.root), env=child_env(), capture_output=True, text=True, timeout=3600)
        except subprocess.TimeoutExpired:
            return "⚠ " + t("ev_bad", lang, err="export took over an hour")
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith(("saved", "pushed", "error"))]
        text = "\n".join(lines) or (p.stdout + p.stderr)[-2000:]
        return ("" if p.returncode == 0 else "⚠ ") + html.escape(text)

    # -------------------------------------------------------------------- wiring

    def wire(self, memo: SessionMemo, radio: Any) -> None:
        self.memo = memo
        # the request is injected by its annotation; the option widgets follow in self.options' order
        form = [radio, self.model, self.data, *self.options.values()]
        self.run_btn.click(self.on_run, form, self.message, concurrency_limit=2)
        self.pair_btn.click(self.on_pair, form, self.message, concurrency_limit=2)
        cmp_in = [self.cmp_evals, self.cmp_filter, radio]
        kw: dict[str, Any] = {"show_progress": "hidden", "concurrency_limit": 4, "trigger_mode": "always_last"}
        self.cmp_evals.change(memo.setter("cmp_sel"), self.cmp_evals, None, queue=False)
        self.cmp_evals.change(self.on_compare, cmp_in, self.compare_outputs(), **kw)
        self.cmp_filter.change(self.on_compare, cmp_in, self.compare_outputs(), **kw)
        chat_in = [self.chat_msg, self.chat_view_a, self.chat_view_b, self.chat_a, self.chat_b, self.chat_temp,
                   self.chat_top_p, self.chat_max, self.chat_system, radio, self.chat_image]
        chat_out = [self.chat_view_a, self.chat_view_b, self.chat_msg, self.chat_image]
        self.chat_send.click(self.on_chat, chat_in, chat_out, concurrency_limit=2)
        self.chat_msg.submit(self.on_chat, chat_in, chat_out, concurrency_limit=2)
        self.chat_clear.click(lambda: ([], []), None, [self.chat_view_a, self.chat_view_b], queue=False)
        self.exp_btn.click(self.on_export, [self.exp_model, self.exp_out, self.exp_push, radio], self.exp_msg,
                           concurrency_limit=1)


def eval_page(demo: gr.Blocks, config: StudioConfig, lang: str) -> None:
    reg = Registry()
    radio, store = header(reg, lang, "subtitle_eval")
    ev = EvalTab(config, reg, radio, lang)
    timer = gr.Timer(config.refresh_s)
    memo = SessionMemo({"lang": lang, "eval_out": None, "eval_sess": {}, "cmp_sel": []})
    ev.wire(memo, radio)

    def tick(request: gr.Request) -> list[Any]:
        return ev.tick(memo.get(request))

    timer.tick(tick, None, ev.tick_outputs(), trigger_mode="once", show_progress="hidden", concurrency_limit=8,
               concurrency_id="eval-tick")

    def on_open(request: gr.Request) -> Any:  # `evaluate?model=RUN_ID` (the Runs page's "Evaluate this run")
        rid = request.query_params.get("model", "") if request else ""
        return gr.update(value=rid) if find_run(config.runs_dir, rid) is not None else gr.skip()

    demo.load(on_open, None, ev.model, queue=False, show_progress="hidden").then(tick, None, ev.tick_outputs(),
                                                                                   show_progress="hidden")

    def forget(lang: str, request: gr.Request) -> None:
        m = memo.get(request)
        m["lang"], m["eval_sess"] = lang, {}

    wire_language(demo, reg, radio, store, on_change=forget, then=(tick, [], ev.tick_outputs()))


def _option_widget(f: Any, reg: Registry, lang: str) -> Any:
    """One Evaluate-page widget for one option of backend.eval.options (label and help in the page's language)."""
    o, value = options.opt(f), options.default(f)

    def text(lg: str) -> dict[str, Any]:
        bounds = options.bounds_text(f)
        return {"label": options.label(f, lg), "info": options.help_text(f, lg) + (f" ({bounds})" if bounds else "")}

    common = {**text(lang), "elem_id": "eval-" + options.flag(f)[2:]}
    if o.kind in ("int", "float", "float?"):
        comp = gr.Number(value, precision=0 if o.kind == "int" else None, **common)
    else:
        comp = gr.Textbox("" if value is None else options.format_value(f, value), **common)
    return reg.add(comp, text)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # Gradio may hand back [{"type": "text", "text": ...}, {"type": "file", ...}]
        return "".join(c if isinstance(c, str) else c.get("text", "") if isinstance(c, dict) else str(c)
                       for c in content)
    return "" if isinstance(content, dict) else str(content)


def _images(content: Any) -> list[str]:
    """The image files in a chat message's content, as this page puts them ({"path": ...}) or as Gradio hands
    them back ({"type": "file", "file": {"path": ...}})."""
    parts = content if isinstance(content, list) else [content]
    out = []
    for c in parts:
        if isinstance(c, dict):
            f = c.get("file") if isinstance(c.get("file"), dict) else c
            if f.get("path"):
                out.append(str(f["path"]))
    return out
