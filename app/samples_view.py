"""The samples browser's HTML: one column per prompt group, its completions with rewards and advantages.

Pure functions over samples.jsonl rows. All model text is HTML-escaped (completions are untrusted).
A multi-turn row (docs/agent.md: `episode`, `turns`, `tool_calls`, `tool_errors`, `cut`) shows its episode
turn by turn in the completion cell: a role badge per segment, the assistant's text and tool calls, each
tool's result or error, inserted (masked, not trained) segments greyed and labelled; a row without `episode`
is drawn exactly as a single-turn one. Every field of such a row is untrusted too: a malformed episode falls
back to the plain completion.
"""

from __future__ import annotations

import html
import json
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
            hay = f"{row.get('prompt', '')}\n{row.get('completion', '')}\n{row.get('solution', '')}"
            hay = (hay + "".join(f"\n{seg.get('text', '')}" for seg in episode_segments(row))).lower()
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


# ----------------------------------------------------------------------------- multi-turn episodes

EPISODE_LABELS = {"turns": "turns", "tool_calls": "tool calls", "tool_errors": "errors", "cut": "cut at the limit",
                  "role_assistant": "assistant", "role_tool": "tool", "role_user": "environment",
                  "not_trained": "not trained", "not_trained_title": "inserted tokens: masked out of the loss",
                  "tokens": "tok", "call": "call", "error": "error"}


def episode_segments(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row's episode segments (dicts only), or [] for a single-turn row or a malformed episode."""
    ep = row.get("episode")
    if not isinstance(ep, list):
        return []
    return [seg for seg in ep if isinstance(seg, dict)]


def _count(v: Any) -> str:
    return str(int(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else "–"


def _args_json(args: Any) -> str:
    """A call's arguments as JSON text (a string that is not JSON, e.g. the model's bad JSON, shown as it is)."""
    if isinstance(args, str):
        return args
    try:
        return json.dumps(args, ensure_ascii=False, sort_keys=False, default=str)
    except (TypeError, ValueError):
        return str(args)


def episode_header(row: dict[str, Any], labels: dict[str, str] | None = None) -> str:
    """The counts of a multi-turn sample: turns, tool calls, errors, and whether it was cut."""
    lab = {**EPISODE_LABELS, **(labels or {})}
    errors = row.get("tool_errors")
    err_cls = " gs-ep-bad" if isinstance(errors, (int, float)) and errors > 0 else ""
    bits = [f'<span class="gs-ep-count">{html.escape(lab["turns"])} <b>{_count(row.get("turns"))}</b></span>',
            f'<span class="gs-ep-count">{html.escape(lab["tool_calls"])} <b>{_count(row.get("tool_calls"))}</b></span>',
            f'<span class="gs-ep-count{err_cls}">{html.escape(lab["tool_errors"])} <b>{_count(errors)}</b></span>']
    if row.get("cut") is True:
        bits.append(f'<span class="gs-ep-count gs-ep-cut">✂ {html.escape(lab["cut"])}</span>')
    return f'<div class="gs-ep-head">{" · ".join(bits)}</div>'


def render_episode(row: dict[str, Any], labels: dict[str, str] | None = None) -> str:
    """HTML of a multi-turn sample, segment by segment in order; "" when the row has no episode."""
    segs = episode_segments(row)
    if not segs:
        return ""
    lab = {**EPISODE_LABELS, **(labels or {})}
    parts = [episode_header(row, lab), '<ol class="gs-episode">']
    for i, seg in enumerate(segs):
        role = str(seg.get("role") or "")
        role_cls = role if role in ("assistant", "tool", "user") else "other"
        masked = seg.get("masked") is True
        err = seg.get("error")
        has_err = err not in (None, "", False)
        cls = f"gs-seg gs-seg-{role_cls}" + (" gs-masked" if masked else "") + (" gs-seg-error" if has_err else "")
        badge = lab.get(f"role_{role}", role or "?")
        head = [f'<span class="gs-role gs-role-{role_cls}">{html.escape(badge)}</span>']
        if role == "tool" and seg.get("name") not in (None, ""):
            head.append(f'<code class="gs-tool-name">{html.escape(str(seg.get("name")))}</code>')
        if isinstance(seg.get("tokens"), (int, float)) and not isinstance(seg.get("tokens"), bool):
            head.append(f'<span class="gs-tok">{_count(seg.get("tokens"))} {html.escape(lab["tokens"])}</span>')
        if masked:
            head.append(f'<span class="gs-not-trained" title="{html.escape(lab["not_trained_title"])}">'
                        f'{html.escape(lab["not_trained"])}</span>')
        parts.append(f'<li class="{cls}" data-role="{html.escape(role_cls)}" data-index="{i}">'
                     f'<div class="gs-seg-head">{" ".join(head)}</div>')
        text = seg.get("text")
        if text not in (None, ""):
            parts.append(f'<pre class="gs-seg-text">{html.escape(str(text))}</pre>')
        calls = seg.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if not isinstance(call, dict):
                continue
            parts.append(f'<div class="gs-call"><span class="gs-call-label">{html.escape(lab["call"])}</span> '
                         f'<code class="gs-call-name">{html.escape(str(call.get("name", "")))}</code>'
                         f'<pre class="gs-call-args">{html.escape(_args_json(call.get("arguments")))}</pre></div>')
        if has_err:
            parts.append(f'<div class="gs-tool-error">⚠ {html.escape(lab["error"])}: '
                         f'{html.escape(err if isinstance(err, str) else _args_json(err))}</div>')
        parts.append("</li>")
    parts.append("</ol>")
    return "".join(parts)


def render_step(rows: list[dict[str, Any]], flt: SampleFilter | None = None, labels: dict[str, str] | None = None,
                max_groups: int = 32, image_uris: Callable[[Any], list[str]] | None = None) -> str:
    """HTML for one step: groups side by side, best (green) and worst (red) completion of each group marked.

    `image_uris` turns a sample's 'images' references (multimodal runs) into image sources shown above the
    group's prompt; the caller decides what may be shown (app.media keeps paths inside the workspace)."""
    lab = {"prompt": "prompt", "solution": "solution", "completion": "completion", "reward": "reward",
           "advantage": "adv", "length": "len", "truncated": "truncated", "group": "group",
           "empty": "No samples match.", "best": "best", "worst": "worst",
           "replayed": "replayed: a solved completion from an earlier step", **EPISODE_LABELS, **(labels or {})}
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
        episodes = any(episode_segments(r) for r in members)
        parts.append('<div class="gs-group gs-group-episodes">' if episodes else '<div class="gs-group">')
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
            body = render_episode(r, lab) or f'<pre>{html.escape(str(r.get("completion", "")))}</pre>'
            parts.append(f'<tr class="gs-row {cls}" title="{title}"><td>{body}'
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
.gs-group-episodes{max-width:640px;min-width:420px}
.gs-ep-head{font-size:11px;color:#4b5563;margin:2px 0 4px}
.gs-ep-bad{color:#b91c1c}
.gs-ep-cut{color:#b45309}
.gs-episode{list-style:none;margin:0;padding:0;display:flex;flex-direction:column;gap:4px}
.gs-seg{border-left:3px solid #2563eb;border-radius:4px;padding:3px 6px;background:rgba(37,99,235,.05)}
.gs-seg-tool{border-left-color:#0891b2}
.gs-seg-user{border-left-color:#9333ea}
.gs-seg-other{border-left-color:#9ca3af}
.gs-masked{background:repeating-linear-gradient(135deg,#f3f4f6,#f3f4f6 6px,#e5e7eb 6px,#e5e7eb 12px);color:#4b5563}
.gs-seg-error{border-left-color:#dc2626}
.gs-seg-head{display:flex;gap:6px;align-items:center;font-size:11px;margin-bottom:2px}
.gs-role{border-radius:9px;padding:0 7px;color:#fff;font-weight:600;background:#2563eb}
.gs-role-tool{background:#0891b2}
.gs-role-user{background:#9333ea}
.gs-role-other{background:#6b7280}
.gs-tok{color:#6b7280}
.gs-not-trained{border:1px dashed #6b7280;border-radius:9px;padding:0 6px;color:#374151;background:#fff}
.gs-table pre.gs-seg-text,.gs-table pre.gs-call-args{max-height:200px}
.gs-call{font-size:11px;margin-top:2px}
.gs-call-label{color:#6b7280}
.gs-call-args{background:var(--background-fill-secondary,#f3f4f6);padding:2px 4px;border-radius:4px}
.gs-tool-error{color:#b91c1c;background:rgba(220,38,38,.1);border-radius:4px;padding:1px 4px;font-weight:600;font-size:12px;
  margin-top:2px;white-space:pre-wrap}
"""
