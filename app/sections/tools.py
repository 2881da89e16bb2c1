"""Tools & environment section (docs/agent.md): the `tools` fields and `rollout.max_turns`, and a tool file
editor and upload like the reward plugin's.

A tool is a Python function with type hints and a Google-style docstring (`Args:`), the convention of
`transformers.utils.get_json_schema` that TRL uses. "Save as tool file and use it" writes the code to
`tools/NAME.py` inside the workspace (a bare, sanitised file name: "../x" lands in tools/x.py, never outside),
adds it to `tools.files` and its top-level functions to `tools.functions`; a file that defines an environment
class (with `reset` and `step`) fills `tools.environment` instead when that is empty. Code that does not parse,
or defines neither a function nor an environment class, is refused with the reason, and nothing in the form or
the editor is lost. The code is only parsed here (`ast`), never imported or run: the trainer runs tools in an
isolated worker.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from app.fields import UPLOAD_HEIGHT, section_fields
from app.locales import t
from app.paths import PathError, Workspace, safe_filename
from app.sections import BuildContext
from app.sections.rollout import SHOWN_IN_TOOLS

TOOLS_DIR = "tools"
DEFAULT_NAME = "my_tools"

EXAMPLE_TOOL = '''def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.

    Returns:
        The sum of a and b.
    """
    return a + b
'''


class ToolFileError(ValueError):
    """Why a tool file was refused; `key` is its locale message, `fmt` the message's values."""

    def __init__(self, key: str, **fmt: Any) -> None:
        super().__init__(key)
        self.key, self.fmt = key, fmt

    def text(self, lang: str) -> str:
        return t(self.key, lang, **self.fmt)


@dataclass(frozen=True)
class ToolSource:
    """What a tool file defines, read from its syntax tree."""

    functions: list[str]
    environments: list[str]  # classes with both reset() and step()
    warnings: list[str] = field(default_factory=list)  # functions get_json_schema would refuse: no hints, no doc


@dataclass(frozen=True)
class SavedTool:
    rel: str  # the form's path of the file (relative to the workspace)
    source: ToolSource


def inspect_tool_source(code: str) -> ToolSource:
    """The tools and environment classes a file defines; raises ToolFileError (syntax, nothing defined)."""
    try:
        tree = ast.parse(code or "")
    except SyntaxError as err:
        raise ToolFileError("tool_syntax", line=err.lineno or 0, err=err.msg) from None
    fns = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_")]
    envs = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")
            and {"reset", "step"} <= {m.name for m in n.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}]
    if not fns and not envs:
        raise ToolFileError("tool_nofn")
    return ToolSource([f.name for f in fns], envs, [w for f in fns for w in _schema_warnings(f)])


def _schema_warnings(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """What `get_json_schema` needs of a tool: a docstring, a type hint on every argument, each described."""
    out = []
    args = [a for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs] if a.arg not in ("self", "cls")]
    doc = ast.get_docstring(fn) or ""
    if not doc:
        out.append(f"{fn.name}: no docstring")
    unhinted = [a.arg for a in args if a.annotation is None]
    if unhinted:
        out.append(f"{fn.name}: no type hint for {', '.join(unhinted)}")
    if doc and args and "Args:" not in doc:
        out.append(f"{fn.name}: the docstring has no Args: section")
    return out


def tool_file_name(name: str) -> str:
    """A bare .py file name for the editor's name box: no directories ("../x" -> "x.py")."""
    fname = safe_filename((name or "").strip() or DEFAULT_NAME, DEFAULT_NAME)
    return fname if fname.endswith(".py") else f"{fname}.py"


def save_tool_file(workspace: Workspace, name: str, code: str) -> SavedTool:
    """Write the editor's code to <workspace>/tools/NAME.py once it parses and defines a tool; raises ToolFileError
    (the code) or PathError/OSError (the place), writing nothing then."""
    source = inspect_tool_source(code)
    dest = workspace.resolve(f"{TOOLS_DIR}/{tool_file_name(name)}")  # symlinks resolved: tools/ may not lead out
    if not workspace.contains(dest):
        raise PathError(f"{dest} is outside the workspace")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(code)
    return SavedTool(workspace.rel(dest), source)


def _items(text: Any) -> list[str]:
    return [p.strip() for p in str(text or "").replace("\n", ",").split(",") if p.strip()]


def add_items(text: Any, new: list[str]) -> str:
    """A list field's text with `new` appended (each once)."""
    current = _items(text)
    current += [n for n in dict.fromkeys(new) if n not in current]
    return ", ".join(current)


@dataclass(frozen=True)
class FormChange:
    """The form fields a saved or uploaded tool file sets, and the message."""

    files: str
    functions: str
    environment: str
    message: str


def use_tool_file(saved: SavedTool, files: Any, functions: Any, environment: Any, lang: str) -> FormChange:
    """Add a saved file to tools.files, and its functions to tools.functions, or its environment class to
    tools.environment (an environment file's functions are its helpers, not tools)."""
    src = saved.source
    env = str(environment or "").strip()
    fns: list[str] = []
    if src.environments:
        if not env:
            env = src.environments[0]
        msg = t("tool_saved_env", lang, path=saved.rel, env=", ".join(src.environments))
    else:
        fns = src.functions
        msg = t("tool_saved", lang, path=saved.rel, fns=", ".join(fns))
    if src.warnings:
        msg += "\n\n" + t("tool_warnings", lang) + "\n" + "\n".join(f"- {w}" for w in src.warnings)
    return FormChange(add_items(files, [saved.rel]), add_items(functions, fns), env, msg)


def _esc(text: str) -> str:
    """Markdown-safe text for a message (a file name or an error may hold anything)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def on_save(workspace: Workspace, name: str, code: str, files: Any, functions: Any, environment: Any, lang: str
            ) -> tuple[Any, Any, Any, str]:
    """The editor's button: (tools.files, tools.functions, tools.environment, message); on a refusal the fields
    are left as they are (gr.skip) and the editor keeps the code."""
    try:
        saved = save_tool_file(workspace, name, code)
    except ToolFileError as err:
        return gr.skip(), gr.skip(), gr.skip(), "⚠ " + t("tool_error", lang, err=_esc(err.text(lang)))
    except (PathError, OSError) as err:
        return gr.skip(), gr.skip(), gr.skip(), "⚠ " + t("tool_error", lang, err=_esc(str(err)))
    c = use_tool_file(saved, files, functions, environment, lang)
    return c.files, c.functions, c.environment, _esc(c.message)


def on_upload(workspace: Workspace, file: str | None, files: Any, functions: Any, environment: Any, lang: str
              ) -> tuple[Any, Any, Any, str]:
    """An uploaded .py: checked before it is copied into tools/ (a refused file is not kept)."""
    if not file:
        return gr.skip(), gr.skip(), gr.skip(), ""
    try:
        code = Path(file).read_text()
        source = inspect_tool_source(code)
        rel = workspace.save_upload(file, TOOLS_DIR)
    except ToolFileError as err:
        return gr.skip(), gr.skip(), gr.skip(), "⚠ " + t("tool_error", lang, err=_esc(err.text(lang)))
    except (PathError, OSError, UnicodeDecodeError) as err:
        return gr.skip(), gr.skip(), gr.skip(), "⚠ " + t("tool_error", lang, err=_esc(str(err)))
    c = use_tool_file(SavedTool(rel, source), files, functions, environment, lang)
    return c.files, c.functions, c.environment, _esc(c.message)


def build(ctx: BuildContext) -> None:
    intro = gr.Markdown(t("tools_intro", ctx.lang), elem_classes=["gs-note"], elem_id="tools-intro")
    ctx.reg.add(intro, lambda lg: {"value": t("tools_intro", lg)})
    section_fields("tools", ctx.form, ctx.reg, ctx.values, ctx.lang, per_row=4, extra=SHOWN_IN_TOOLS)
    comps = ctx.form.comps
    files, functions, environment = comps["tools.files"], comps["tools.functions"], comps["tools.environment"]
    ws = ctx.config.workspace

    with gr.Accordion(t("tool_editor", ctx.lang), open=False, elem_id="tool-editor-acc") as acc:
        ctx.reg.label(acc, "tool_editor")
        code = gr.Code(EXAMPLE_TOOL, language="python", lines=12, elem_id="tool-code")
        with gr.Row():
            tname = ctx.reg.label(gr.Textbox(DEFAULT_NAME, label=t("tool_name", ctx.lang), scale=2,
                                             elem_id="tool-name"), "tool_name")
            save = ctx.reg.value(gr.Button(t("save_tool", ctx.lang), size="sm", scale=1, elem_id="tool-save"),
                                 "save_tool")
            upload = ctx.reg.own_words(ctx.reg.label(gr.File(label=t("tool_upload", ctx.lang), file_types=[".py"],
                                                             height=UPLOAD_HEIGHT, scale=2, elem_id="tool-upload"),
                                                     "tool_upload"))
        msg = gr.Markdown(elem_id="tool-msg")
    outs = [files, functions, environment, msg]
    save.click(lambda n, c, f, fn, env, lang: on_save(ws, n, c, f, fn, env, lang),
               [tname, code, files, functions, environment, ctx.lang_input], outs)
    upload.upload(lambda fl, f, fn, env, lang: on_upload(ws, fl, f, fn, env, lang),
                  [upload, files, functions, environment, ctx.lang_input], outs)
