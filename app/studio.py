"""Assemble the studio: four pages (Build a run, Runs, Compare, Evaluate) of one Gradio app, and its CSS.

The live views are pages of their own, not tabs of one page, because Gradio's page does work per event
that grows with (components taking part in any event) x (components on the page): the Build form has
~70 fields taking part in validation, and next to it every one-second dashboard tick cost ~250 ms of
browser time. On its own page the dashboard's tick is cheap. Pages link through the URL
(`runs?run=ID` after Start, `?clone=ID` from a run); the language choice is kept in the browser.
Each page is wired in its tab module (`build_page`, `runs_page`, `compare_page`, `eval_page`, over the
shared header of app.page); this module only mounts them on their routes.
"""

from __future__ import annotations

import gradio as gr

from app.build_tab import build_page
from app.compare_tab import compare_page
from app.config import StudioConfig
from app.eval_tab import eval_page
from app.eval_view import EVAL_CSS
from app.runs_tab import runs_page
from app.samples_view import SAMPLES_CSS

CSS = SAMPLES_CSS + EVAL_CSS + """
.gs-error textarea, .gs-error input, .gs-error .wrap { border-color: #dc2626 !important; }
.gs-error .info, .gs-error [data-testid="block-info"] + div, .gs-error-text { color: #dc2626 !important; }
.gs-actions { position: sticky; top: 0; z-index: 20; padding: 6px 8px; box-shadow: 0 2px 8px rgba(0,0,0,.08);
  background: var(--background-fill-primary, #fff); align-items: center; }
/* Gradio's container clips with overflow: hidden, which makes it the sticky bar's scroller; clip does not */
.gradio-container:has(.gs-actions) { overflow: clip !important; }
.gs-actions .gs-summary { max-height: 4.5em; overflow-y: auto; font-size: 13px; }
.gs-actions .gs-summary p, .gs-actions .gs-summary ul { margin: 0; }
.gs-inert .info, .gs-inert [data-testid="block-info"] + div { color: #92400e !important; }
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


def create_studio(config: StudioConfig, lang: str = "en") -> gr.Blocks:
    with gr.Blocks(title="GRPO Studio") as demo:
        build_page(demo, config, lang)
    demo.pages[0] = ("", PAGE_NAMES["build"], True)
    with demo.route(PAGE_NAMES["runs"], "runs"):
        runs_page(demo, config, lang)
    with demo.route(PAGE_NAMES["compare"], "compare"):
        compare_page(demo, config, lang)
    with demo.route(PAGE_NAMES["evaluate"], "evaluate"):
        eval_page(demo, config, lang)
    return demo
