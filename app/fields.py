"""Gradio widgets for RunSpec fields, and the registry that re-labels everything on a language switch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from app.form import REWARD_HEADERS, field_doc, fields, list_item_type
from app.locales import field_help, field_label, t
from backend.spec import FieldDoc

# columns that get a dropdown of the detected dataset columns (custom values still allowed)
COLUMN_FIELDS = ("data.prompt_column", "data.solution_column", "data.images_column", "data.videos_column",
                 "data.audios_column")
UPLOAD_HEIGHT = 130  # px: an upload box's own words ("Drop File Here - or - Click to Upload") fit, in Chinese too
WIDE_FIELDS = ("model.name_or_path", "data.sources", "data.eval_sources", "data.system_prompt", "rewards.functions",
               "rewards.plugins")


def elem_id(path: str) -> str:
    return "field-" + path.replace(".", "-")


def bounds_text(doc: FieldDoc) -> str:
    def num(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else f"{x:g}"

    parts = []
    if doc.minimum is not None:
        parts.append(f"{'>' if doc.exclusive_min else '≥'} {num(doc.minimum)}")
    if doc.maximum is not None:
        parts.append(f"{'<' if doc.exclusive_max else '≤'} {num(doc.maximum)}")
    return f" ({', '.join(parts)})" if parts else ""


def field_info(doc: FieldDoc, lang: str) -> str:
    return field_help(doc, lang) + (bounds_text(doc) if doc.kind in ("int", "float") else "")


def make_field(doc: FieldDoc, w: Any, lang: str = "en") -> gr.components.Component:
    """One widget for one RunSpec field, given its widget value (see app.form.to_widget).

    Bounds are shown, not enforced by the widget: out-of-range values must reach validation so the message
    appears next to the field instead of as an error popup."""
    common = {"label": field_label(doc, lang), "elem_id": elem_id(doc.path), "elem_classes": ["gs-field"]}
    k = doc.kind
    if k == "bool":
        return gr.Checkbox(value=bool(w), info=field_info(doc, lang), **common)
    if k in ("int", "float"):
        return gr.Number(value=w, precision=0 if k == "int" else None, info=field_info(doc, lang), **common)
    if k == "choice":
        return gr.Dropdown(choices=list(doc.choices), value=w, info=field_info(doc, lang), **common)
    if k == "multichoice":
        return gr.CheckboxGroup(choices=list(doc.choices), value=w, info=field_info(doc, lang), **common)
    if k == "rewards":
        return gr.Dataframe(value=w, headers=REWARD_HEADERS, datatype=["str", "number", "str"], type="array",
                            interactive=True, column_count=3, wrap=True, **common)
    if doc.path in COLUMN_FIELDS:
        return gr.Dropdown(choices=[w] if w else [""], value=w, allow_custom_value=True, info=field_info(doc, lang),
                           **common)
    lines = 3 if doc.path == "data.system_prompt" else 1
    placeholder = None
    if k == "list":
        placeholder = "0, 1" if list_item_type(doc.path) is int else "a, b"
    return gr.Textbox(value=w, lines=lines, placeholder=placeholder, info=field_info(doc, lang), **common)


@dataclass
class Registry:
    """Components whose text depends on the language: each with a function lang -> gr.update kwargs."""

    items: list[tuple[gr.components.Component | gr.blocks.Block, Callable[[str], dict[str, Any]]]] = \
        field(default_factory=list)
    gradio_text: list[Any] = field(default_factory=list)  # components showing Gradio's own words (upload boxes)

    def own_words(self, comp: Any) -> Any:
        """A component whose inner text is Gradio's ("Drop File Here"): remounted when Gradio's locale changes,
        since a mounted component keeps the words it was drawn with (app.page.wire_language)."""
        self.gradio_text.append(comp)
        return comp

    def add(self, comp: Any, fn: Callable[[str], dict[str, Any]]) -> Any:
        self.items.append((comp, fn))
        return comp

    def label(self, comp: Any, key: str) -> Any:
        return self.add(comp, lambda lang: {"label": t(key, lang)})

    def value(self, comp: Any, key: str) -> Any:
        return self.add(comp, lambda lang: {"value": t(key, lang)})

    def label_info(self, comp: Any, key: str, info_key: str) -> Any:
        return self.add(comp, lambda lang: {"label": t(key, lang), "info": t(info_key, lang)})

    def components(self) -> list[Any]:
        return [c for c, _ in self.items]

    def updates(self, lang: str) -> list[Any]:
        return [gr.update(**fn(lang)) for _, fn in self.items]


@dataclass
class FormUI:
    """The field widgets, in iter_fields() order, and what other tabs need to fill or read the form."""

    comps: dict[str, gr.components.Component] = field(default_factory=dict)
    preset: gr.Dropdown | None = None
    message: gr.Markdown | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # section helpers other code updates (planner, ...)

    def ordered(self) -> list[gr.components.Component]:
        return [self.comps[f.path] for f in fields()]

    @staticmethod
    def values(args: tuple[Any, ...] | list[Any]) -> dict[str, Any]:
        return {f.path: v for f, v in zip(fields(), args, strict=True)}


def section_fields(section: str, form: FormUI, reg: Registry, values: dict[str, Any], lang: str,
                   skip: tuple[str, ...] = (), per_row: int = 3, extra: tuple[str, ...] = ()) -> None:
    """Lay out a section's fields: basic ones in rows, advanced ones in a collapsed accordion.

    `extra` places fields of another RunSpec section here (that section's own call must `skip` them: a field
    has one widget); they follow the section's own fields in declaration order."""
    docs = [f for f in fields() if f.path.startswith(section + ".") and f.path not in skip]
    docs += [f for f in fields() if f.path in extra and f.path not in skip]

    def place(group: list[FieldDoc]) -> None:
        row: list[FieldDoc] = []
        for d in group:
            if d.path in WIDE_FIELDS:
                _render(d)
                continue
            row.append(d)
            if len(row) == per_row:
                _row(row)
                row = []
        if row:
            _row(row)

    def _row(row: list[FieldDoc]) -> None:
        with gr.Row(equal_height=False):
            for d in row:
                _render(d)

    def _render(d: FieldDoc) -> None:
        comp = make_field(d, values[d.path], lang)
        form.comps[d.path] = comp
        doc = field_doc(d.path)
        if d.kind == "rewards":  # a table has no info line: its help and messages go in a line below it
            reg.add(comp, lambda lg, doc=doc: {"label": field_label(doc, lg)})
            note = gr.Markdown(field_info(doc, lang), elem_id=elem_id(d.path) + "-note", elem_classes=["gs-note"])
            form.extras.setdefault("notes", {})[d.path] = note
        else:
            reg.add(comp, lambda lg, doc=doc: {"label": field_label(doc, lg), "info": field_info(doc, lg)})

    place([d for d in docs if not d.advanced])
    adv = [d for d in docs if d.advanced]
    if adv:
        acc = gr.Accordion(t("advanced", lang), open=False, elem_classes=["gs-advanced"])
        reg.label(acc, "advanced")
        with acc:
            place(adv)
