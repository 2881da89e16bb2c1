"""Dataset section: sources (upload or path), detected columns, system prompt, template, and a preview of
the first rows exactly as the model will see them (chat template applied through the tokenizer)."""

from __future__ import annotations

import html
import json
from typing import Any

import gradio as gr

from app.data_preview import preview_rows
from app.fields import COLUMN_FIELDS, UPLOAD_HEIGHT, section_fields
from app.form import FieldValueError, field_doc, from_widget, values_to_spec
from app.locales import t
from app.media import img_tags, thumb_uris
from app.paths import PathError
from app.sections import BuildContext
from backend.data import is_hub_dataset, peek_columns, split_source
from backend.multimodal import first_frame
from backend.spec import SpecError


def detect_columns(ctx: BuildContext, sources_text: str, lang: str) -> tuple[list[str], str]:
    """Columns of the first local, readable source inside the workspace."""
    try:
        sources = from_widget(field_doc("data.sources"), sources_text)
    except FieldValueError:
        return [], ""
    for ref in sources:
        try:
            path, _ = split_source(ref)
        except ValueError:
            continue
        if is_hub_dataset(path):
            continue
        try:
            p = ctx.config.workspace.resolve(path)
        except PathError:
            return [], "⚠ " + t("outside", lang, path=path)
        if not p.exists():
            continue
        cols = peek_columns(p)
        if cols:
            return sorted(cols), t("data_columns", lang, src=path, cols=", ".join(sorted(cols)))
    return [], ""


def sources_after_upload(sources_text: str, rel: str, add: bool) -> str:
    """The data.sources text once `rel` is uploaded: by default the upload REPLACES the sources (what was just
    uploaded is what the user means to train on, and the preview then shows its rows); with `add` it is appended
    to the current sources (once: a source already listed is not repeated)."""
    if not add:
        return rel
    current = [c.strip() for c in str(sources_text or "").replace("\n", ",").split(",") if c.strip()]
    return ", ".join(current if rel in current else [*current, rel])


def on_upload(workspace: Any, file: str | None, sources_text: str, add: bool, lang: str) -> tuple[Any, str, Any]:
    """An uploaded data file: copied into uploads/, then the sources (replaced, or added to with `add`), the
    message, and the preview cleared (it showed the old sources' rows)."""
    if not file:
        return gr.skip(), "", gr.skip()
    try:
        rel = workspace.save_upload(file, "uploads")
    except (PathError, OSError) as err:
        return gr.skip(), f"⚠ {err}", gr.skip()
    return (sources_after_upload(sources_text, rel, bool(add)),
            t("data_uploaded_added" if add else "data_uploaded", lang, path=rel), "")


def render_preview(rows: list[dict[str, Any]], note: str, lang: str) -> str:
    parts = []
    if note:
        parts.append(f'<div class="gs-note">ⓘ {html.escape(note)}</div>')
    for i, row in enumerate(rows):
        cols = json.dumps(row["columns"], ensure_ascii=False, default=str)
        head = html.escape(t("data_row", lang, i=i + 1, src=row["source"]))
        thumbs = img_tags(row.get("thumbs") or [])  # data URIs made here, not model text
        parts.append(f'<div class="gs-preview"><div class="gs-preview-head">{head}</div>'
                     + (f'<div class="gs-thumbs">{thumbs}</div>' if thumbs else "")
                     + f'<pre class="gs-rendered">{html.escape(row["rendered"])}</pre>'
                     f'<details><summary>columns</summary><pre>{html.escape(cols)}</pre></details></div>')
    return "".join(parts)


def build(ctx: BuildContext) -> None:
    comps = ctx.form.comps
    with gr.Row():
        upload = gr.File(label=t("data_upload", ctx.lang), file_types=[".jsonl", ".json", ".csv", ".parquet"],
                         file_count="single", height=UPLOAD_HEIGHT, scale=1, elem_id="data-upload")
        ctx.reg.own_words(ctx.reg.label(upload, "data_upload"))
        add = ctx.reg.label(gr.Checkbox(value=False, label=t("data_upload_add", ctx.lang), scale=0, min_width=200,
                                        elem_id="data-upload-add"), "data_upload_add")
    section_fields("data", ctx.form, ctx.reg, ctx.values, ctx.lang)
    cols_md = gr.Markdown(elem_id="data-columns")
    with gr.Row():
        btn = ctx.reg.value(gr.Button(t("data_preview", ctx.lang), size="sm", scale=0, elem_id="data-preview-btn"),
                            "data_preview")
    preview = gr.HTML(elem_id="data-preview")

    col_comps = [comps[f] for f in COLUMN_FIELDS]

    def on_sources(sources_text: str, *rest: str) -> list[Any]:
        *values, lang = rest  # the column fields' current values, then the language
        cols, msg = detect_columns(ctx, sources_text, lang)
        updates = [gr.update(choices=sorted({*cols, v or ""}) if cols else [v or ""]) for v in values]
        return [*updates, msg]

    for ev in (comps["data.sources"].blur, comps["data.sources"].submit):
        ev(on_sources, [comps["data.sources"], *col_comps, ctx.lang_input], [*col_comps, cols_md], queue=False)

    upload.upload(lambda f, src, a, lang: on_upload(ctx.config.workspace, f, src, a, lang),
                  [upload, comps["data.sources"], add, ctx.lang_input], [comps["data.sources"], cols_md, preview]).then(
        on_sources, [comps["data.sources"], *col_comps, ctx.lang_input], [*col_comps, cols_md])

    def on_preview(lang: str, *values: Any) -> str:
        try:
            spec = values_to_spec(ctx.form.values(values))
        except SpecError as err:
            return "⚠ " + html.escape(t("data_preview_error", lang, err="; ".join(map(str, err.issues))))
        for ref in spec.data.sources:
            msg = ctx.config.workspace.check_ref(ref)
            if msg:
                return "⚠ " + html.escape(msg)
        try:
            rows, note = preview_rows(spec, ctx.config.workspace.root, n=5)
        except Exception as err:  # unreadable file, bad JSON line, ...: shown, not raised
            return "⚠ " + html.escape(t("data_preview_error", lang, err=f"{type(err).__name__}: {err}"))
        if spec.data.images_column or spec.data.videos_column:  # each row's pictures (a video: its first frame)
            for r in rows:  # beside its prompt (paths stay inside the workspace)
                r["thumbs"] = thumb_uris(r["columns"].get(spec.data.images_column), ctx.config.workspace) \
                    if spec.data.images_column else []
                if spec.data.videos_column:
                    r["thumbs"] += thumb_uris(first_frame(r["columns"].get(spec.data.videos_column)), ctx.config.workspace)
        return render_preview(rows, note, lang)

    # wired once every field exists: the preview needs the model's tokenizer and the whole data section
    ctx.deferred.append(lambda: btn.click(on_preview, [ctx.lang_input, *ctx.form.ordered()], [preview],
                                          concurrency_limit=2))
