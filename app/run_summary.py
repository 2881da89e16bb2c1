"""What happened in a run, on one screen: reward from -> to, held-out from -> to (when evaluated during training),
the best checkpoint, training time, completion tokens sampled, and the warnings raised.

`summarize` is a pure function of the run directory, read through backend.rundir's readers (status.json,
metrics.jsonl, eval/during_training.jsonl, the checkpoints), so a CLI run summarises as a studio run does, and
the page never keeps a second account of the run. `summary_markdown` writes it as Markdown, the one text the page
shows and the user copies.

Reward "from -> to" compares the mean of the first and of the last k steps (k = a tenth of the steps, 1 to 10):
one step's batch reward is noisy, and a summary that moved with the last batch would say a different thing each
time it is read. Completion tokens are each rollout's tokens/s x its step time, counted once per rollout (with
num_iterations > 1 a rollout trains several steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from app.locales import state_label, t
from app.runlist import format_duration
from backend.rundir import BestCheckpoint, RunDir

FINAL_STATES = ("finished", "stopped", "failed")  # a run whose story has an end (so far)
MAX_WINDOW = 10


@dataclass(frozen=True)
class Change:
    """A quantity at the start and at the end of the run: the mean over steps first_steps and last_steps."""
    first: float
    last: float
    first_steps: tuple[int, int]  # (from, to) steps the first value averages
    last_steps: tuple[int, int]

    @property
    def delta(self) -> float:
        return self.last - self.first


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    state: str
    step: int
    total_steps: int
    trained_s: float | None
    reward: Change | None
    heldout: Change | None
    heldout_metric: str
    best: BestCheckpoint | None
    completion_tokens: int | None
    warnings: list[str] = field(default_factory=list)
    error: str = ""


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _points(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    out = []
    for i, r in enumerate(rows):
        v = _num(r.get(key))
        step = r.get("step")
        if v is not None:
            out.append((int(step) if isinstance(step, int) and not isinstance(step, bool) else i + 1, v))
    return out


def change(points: list[tuple[int, float]], window: int | None = None) -> Change | None:
    """First vs last: the means of the first and last k points, k = `window` or a tenth of them (1..10)."""
    if not points:
        return None
    k = window or max(1, min(MAX_WINDOW, len(points) // 10))
    head, tail = points[:k], points[-k:]
    return Change(sum(v for _, v in head) / len(head), sum(v for _, v in tail) / len(tail),
                  (head[0][0], head[-1][0]), (tail[0][0], tail[-1][0]))


def completion_tokens(rows: list[dict[str, Any]]) -> int | None:
    """Tokens sampled, each rollout counted once (num_iterations repeats its row): its `completions/tokens`, or
    for runs logged before that metric, throughput x step time of its first step. None when no row has either."""
    seen: set[Any] = set()
    total, found = 0.0, False
    for r in rows:
        tokens = _num(r.get("completions/tokens"))
        if tokens is None:
            rate, step_s = _num(r.get("throughput/completion_tokens_per_s")), _num(r.get("timing/step_s"))
            tokens = None if rate is None or step_s is None else rate * step_s
        rollout = r.get("rollout", r.get("step"))
        if tokens is None or rollout in seen:
            continue
        seen.add(rollout)
        total += tokens
        found = True
    return int(round(total)) if found else None


def summarize(run: RunDir) -> RunSummary:
    st = run.read_status()
    rows, _ = run.read_metrics()
    best = run.best_checkpoint()
    metric = best.metric if best is not None else "eval/reward"
    return RunSummary(
        run_id=run.run_id, state=run.state(), step=int(_num(st.get("step")) or 0),
        total_steps=int(_num(st.get("total_steps")) or 0), trained_s=_num(st.get("elapsed_s")),
        reward=change(_points(rows, "reward")), heldout=change(_points(run.eval_curve(), metric), window=1),
        heldout_metric=metric, best=best, completion_tokens=completion_tokens(rows),
        warnings=[str(w) for w in st.get("warnings") or [] if w], error=str(st.get("error") or ""))


def _steps(span: tuple[int, int], lang: str) -> str:
    a, b = span
    return t("sum_step", lang, s=a) if a == b else t("sum_steps", lang, a=a, b=b)


def _change_line(label: str, c: Change, lang: str) -> str:
    return (f"- **{label}**: {c.first:.3f} → {c.last:.3f} ({c.delta:+.3f}; "
            f"{_steps(c.first_steps, lang)} → {_steps(c.last_steps, lang)})")


def summary_markdown(s: RunSummary, lang: str = "en") -> str:
    """The summary as Markdown: what the page shows and what "copy" gives."""
    steps = f"{s.step}/{s.total_steps}" if s.total_steps else str(s.step)
    lines = [f"### {t('sum_title', lang, run=s.run_id)}",
             f"- **{t('sum_state', lang)}**: {state_label(s.state, lang)}, {t('sum_at_step', lang, steps=steps)}"]
    if s.reward is not None:
        lines.append(_change_line(t("s_reward", lang), s.reward, lang))
    if s.heldout is not None:
        lines.append(_change_line(t("sum_heldout", lang, metric=s.heldout_metric.removeprefix("eval/")), s.heldout,
                                  lang))
    if s.best is not None:
        lines.append(f"- **{t('sum_best', lang)}**: `checkpoints/step-{s.best.step}` "
                     f"({s.best.metric} {s.best.value:.3f})")
    if s.trained_s is not None:
        lines.append(f"- **{t('sum_time', lang)}**: {format_duration(s.trained_s)}")
    if s.completion_tokens is not None:
        lines.append(f"- **{t('sum_tokens', lang)}**: {s.completion_tokens:,}")
    if s.error:
        lines.append(f"- **{t('sum_error', lang)}**: {s.error.splitlines()[0][:300]}")
    lines.append(f"- **{t('sum_warnings', lang, n=len(s.warnings))}**" + ("" if s.warnings else ": –"))
    lines += [f"  - {w}" for w in s.warnings]
    return "\n".join(lines)
