"""Rewards section: built-ins with a weight and params each, plugin files (upload or in-page editor),
and 'Test rewards', which scores a few dataset rows in a separate process before anything trains."""

from __future__ import annotations

import ast
import html
import json
from typing import Any

import gradio as gr

from app.fields import UPLOAD_HEIGHT, section_fields
from app.form import values_to_spec
from app.locales import t
from app.paths import PathError, safe_filename
from app.reward_test import score_rewards
from app.sections import BuildContext
from backend.rewards.registry import BUILTIN_REWARDS
from backend.spec import SpecError

EXAMPLE_PLUGIN = '''def short_answer(completions, prompts, **columns):
    """1.0 for answers of at most 4 characters, else 0.0."""
    return [1.0 if len(c.strip()) <= 4 else 0.0 for c in completions]
'''


def builtin_docs() -> str:
    """Markdown list of built-ins with their formula and parameters (from each params model)."""
    lines = []
    for name in sorted(BUILTIN_REWARDS):
        b = BUILTIN_REWARDS[name]
        params = ", ".join(f"`{k}`={f.default!r}" for k, f in b.params_model.model_fields.items())
        doc = " ".join(b.doc.split())
        lines.append(f"- **{name}**{f' ({params})' if params else ''}: {doc}")
    return "\n".join(lines)


def _rows(table: Any) -> list[list[Any]]:
    if hasattr(table, "values") and hasattr(table, "columns"):
        table = table.values.tolist()
    return [list(r) for r in table or [] if any(str(c or "").strip() for c in r)]


def sync_table(selected: list[str], table: Any) -> list[list[Any]]:
    """Rows for the ticked built-ins (kept with their weights/params), plus the non-built-in rows."""
    rows = _rows(table)
    names = [str(r[0]).strip() for r in rows]
    out = [r for r in rows if str(r[0]).strip() not in BUILTIN_REWARDS or str(r[0]).strip() in selected]
    for name in selected:
        if name not in names:
            out.append([name, 1.0, ""])
    return out


def ticked(table: Any) -> list[str]:
    return [str(r[0]).strip() for r in _rows(table) if str(r[0]).strip() in BUILTIN_REWARDS]


def save_plugin(ctx: BuildContext, name: str, code: str, plugins_text: str, table: Any, lang: str
                ) -> tuple[Any, Any, str]:
    try:
        tree = ast.parse(code or "")
    except SyntaxError as err:
        return gr.skip(), gr.skip(), "⚠ " + t("plugin_error", lang, err=f"line {err.lineno}: {err.msg}")
    fns = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_")]
    if not fns:
        return gr.skip(), gr.skip(), "⚠ " + t("plugin_error", lang, err=t("plugin_nofn", lang))
    fname = safe_filename(name or "my_rewards", "my_rewards")
    fname = fname if fname.endswith(".py") else f"{fname}.py"
    try:
        dest = ctx.config.workspace.resolve(f"plugins/{fname}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(code)
    except (PathError, OSError) as err:
        return gr.skip(), gr.skip(), "⚠ " + t("plugin_error", lang, err=str(err))
    rel = ctx.config.workspace.rel(dest)
    return _add_plugin(rel, plugins_text, table, fns) + (t("plugin_saved", lang, path=rel, fns=", ".join(fns)),)


def _add_plugin(rel: str, plugins_text: str, table: Any, fns: list[str]) -> tuple[str, list[list[Any]]]:
    current = [p.strip() for p in str(plugins_text or "").replace("\n", ",").split(",") if p.strip()]
    if rel not in current:
        current.append(rel)
    rows = _rows(table)
    have = {str(r[0]).strip() for r in rows}
    rows += [[f, 1.0, ""] for f in fns if f not in have]
    return ", ".join(current), rows


SUMMARY_KEYS = ("source", "function", "weight", "scored", "n", "mean", "std", "min", "max", "errors", "error")


def render_scores(result: dict[str, Any], lang: str) -> tuple[Any, Any, str]:
    """(per-function summary table, per-sample table, message) for a reward check result."""
    hidden = gr.update(value=None, visible=False)
    if "error" in result:
        return hidden, hidden, "⚠ " + html.escape(t("rewards_failed", lang, err=result["error"]))
    funcs, samples = result.get("functions") or [], result.get("samples") or []
    summary = {"headers": list(SUMMARY_KEYS), "data": [[_cell(f.get(k)) for k in SUMMARY_KEYS] for f in funcs]}
    fn_names = list(dict.fromkeys(k for s in samples for k in (s.get("rewards") or {})))
    heads = ["source", "prompt", "completion", "solution", *fn_names, "reward"]
    rows = [[_cell(s.get("source")), _cell(s.get("prompt")), _cell(s.get("completion")), _cell(s.get("solution")),
             *[_cell((s.get("rewards") or {}).get(n)) for n in fn_names], _cell(s.get("reward"))] for s in samples]
    failed = [f for f in funcs if f.get("errors")]
    msg = t("rewards_scored", lang, n=len(samples))
    if failed:
        msg += "\n\n" + "\n".join(f"- ⚠ {html.escape(str(f.get('function')))}: {html.escape(str(f.get('error')))}"
                                    for f in failed)
    return (gr.update(value=summary, visible=bool(funcs)), gr.update(value={"headers": heads, "data": rows},
                                                                     visible=bool(rows)), msg)


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return "" if v != v else round(v, 4)
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False, default=str)
    return "" if v is None else v


def build(ctx: BuildContext) -> None:
    comps = ctx.form.comps
    initial = ticked(ctx.values["rewards.functions"])
    builtins = gr.CheckboxGroup(choices=sorted(BUILTIN_REWARDS), value=initial, label=t("builtins", ctx.lang),
                                info=t("builtins_info", ctx.lang), elem_id="rewards-builtins")
    ctx.reg.label_info(builtins, "builtins", "builtins_info")
    with gr.Accordion(t("builtins_docs", ctx.lang), open=False) as docs_acc:
        ctx.reg.label(docs_acc, "builtins_docs")
        gr.Markdown(builtin_docs(), elem_classes=["gs-small"])
    section_fields("rewards", ctx.form, ctx.reg, ctx.values, ctx.lang)
    table, plugins = comps["rewards.functions"], comps["rewards.plugins"]
    builtins.input(sync_table, [builtins, table], table, queue=False)
    table.change(ticked, table, builtins, queue=False)

    with gr.Accordion(t("code_editor", ctx.lang), open=False) as acc:
        ctx.reg.label(acc, "code_editor")
        code = gr.Code(EXAMPLE_PLUGIN, language="python", lines=8, elem_id="plugin-code")
        with gr.Row():
            pname = ctx.reg.label(gr.Textbox("my_rewards", label=t("plugin_name", ctx.lang), scale=2), "plugin_name")
            save = ctx.reg.value(gr.Button(t("save_plugin", ctx.lang), size="sm", scale=1), "save_plugin")
            upload = ctx.reg.own_words(ctx.reg.label(gr.File(label=t("plugin_upload", ctx.lang), file_types=[".py"],
                                                             height=UPLOAD_HEIGHT, scale=2), "plugin_upload"))
        plugin_msg = gr.Markdown()
    save.click(lambda n, c, p, tb, lang: save_plugin(ctx, n, c, p, tb, lang),
               [pname, code, plugins, table, ctx.lang_input], [plugins, table, plugin_msg])

    def on_upload(file: str | None, plugins_text: str, tb: Any, lang: str) -> tuple[Any, Any, str]:
        if not file:
            return gr.skip(), gr.skip(), ""
        try:
            rel = ctx.config.workspace.save_upload(file, "plugins")
            tree = ast.parse(ctx.config.workspace.resolve(rel).read_text())
        except (PathError, OSError, SyntaxError, UnicodeDecodeError) as err:
            return gr.skip(), gr.skip(), "⚠ " + t("plugin_error", lang, err=str(err))
        fns = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and not n.name.startswith("_")]
        return _add_plugin(rel, plugins_text, tb, fns) + (t("plugin_saved", lang, path=rel, fns=", ".join(fns)),)

    upload.upload(on_upload, [upload, plugins, table, ctx.lang_input], [plugins, table, plugin_msg])

    with gr.Row(equal_height=True):
        nrows = ctx.reg.label(gr.Number(8, label=t("test_rows", ctx.lang), precision=0, minimum=1, maximum=64,
                                        scale=1, min_width=120), "test_rows")
        source = gr.Dropdown([("solution", "solution"), ("model", "model"), ("solution + model", "solution,model")],
                             value="solution", label=t("test_source", ctx.lang), scale=2, min_width=200)
        ctx.reg.label(source, "test_source")
        test_btn = ctx.reg.value(gr.Button(t("test_rewards", ctx.lang), scale=1, elem_id="rewards-test"),
                                 "test_rewards")
    test_msg = gr.Markdown(elem_id="rewards-test-msg")
    summary = gr.Dataframe(visible=False, interactive=False, wrap=True, elem_id="rewards-test-summary")
    scores = gr.Dataframe(visible=False, interactive=False, wrap=True, elem_id="rewards-test-table", max_height=300)

    def on_test(n: float, src: str, lang: str, *values: Any) -> tuple[Any, Any, str]:
        try:
            spec = values_to_spec(ctx.form.values(values))
        except SpecError as err:
            hidden = gr.update(visible=False)
            return hidden, hidden, "⚠ " + t("rewards_invalid", lang, err="; ".join(map(str, err.issues)))
        for ref in [*spec.data.sources, *spec.rewards.plugins]:
            msg = ctx.config.workspace.check_ref(ref)
            if msg:
                return gr.update(visible=False), gr.update(visible=False), f"⚠ {html.escape(msg)}"
        result = score_rewards(spec, ctx.config.workspace.root, rows=int(n or 8), completions=src or "solution")
        return render_scores(result, lang)

    ctx.deferred.append(lambda: test_btn.click(on_test, [nrows, source, ctx.lang_input, *ctx.form.ordered()],
                                               [summary, scores, test_msg], concurrency_limit=2))
