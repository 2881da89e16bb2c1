"""The Build-a-run page: a first line saying what to do, preset picker, import (with Undo), the action bar that
stays in view (validation summary, Start, Preview command with the ms-swift and TRL equivalents), one section per
RunSpec section, Export YAML and Save as preset.
`build_page` wires the page: Start launches and opens the Runs page on the new run, `?clone=RUN_ID` fills the
form from a run's spec."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import gradio as gr

from app.commands import DEFAULT_PRESET, export_yaml, list_presets, load_preset, save_preset, train_command
from app.config import StudioConfig
from app.export_view import ExportView, ImportUndo, export_updates
from app.fields import FormUI, Registry, field_info
from app.form import Validation, field_doc, fields, spec_to_values, to_widget, validate_values
from app.locales import t
from app.model_info import model_summary
from app.page import NAV_JS, header, wire_language
from app.runlist import find_run
from app.sections import BuildContext, algorithm, data, model, output, resources, rewards, rollout, tools
from backend import launcher
from backend.importers import import_any
from backend.machine import Machine
from backend.plan import plan
from backend.relevance import inert_fields
from backend.spec import RunSpec, SpecError, SpecIssue, load_spec

SECTIONS = (("model", "sec_model", model), ("data", "sec_data", data), ("rewards", "sec_rewards", rewards),
            ("rollout", "sec_rollout", rollout), ("tools", "sec_tools", tools), ("resources", "sec_resources", resources),
            ("algorithm", "sec_algorithm", algorithm), ("output", "sec_output", output))


# what the sticky bar's buttons answer appears under the bar, at the top of the form: brought into view from
# wherever the page was scrolled to
SHOW_JS = """() => { const e = [...document.querySelectorAll('SEL')].find(x => x.offsetHeight > 0 && x.innerText.trim());
  if (e) e.scrollIntoView({block: 'center'}); }"""


def form_values_for(spec: RunSpec, config: StudioConfig) -> dict[str, Any]:
    """Widget values for a spec, with runs going to the folder this studio lists."""
    vals = spec_to_values(spec)
    if not config.same_runs_dir(spec.output.runs_dir):
        vals["output.runs_dir"] = config.runs_dir_for_form()
    return vals


def initial_spec(config: StudioConfig) -> tuple[str, RunSpec]:
    names = list_presets(config.presets_dir)
    name = DEFAULT_PRESET if DEFAULT_PRESET in names else (names[0] if names else "")
    if name:
        try:
            return name, load_preset(config.presets_dir, name)
        except SpecError:
            pass
    return "", RunSpec()


def validate_form(config: StudioConfig, values: dict[str, Any]) -> Validation:
    v = validate_values(values, config.workspace.root, config.workspace)
    runs_dir = values.get("output.runs_dir")
    if isinstance(runs_dir, str) and runs_dir.strip() and not config.same_runs_dir(runs_dir):
        v.by_field.setdefault("output.runs_dir", []).append(
            f"this studio lists runs in {config.runs_dir_for_form()}; a run elsewhere would not show up here")
    return v


def summary_md(v: Validation, lang: str) -> str:
    if v.ok:
        return t("valid", lang)
    msgs = v.all_messages()
    items = "\n".join(f"- {html.escape(m)}" for m in msgs[:12])
    more = f"\n- … +{len(msgs) - 12}" if len(msgs) > 12 else ""
    return f"**{t('invalid', lang, n=len(msgs))}**\n{items}{more}"


def _param_count(spec: RunSpec, base_dir: str | Path) -> int | None:
    """Parameters of a local model (headers only), for the planner's memory estimate; None when unknown."""
    ref = Path(spec.model.name_or_path).expanduser()
    model_dir = ref if ref.is_absolute() else Path(base_dir) / ref
    try:
        return model_summary(model_dir).get("parameters") if (model_dir / "config.json").is_file() else None
    except (OSError, ValueError):
        return None


def planner_md(spec: RunSpec | None, lang: str, base_dir: str | Path = ".", issues: list[SpecIssue] | None = None) -> str:
    """The planner's line; `issues` = check(spec)'s result when the caller has it (the form's validation)."""
    if spec is None:
        return ""
    verdict = plan(spec, Machine.detect(), base_dir, params=_param_count(spec, base_dir), issues=issues)
    head = t("planner_ok" if verdict.ok else "planner_bad", lang)
    return f"**{'✓' if verdict.ok else '⚠'} {head}** · " + " · ".join(html.escape(x) for x in verdict.lines)


def field_state(v: Validation, prev: dict[str, str], lang: str) -> dict[str, str]:
    """Each field's state as one string: '' (plain), 'E:<message>' (wrong) or 'I:<why>' (does nothing under the
    other choices: relevance.INERT_RULES, the table the check refuses by). A wrong field stays editable, so it can
    be fixed; while the spec does not parse, which fields are inert is unknown and the previous state is kept."""
    inert = inert_fields(v.spec) if v.spec is not None else None
    out = {}
    for doc in fields():
        msgs = v.by_field.get(doc.path)
        if msgs:
            out[doc.path] = "E:" + "; ".join(msgs)
        elif inert is None:
            old = prev.get(doc.path, "")
            out[doc.path] = old if old.startswith("I:") else ""
        elif doc.path in inert:
            rule = inert[doc.path]
            out[doc.path] = "I:" + (rule.why_zh if lang == "zh" else rule.why)
        else:
            out[doc.path] = ""
    return out


def field_updates(v: Validation, prev: dict[str, str], lang: str, notes: dict[str, Any]
                  ) -> tuple[list[Any], list[Any], dict[str, str]]:
    """Per-field updates only where a field's state changed (so typing in a field is never disturbed)."""
    now = field_state(v, prev, lang)
    comp_updates, note_updates = [], []
    for doc in fields():
        state = now[doc.path]
        same = doc.path in prev and prev[doc.path] == state
        kind, text = state[:2], state[2:]
        if doc.path in notes:  # tables show messages in the line below
            note_updates.append(gr.skip() if same else
                                (f'<span class="gs-error-text">⚠ {html.escape(text)}</span>' if kind == "E:"
                                 else field_info(doc, lang)))
            comp_updates.append(gr.skip())
            continue
        if same:
            comp_updates.append(gr.skip())
        elif kind == "E:":
            comp_updates.append(gr.update(info=f"⚠ {text}", elem_classes=["gs-field", "gs-error"], interactive=True))
        elif kind == "I:":
            comp_updates.append(gr.update(info=f"⊘ {text}. {field_info(doc, lang)}",
                                          elem_classes=["gs-field", "gs-inert"], interactive=False))
        else:
            comp_updates.append(gr.update(info=field_info(doc, lang), elem_classes=["gs-field"], interactive=True))
    return comp_updates, note_updates, now


class BuildTab:
    """Holds the tab's components so the Runs tab (Clone) and the studio (Start, language) can use them."""

    def __init__(self, config: StudioConfig, reg: Registry, lang_input: Any, lang: str = "en") -> None:
        self.config = config
        self.reg = reg
        self.lang_input = lang_input
        self.form = FormUI()
        preset_name, spec = initial_spec(config)
        values = form_values_for(spec, config)

        self.intro = reg.value(gr.Markdown(t("build_intro", lang), elem_id="build-intro"), "build_intro")
        with gr.Row(equal_height=False):
            self.preset = gr.Dropdown(list_presets(config.presets_dir), value=preset_name or None,
                                      label=t("preset", lang), info=t("preset_info", lang), scale=1,
                                      elem_id="preset-picker")
            reg.label_info(self.preset, "preset", "preset_info")
            with gr.Column(scale=2):
                with gr.Accordion(t("import_acc", lang), open=False, elem_id="import-acc") as acc:
                    reg.label(acc, "import_acc")
                    self.import_text = gr.Textbox(lines=5, label=t("import_text", lang), elem_id="import-text")
                    reg.label(self.import_text, "import_text")
                    with gr.Row():
                        self.import_btn = reg.value(gr.Button(t("import_btn", lang), size="sm", elem_id="import-btn"),
                                                    "import_btn")
                        self.undo = ImportUndo(reg, lang)
                    self.import_msg = gr.Markdown(elem_id="import-msg")
        # the bar stays in view (sticky) from the first screen down: Start never needs a scroll (issue 29 item 6)
        with gr.Row(equal_height=True, elem_classes=["gs-actions"], elem_id="action-bar", variant="panel"):
            self.summary = gr.Markdown(elem_id="validation-summary", elem_classes=["gs-summary"])
            self.start = reg.value(gr.Button(t("start", lang), variant="primary", interactive=False,
                                             elem_id="start-btn", scale=0, min_width=160), "start")
            self.preview_btn = reg.value(gr.Button(t("preview_cmd", lang), elem_id="preview-cmd-btn", scale=0,
                                                   min_width=200), "preview_cmd")
        self.command = gr.Code(language="shell", visible=False, label=t("command", lang), elem_id="command-preview")
        reg.label(self.command, "command")
        self.exports = ExportView(reg, lang)
        self.message = gr.Markdown(elem_id="build-message")
        self.form.preset, self.form.message = self.preset, self.message

        ctx = BuildContext(config, self.form, reg, values, lang, lang_input)
        for name, key, module in SECTIONS:
            with gr.Accordion(t(key, lang), open=True, elem_classes=["gs-section"], elem_id=f"sec-{name}") as sec:
                reg.label(sec, key)
                module.build(ctx)

        with gr.Row(equal_height=True, elem_id="save-bar"):
            self.export_btn = reg.value(gr.Button(t("export_yaml", lang), elem_id="export-btn", scale=1),
                                        "export_yaml")
            self.preset_name = reg.label(gr.Textbox(label=t("preset_name", lang), scale=1, min_width=140,
                                                    elem_id="preset-name"), "preset_name")
            self.overwrite = reg.label(gr.Checkbox(False, label=t("overwrite", lang), scale=0, min_width=100),
                                       "overwrite")
            self.save_btn = reg.value(gr.Button(t("save_preset", lang), elem_id="save-preset-btn", scale=1),
                                      "save_preset")
        self.yaml_code = gr.Code(language="yaml", visible=False, label=t("yaml_file", lang), elem_id="yaml-preview")
        self.yaml_file = gr.File(visible=False, label=t("yaml_file", lang), interactive=False, elem_id="yaml-file")
        self.prev = gr.State({})
        self.ctx = ctx
        for wire in ctx.deferred:
            wire()
        self._wire()

    # ------------------------------------------------------------------------- handlers

    @property
    def inputs(self) -> list[Any]:
        return self.form.ordered()

    def validation_outputs(self) -> list[Any]:
        notes = self.form.extras.get("notes", {})
        return [self.start, self.summary, self.form.extras["planner"], self.prev, *notes.values(), *self.inputs]

    def validate(self, lang: str, prev: dict[str, str], *args: Any) -> list[Any]:
        v = validate_form(self.config, self.form.values(args))
        notes = self.form.extras.get("notes", {})
        comp_updates, note_updates, state = field_updates(v, prev or {}, lang, notes)
        planner = planner_md(v.spec, lang, self.config.workspace.root, v.checked) if v.spec else gr.skip()
        return [gr.update(interactive=v.ok), summary_md(v, lang), planner, state, *note_updates, *comp_updates]

    def fill(self, spec: RunSpec) -> list[Any]:
        vals = form_values_for(spec, self.config)
        return [vals[f.path] for f in fields()]

    def on_preset(self, name: str, lang: str) -> list[Any]:
        if not name:
            return [gr.skip(), *[gr.skip() for _ in fields()]]
        try:
            spec = load_preset(self.config.presets_dir, name)
        except (SpecError, ValueError, OSError) as err:
            return [f"⚠ {html.escape(t('preset_error', lang, name=name, err=err))}", *[gr.skip() for _ in fields()]]
        return [t("preset_loaded", lang, name=name), *self.fill(spec)]

    def on_import(self, text: str, lang: str, *args: Any) -> list[Any]:
        skip = [gr.skip() for _ in fields()]
        if not (text or "").strip():
            return [t("import_empty", lang), *skip]
        res = import_any(text, base_dir=self.config.workspace.root)  # never raises; files it reads stay in the root
        if res.error:
            return ["⚠ " + html.escape(t("import_error", lang, err=res.error)), *skip]
        values = list(args)
        for i, doc in enumerate(fields()):
            if doc.path in res.values:
                values[i] = to_widget(field_doc(doc.path), res.values[doc.path])
        parts = [t("import_ok", lang, n=len(res.values)) + f" ({html.escape(res.source)})"]
        if res.applied:
            parts.append(f"**{t('import_applied', lang)}** " + ", ".join(f"`{html.escape(o)}`" for o in res.applied))
        if res.defaults:
            parts.append(f"**{t('import_defaults', lang)}** " + ", ".join(
                f"`{k}={html.escape(json.dumps(v), quote=False)}`" for k, v in res.defaults.items()))
        if res.unmapped:
            parts.append(f"**{t('import_unmapped', lang)}**\n" + "\n".join(
                f"- `{html.escape(u.option, quote=False)} {html.escape(u.value, quote=False)}`: "
                f"{html.escape(u.reason, quote=False)}" for u in res.unmapped))
        if res.notes:
            parts.append(f"**{t('import_notes', lang)}**\n" + "\n".join(f"- {html.escape(n)}" for n in res.notes))
        return ["\n\n".join(parts), *values]

    def _spec_or_message(self, lang: str, args: tuple[Any, ...]) -> tuple[RunSpec | None, str]:
        v = validate_form(self.config, self.form.values(args))
        if v.spec is None:
            return None, "⚠ " + t("invalid_form", lang)
        return v.spec, ""

    def on_preview(self, preset: str, lang: str, *args: Any) -> list[Any]:
        """[the command, the message, *the ms-swift and TRL exports]."""
        spec, msg = self._spec_or_message(lang, args)
        if spec is None:
            return [gr.update(visible=False), msg, *export_updates(None, lang)]
        presets_rel = self.config.workspace.rel(self.config.presets_dir)
        return [gr.update(value=train_command(spec, preset or "", presets_rel), visible=True), "",
                *export_updates(spec, lang)]

    def on_export(self, preset: str, lang: str, *args: Any) -> tuple[Any, Any, str]:
        spec, msg = self._spec_or_message(lang, args)
        if spec is None:
            return gr.update(visible=False), gr.update(visible=False), msg
        path = export_yaml(spec, self.config.export_dir, spec.output.run_name or preset or "runspec")
        return gr.update(value=spec.to_yaml(), visible=True), gr.update(value=str(path), visible=True), ""

    def on_save(self, name: str, overwrite: bool, lang: str, *args: Any) -> tuple[Any, str]:
        spec, msg = self._spec_or_message(lang, args)
        if spec is None:
            return gr.skip(), msg
        name = (name or "").strip()
        try:
            save_preset(self.config.presets_dir, name, spec, overwrite=bool(overwrite))
        except FileExistsError:
            return gr.skip(), "⚠ " + t("preset_exists", lang, name=name)
        except (ValueError, OSError) as err:
            return gr.skip(), f"⚠ {html.escape(str(err))}"
        return gr.update(choices=list_presets(self.config.presets_dir), value=name), t("preset_saved", lang, name=name)

    def _wire(self) -> None:
        ins = self.inputs
        val_in = [self.lang_input, self.prev, *ins]
        val_out = self.validation_outputs()
        gr.on([c.change for c in ins], self.validate, val_in, val_out, trigger_mode="always_last",
              show_progress="hidden", queue=True, concurrency_limit=4, concurrency_id="validate")
        self.validate_event_args = (self.validate, val_in, val_out)
        self.preset.input(self.on_preset, [self.preset, self.lang_input], [self.message, *ins])
        self.undo.wire(self.import_btn, self.on_import, self.import_text, self.lang_input, self.import_msg, ins)
        self.preview_btn.click(self.on_preview, [self.preset, self.lang_input, *ins],
                               [self.command, self.message, *self.exports.outputs]) \
            .then(None, None, None, js=SHOW_JS.replace("SEL", "#command-preview, #build-message"))
        self.export_btn.click(self.on_export, [self.preset, self.lang_input, *ins],
                              [self.yaml_code, self.yaml_file, self.message])
        self.save_btn.click(self.on_save, [self.preset_name, self.overwrite, self.lang_input, *ins],
                            [self.preset, self.message])


def build_page(demo: gr.Blocks, config: StudioConfig, lang: str) -> None:
    reg = Registry()
    radio, store = header(reg, lang, "subtitle")
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
                      concurrency_id="start").then(None, nav, None, js=NAV_JS) \
        .then(None, None, None, js=SHOW_JS.replace("SEL", "#build-message"))  # a refusal, where Start was pressed

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
    wire_language(demo, reg, radio, store, then=(_reset_prev(vfn), vin, vout))


def _reset_prev(validate: Any) -> Any:
    """Validation after a language switch re-sends every field's help (the previous messages are forgotten)."""
    def run(lang: str, prev: dict[str, str], *args: Any) -> list[Any]:
        return validate(lang, {}, *args)
    return run
