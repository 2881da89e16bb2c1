"""The samples browser's HTML: one column per prompt group, its completions with rewards and advantages.

Pure functions over samples.jsonl rows. All model text is HTML-escaped (completions are untrusted).
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SampleFilter:
    reward_min: float | None = None
    reward_max: float | None = None
    text: str = ""

    def keep(self, row: dict[str, Any]) -> bool:
        r = row.get("reward")
        r = r if isinstance(r, (int, float)) else None
        if self.reward_min is not None and (r is None or r < self.reward_min):
            return False
        if self.reward_max is not None and (r is None or r > self.reward_max):
            return False
        if self.text:
            needle = self.text.lower()
            hay = f"{row.get('prompt', '')}\n{row.get('completion', '')}\n{row.get('solution', '')}".lower()
            if needle not in hay:
                return False
        return True


def group_rows(rows: list[dict[str, Any]], flt: SampleFilter | None = None) -> list[tuple[int, list[dict[str, Any]]]]:
    """Rows grouped by prompt group (in group order); a group is kept when any completion passes the filter,
    and then only its passing completions are shown."""
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        g = r.get("group")
        groups[int(g) if isinstance(g, (int, float)) else -1].append(r)
    out = []
    for g in sorted(groups):
        members = groups[g]
        shown = [r for r in members if flt is None or flt.keep(r)]
        if shown:
            out.append((g, shown))
    return out


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        return "nan" if isinstance(v, float) and math.isnan(v) else f"{v:.{digits}f}" if isinstance(v, float) else str(v)
    return html.escape(str(v))


def _reward(r: dict[str, Any]) -> float:
    v = r.get("reward")
    return float(v) if isinstance(v, (int, float)) and v == v else -math.inf


def render_step(rows: list[dict[str, Any]], flt: SampleFilter | None = None, labels: dict[str, str] | None = None,
                max_groups: int = 32, image_uris: Callable[[Any], list[str]] | None = None) -> str:
    """HTML for one step: groups side by side, best (green) and worst (red) completion of each group marked.

    `image_uris` turns a sample's 'images' references (multimodal runs) into image sources shown above the
    group's prompt; the caller decides what may be shown (app.media keeps paths inside the workspace)."""
    lab = {"prompt": "prompt", "solution": "solution", "completion": "completion", "reward": "reward",
           "advantage": "adv", "length": "len", "truncated": "truncated", "group": "group",
           "empty": "No samples match.", "best": "best", "worst": "worst",
           "replayed": "replayed: a solved completion from an earlier step", **(labels or {})}
    groups = group_rows(rows, flt)
    if not groups:
        return f'<div class="gs-empty">{html.escape(lab["empty"])}</div>'
    parts = ['<div class="gs-samples">']
    for g, members in groups[:max_groups]:
        first = members[0]
        rewards = [_reward(r) for r in members]
        best = max(rewards) if rewards else None
        worst = min(rewards) if rewards else None
        spread = best is not None and worst is not None and best != worst
        fn_names = sorted({k for r in members for k in (r.get("rewards") or {})})
        parts.append('<div class="gs-group">')
        parts.append(f'<div class="gs-head"><b>{html.escape(lab["group"])} {g}</b></div>')
        if image_uris is not None and (first.get("images") or first.get("videos")):
            # a video shows its first frame (the first frame file, or an animated file's first frame)
            refs = list(first.get("images") or []) + list(first.get("videos") or [])[:1]
            imgs = "".join(f'<img class="gs-thumb" src="{html.escape(u)}" alt="image">' for u in image_uris(refs))
            if imgs:
                parts.append(f'<div class="gs-thumbs">{imgs}</div>')
        parts.append(f'<pre class="gs-prompt" title="{html.escape(lab["prompt"])}">{html.escape(str(first.get("prompt", "")))}</pre>')
        if first.get("solution") not in (None, ""):
            parts.append(f'<div class="gs-solution">{html.escape(lab["solution"])}: <code>{_fmt(first.get("solution"))}</code></div>')
        head = "".join(f"<th>{html.escape(n)}</th>" for n in fn_names)
        parts.append(f'<table class="gs-table"><thead><tr><th>{html.escape(lab["completion"])}</th>'
                     f'<th>{html.escape(lab["reward"])}</th>{head}<th>{html.escape(lab["advantage"])}</th>'
                     f'<th>{html.escape(lab["length"])}</th></tr></thead><tbody>')
        for r, rv in sorted(zip(members, rewards), key=lambda t: -t[1]):
            cls = ""
            if spread and rv == best:
                cls = "gs-best"
            elif spread and rv == worst:
                cls = "gs-worst"
            trunc = ' <span class="gs-trunc">✂</span>' if r.get("truncated") else ""
            if r.get("replayed"):  # put back by success replay (algorithm.replay_solved): sampled at an earlier step
                trunc += f' <span class="gs-replay" title="{html.escape(lab["replayed"])}">↺</span>'
            per_fn = "".join(f"<td>{_fmt((r.get('rewards') or {}).get(n))}</td>" for n in fn_names)
            title = html.escape(lab["best"] if cls == "gs-best" else lab["worst"] if cls == "gs-worst" else "")
            parts.append(f'<tr class="gs-row {cls}" title="{title}"><td><pre>{html.escape(str(r.get("completion", "")))}</pre>'
                         f'{trunc}</td><td>{_fmt(r.get("reward"))}</td>{per_fn}<td>{_fmt(r.get("advantage"))}</td>'
                         f'<td>{_fmt(r.get("length"))}</td></tr>')
        parts.append("</tbody></table></div>")
    if len(groups) > max_groups:
        parts.append(f'<div class="gs-more">+{len(groups) - max_groups}</div>')
    parts.append("</div>")
    return "".join(parts)


SAMPLES_CSS = """
.gs-samples{display:flex;gap:12px;overflow-x:auto;align-items:flex-start;padding-bottom:6px}
.gs-group{min-width:320px;max-width:420px;flex:0 0 auto;overflow-x:auto;border:1px solid var(--border-color-primary,#e5e7eb);
  border-radius:8px;padding:8px;background:var(--block-background-fill,#fff)}
.gs-prompt{white-space:pre-wrap;font-size:12px;background:var(--background-fill-secondary,#f3f4f6);padding:6px;border-radius:6px;
  max-height:160px;overflow:auto;margin:4px 0}
.gs-solution{font-size:12px;margin-bottom:4px}
.gs-table{width:100%;border-collapse:collapse;font-size:12px}
.gs-table th,.gs-table td{border-bottom:1px solid var(--border-color-primary,#eee);padding:2px 4px;text-align:left;vertical-align:top}
.gs-table pre{white-space:pre-wrap;margin:0;font-size:12px;max-height:120px;overflow:auto}
.gs-best{background:rgba(22,163,74,.14)}
.gs-worst{background:rgba(220,38,38,.12)}
.gs-trunc{color:#b45309}
.gs-replay{color:#2563eb}
.gs-empty{color:#6b7280;padding:12px}
.gs-thumbs{display:flex;gap:6px;flex-wrap:wrap;margin:4px 0}
.gs-thumb{max-width:160px;max-height:160px;border-radius:4px;image-rendering:pixelated}
"""
