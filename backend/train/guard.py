"""The non-finite guard: a step whose rewards, advantages, loss or gradient norm is not finite trains nothing.

Why: a reward plugin returning 1e308 became inf in the float32 score matrix, the advantages NaN, and a single
AdamW step made every weight NaN; the run went on to "finished". The scorer now refuses scores beyond float32
as it refuses NaN and inf (its on_error decides), but finite rewards can still overflow a group's statistics,
and a model can still produce a NaN loss. The contract:
- `batch_problem(ro)`: a rollout whose advantages, mean reward or reward spread is NaN or ±inf is not trained
  on at all (every rank agrees: the loop all-reduces the verdict);
- a gradient whose norm is not finite is never applied (`dist.clipped_step` skips the optimizer step);
- each step's metrics line has `nonfinite/skipped` (1.0 when its update was skipped), and status.json a
  warning the dashboard shows; `LIMIT` skipped updates in a row fail the run with the last cause, since by
  then the fault is in the reward or the model, not one unlucky batch;
- `check_weights` refuses to checkpoint weights that are not finite (DeepSpeed applies its own update, so the
  guard cannot skip it there; this keeps such weights out of every checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from backend.train.batch import Rollout

LIMIT = 3  # skipped updates in a row before the run fails
SKIPPED = "nonfinite/skipped"  # the metric: 1.0 on a step whose update was skipped


class NonFiniteError(RuntimeError):
    pass


def _bad(v: float | None) -> bool:
    return v is None or not math.isfinite(v)


def batch_problem(ro: Rollout) -> str | None:
    """Why this rollout must not be trained on, or None."""
    for key in ("reward", "reward_std"):
        if _bad(ro.metrics.get(key)):
            return f"{key} is {ro.metrics.get(key)} (rewards too large: their group statistics overflow)"
    if not torch.isfinite(ro.advantages).all():
        return "advantages are not finite"
    return None


def update_problem(stats: dict[str, float]) -> str | None:
    """Why the update of these training stats was skipped, or None: a gradient norm that is not finite is never
    applied (dist.clipped_step); a NaN loss shows there, as its gradient is NaN too."""
    if _bad(stats.get("grad_norm")):
        return f"gradient norm is {stats.get('grad_norm')} (loss {stats.get('loss')})"
    return None


def check_weights(named: Iterable[tuple[str, torch.Tensor]], step: int) -> None:
    """Raise NonFiniteError when a weight is NaN or ±inf (before a checkpoint is written)."""
    for name, t in named:
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise NonFiniteError(f"weight {name} is not finite at step {step}: no checkpoint written "
                                 "(the previous checkpoint is kept)")


class Guard:
    """Counts skipped updates: `note` each step's cause (None: it trained), `raise_at_limit` once it is reported."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit, self.in_a_row, self.total = limit, 0, 0
        self.last: tuple[int, str] | None = None  # (step, cause) of the latest skipped update

    def note(self, step: int, cause: str | None) -> None:
        if cause is None:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.total += 1
        self.last = (step, cause)
        print(f"step {step}: update skipped, {cause}", flush=True)

    def raise_at_limit(self) -> None:
        if self.in_a_row >= self.limit and self.last is not None:
            step, cause = self.last
            raise NonFiniteError(f"{self.in_a_row} updates in a row skipped for non-finite values, the last at step "
                                 f"{step}: {cause}")

    def warnings(self) -> list[str]:
        if self.last is None:
            return []
        step, cause = self.last
        return [f"{self.total} update(s) skipped for non-finite values, the latest at step {step}: {cause} "
                f"({self.limit} in a row fail the run)"]
