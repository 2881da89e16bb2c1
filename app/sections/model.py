"""Model section: path or hub id, LoRA/full, dtype; 'Check model' reads config.json, never the weights."""

from __future__ import annotations

import json

import gradio as gr

from app.fields import section_fields
from app.locales import t
from app.model_info import find_model_dir, human_count, model_summary
from app.sections import BuildContext


def check_model(ctx: BuildContext, ref: str, lang: str) -> str:
    ref = (ref or "").strip()
    ws = ctx.config.workspace
    err = ws.check_ref(ref) if ref else "empty"
    if err:
        return f"⚠ {err}"
    mdir = find_model_dir(ref, ws.root)  # a local dir inside the workspace, or the hub cache's copy
    if mdir is None:
        return "⚠ " + t("model_not_found", lang, path=ref)
    if not (mdir / "config.json").is_file():
        return "⚠ " + t("model_no_config", lang, path=ref)
    try:
        s = model_summary(mdir)
    except (OSError, json.JSONDecodeError, ValueError) as e:
        return f"⚠ {type(e).__name__}: {e}"
    text = t("model_summary", lang, arch=s["architecture"], mtype=s["model_type"], params=human_count(s["parameters"]),
             exact=t("exact" if s["parameters_exact"] else "estimate", lang), layers=s["layers"],
             hidden=s["hidden_size"], heads=s["heads"], kv=s["kv_heads"], vocab=s["vocab_size"],
             ctx=s["max_positions"], dtype=s["dtype"], tmpl=t("yes" if s["chat_template"] else "no", lang))
    return text + (t("multimodal", lang) if s["multimodal"] else "")


def build(ctx: BuildContext) -> None:
    section_fields("model", ctx.form, ctx.reg, ctx.values, ctx.lang)
    with gr.Row():
        btn = ctx.reg.value(gr.Button(t("model_check", ctx.lang), size="sm", scale=0, elem_id="model-check"), "model_check")
        out = gr.Markdown(elem_id="model-check-result")
    btn.click(lambda ref, lang: check_model(ctx, ref, lang), [ctx.form.comps["model.name_or_path"], ctx.lang_input],
              out, concurrency_limit=4)
