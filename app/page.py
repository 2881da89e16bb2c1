"""What every studio page shares: the header with its language switch, the switch's wiring, the session defaults.

Each tab module wires its own page (`build_tab.build_page`, `runs_tab.runs_page`, ...) and imports these;
`app.studio` only assembles the pages. This module imports no tab module, so no import circle can form.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from app.fields import Registry
from app.locales import LANG_NAMES, LANGS, t
from app.session import SessionMemo

NAV_JS = "(url) => { if (url) { window.location.assign(url); } }"
LANG_KEY = "grpo-studio-lang"
# Gradio's own words (upload boxes, "Drop File Here") follow its front end's locale, which it takes from the
# browser. This sets that locale to the studio's language through Gradio's changeLocale (its core module, found
# among the loaded scripts) and waits for the dictionary; it hands on the language, and as the flag the language
# when the locale changed (the components drawn before must then be remounted), else "".
GRADIO_LOCALE_JS = """async (lang, _) => {
  const want = lang === 'zh' ? 'zh-CN' : 'en';
  if (document.documentElement.lang === want) return [lang, ''];
  const url = performance.getEntriesByType('resource').map(e => e.name)
    .find(n => /\\/assets\\/core-[^/]*\\.js$/.test(n));
  if (!url) return [lang, ''];
  try { (await import(url)).changeLocale(want); } catch (e) { return [lang, '']; }
  for (let i = 0; i < 50 && document.documentElement.lang !== want; i++) await new Promise(r => setTimeout(r, 100));
  return [lang, lang];
}"""


def header(reg: Registry, lang: str, subtitle_key: str) -> tuple[gr.Radio, gr.BrowserState]:
    with gr.Row(equal_height=True, elem_id="gs-header"):
        title = gr.Markdown(f"# {t('title', lang)}\n{t(subtitle_key, lang)}")
        reg.add(title, lambda lg: {"value": f"# {t('title', lg)}\n{t(subtitle_key, lg)}"})
        radio = gr.Radio([(LANG_NAMES[code], code) for code in LANGS], value=lang, label=t("language", lang),
                         scale=0, min_width=220, elem_id="lang-switch")
        reg.label(radio, "language")
    # the choice follows the user from page to page (and across restarts of the page, not of the studio)
    store = gr.BrowserState(lang, storage_key=LANG_KEY, secret="grpo-studio-language")
    return radio, store


def wire_language(demo: gr.Blocks, reg: Registry, radio: gr.Radio, store: gr.BrowserState,
                  on_change: Any = None, then: tuple[Any, list[Any], list[Any]] | None = None) -> None:
    """Relabel the page when the language changes; apply the stored choice when the page opens."""
    comps = reg.components()

    def relabel(lang: str, request: gr.Request) -> list[Any]:
        if on_change is not None:
            on_change(lang, request)
        return [*reg.updates(lang), lang]

    ev = radio.change(relabel, radio, [*comps, store], queue=False, show_progress="hidden")
    if then is not None:
        fn, ins, outs = then
        ev.then(fn, ins, outs, show_progress="hidden")

    def restore(stored: str, current: str) -> Any:
        return stored if stored in LANGS and stored != current else gr.skip()

    demo.load(restore, [store, radio], radio, queue=False, show_progress="hidden")
    own = reg.gradio_text
    if own:  # Gradio's own words: its locale follows the page's language, on open and on every switch
        def hide(changed: str) -> list[Any]:
            return [gr.update(visible=False) if changed else gr.skip() for _ in own]

        def show(changed: str) -> list[Any]:
            return [gr.update(visible=True) if changed else gr.skip() for _ in own]

        changed = gr.Textbox(visible=False)
        for trigger in (demo.load, radio.change):
            trigger(lambda lang, flag: flag, [radio, changed], changed, js=GRADIO_LOCALE_JS, queue=False,
                    show_progress="hidden") \
                .then(hide, changed, own, queue=False, show_progress="hidden") \
                .then(show, changed, own, queue=False, show_progress="hidden")


def session_defaults(lang: str, run_id: str | None) -> dict[str, Any]:
    """A new browser session's view of the Runs and Compare pages: what the freshly rendered page shows."""
    return {"lang": lang, "run_id": run_id, "smoothing": 0.0, "x_mode": "step", "panels": [], "step": 0,
            "follow": True, "rmin": "", "rmax": "", "text": "", "cmp_runs": [], "cmp_metric": "reward",
            "cmp_smoothing": 0.0, "cmp_x": "step", "runs_sess": {}, "samples_sess": {}, "compare_sess": {}}


def forget_drawn(memo: SessionMemo) -> Any:
    """A language-switch hook: every title changed, so the session's next tick redraws everything."""
    def reset(lang: str, request: gr.Request) -> None:
        m = memo.get(request)
        m["lang"] = lang
        m["runs_sess"], m["samples_sess"], m["compare_sess"] = {}, {}, {}
    return reset
