"""The Build page's other-tool views: the form as an ms-swift command and a TRL config beside the Preview
command (backend/exporters.py, with what each tool cannot hold listed below it), and the import box's Undo.

Undo keeps the form's values from before the last import that changed the form in a gr.State, so one click puts
them back; it is disabled while there is nothing to undo (before any import, after an undo, after a failed
import that changed nothing). The handlers are plain functions of values, tested without a browser."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import gradio as gr

from app.fields import Registry
from app.locales import t
from backend.exporters import ExportResult, export_swift, export_trl
from backend.spec import RunSpec


def lost_md(res: ExportResult, lang: str) -> str:
    """What the tool cannot hold, and what its text needs beside it."""
    parts = []
    if res.inexpressible:
        parts.append(f"**{t('export_lost', lang, tool=res.tool)}**\n" + "\n".join(
            f"- `{html.escape(i.field)}` = `{html.escape(i.value, quote=False)}`: {html.escape(i.reason)}"
            for i in res.inexpressible))
    else:
        parts.append(t("export_all", lang, tool=res.tool))
    if res.notes:
        parts.append(f"**{t('export_notes', lang)}**\n" + "\n".join(f"- {html.escape(n)}" for n in res.notes))
    return "\n\n".join(parts)


def export_updates(spec: RunSpec | None, lang: str) -> list[Any]:
    """[the panes' row, the ms-swift text, its list, the TRL text, its list]; hidden without a valid spec."""
    if spec is None:
        return [gr.update(visible=False), gr.skip(), gr.skip(), gr.skip(), gr.skip()]
    swift, trl = export_swift(spec), export_trl(spec)
    return [gr.update(visible=True), swift.text, lost_md(swift, lang), trl.text, lost_md(trl, lang)]


class ExportView:
    """Two code panes, elem_ids export-swift and export-trl, each with its list below."""

    def __init__(self, reg: Registry, lang: str) -> None:
        with gr.Row(visible=False, equal_height=False, elem_id="export-panes") as self.row:
            with gr.Column():
                self.swift = reg.label(gr.Code(language="shell", label=t("export_swift", lang), interactive=False,
                                               elem_id="export-swift"), "export_swift")
                self.swift_lost = gr.Markdown(elem_id="export-swift-lost")
            with gr.Column():
                self.trl = reg.label(gr.Code(language="yaml", label=t("export_trl", lang), interactive=False,
                                             elem_id="export-trl"), "export_trl")
                self.trl_lost = gr.Markdown(elem_id="export-trl-lost")

    @property
    def outputs(self) -> list[Any]:
        return [self.row, self.swift, self.swift_lost, self.trl, self.trl_lost]


# ----------------------------------------------------------------------------- Undo

def _changed(values: list[Any]) -> bool:
    """An import's field outputs changed the form (a failed one skips every field)."""
    return any(not (isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1) for v in values)


def undoable_import(on_import: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """`on_import(text, lang, *form)` -> [message, *form]; wrapped -> [message, *form, before, undo button]:
    the form from before an import that changed it is kept for Undo."""
    def run(text: str, lang: str, before: list[Any] | None, *form: Any) -> list[Any]:
        out = on_import(text, lang, *form)
        if _changed(out[1:]):
            return [*out, list(form), gr.update(interactive=True)]
        return [*out, before, gr.update(interactive=before is not None)]
    return run


def undo_import(lang: str, before: list[Any] | None, n_fields: int) -> list[Any]:
    """[message, *form, before, undo button]: the form from before the import, and nothing left to undo."""
    if not before or len(before) != n_fields:
        return [gr.skip(), *[gr.skip() for _ in range(n_fields)], None, gr.update(interactive=False)]
    return [t("import_undone", lang), *before, None, gr.update(interactive=False)]


class ImportUndo:
    """The import box's Undo button (elem_id import-undo-btn) and the form it would restore."""

    def __init__(self, reg: Registry, lang: str) -> None:
        self.button = reg.value(gr.Button(t("import_undo", lang), size="sm", interactive=False,
                                          elem_id="import-undo-btn"), "import_undo")
        self.before = gr.State(None)

    def wire(self, import_btn: Any, on_import: Callable[..., list[Any]], text: Any, lang_input: Any,
             message: Any, form: list[Any]) -> None:
        import_btn.click(undoable_import(on_import), [text, lang_input, self.before, *form],
                         [message, *form, self.before, self.button])
        n = len(form)
        self.button.click(lambda lang, before: undo_import(lang, before, n), [lang_input, self.before],
                          [message, *form, self.before, self.button])
