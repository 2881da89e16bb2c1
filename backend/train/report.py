"""What the trainer reports, as pure functions: a scored batch's metrics and sample rows, a step's timing and
its metrics line, the warnings for status.json, and the ETA.

They read named inputs (`ScoredBatch`, `StepClock`) and return plain dicts in the run directory's format
(metric names as DESIGN.md lists them; `samples.jsonl` rows): the loop only decides when to write them.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from backend.agent.episodes import sample_fields
from backend.multimodal import media_ref
from backend.spec import DataSection
from backend.train.batch import Rollout, ScoredGroup


@dataclass(frozen=True)
class ScoredBatch:
    """A rollout's groups with their rewards, as `RolloutBuilder.assemble` computed them (rows in group order)."""

    groups: list[ScoredGroup]
    names: list[str]  # reward functions, in score-matrix column order
    matrix: np.ndarray  # (B, functions) per-function rewards, NaN where a function returned None
    rewards: torch.Tensor  # (B,) weighted sum
    advantages: torch.Tensor  # (B,)
    group_std: torch.Tensor  # (groups,)
    truncated: torch.Tensor  # (B,) bool: cut at max_completion_length
    lengths: torch.Tensor  # (B,) float completion lengths in tokens


def rollout_metrics(b: ScoredBatch, error_counts: dict[str, int]) -> dict[str, float]:
    """The reward, reward-spread and length metrics of a batch (plus `completion_tokens`, for throughput)."""
    G = len(b.groups[0].completions)
    m: dict[str, float] = {
        "reward": b.rewards.mean().item(),
        "reward_std": b.rewards.view(-1, G).std(dim=1).mean().item(),
        "frac_reward_zero_std": torch.isclose(b.group_std, torch.zeros_like(b.group_std)).float().mean().item(),
        "completions/mean_length": b.lengths.mean().item(),
        "completions/min_length": b.lengths.min().item(),
        "completions/max_length": b.lengths.max().item(),
        "completions/clipped_ratio": b.truncated.float().mean().item(),
        "completion_tokens": float(b.lengths.sum().item()),
    }
    per_fn = torch.from_numpy(b.matrix)
    for j, name in enumerate(b.names):
        col = per_fn[:, j]
        ok = ~torch.isnan(col)
        m[f"rewards/{name}/mean"] = col[ok].mean().item() if ok.any() else math.nan
        m[f"rewards/{name}/std"] = col[ok].std().item() if ok.sum() > 1 else 0.0
        m[f"rewards/{name}/errors"] = float(error_counts.get(name, 0))
    return m


def sample_rows(b: ScoredBatch, rows: list[dict[str, Any]], data: DataSection) -> list[dict[str, Any]]:
    """One `samples.jsonl` row per completion (step and rollout are added when written)."""
    G = len(b.groups[0].completions)
    out = []
    reward_list, adv_list, truncated_list = b.rewards.tolist(), b.advantages.tolist(), b.truncated.tolist()  # one sync each
    length_list = b.lengths.tolist()
    for i, c in enumerate(c for g in b.groups for c in g.completions):
        group = b.groups[i // G]
        row = rows[group.row]
        sample: dict[str, Any] = {
            "group": i // G, "prompt": group.prompt.text, "completion": c.text, "solution": row.get("solution"),
            "rewards": {n: (None if math.isnan(v) else float(v)) for n, v in zip(b.names, b.matrix[i])},
            "reward": reward_list[i], "advantage": adv_list[i], "length": int(length_list[i]), "truncated": truncated_list[i],
        }
        sample.update(sample_fields(c.episode))  # an episode, turn by turn (docs/agent.md)
        if i % G in group.replayed:  # the studio marks it: sampled at an earlier step
            sample["replayed"] = True
        # the studio shows each group's picture, video (its file or first frame) or audio beside it
        for key, column in (("images", data.images_column), ("videos", data.videos_column), ("audios", data.audios_column)):
            if column:
                sample[key] = media_ref(row.get(column))
        out.append(sample)
    return out


class UnscoredRewards:
    """Reward functions that scored nothing in a whole batch: they give no signal, and status.json says so (the
    dashboard shows it), not only a NaN metric. `state`: name -> (first rollout, batches)."""

    def __init__(self) -> None:
        self.state: dict[str, tuple[int, int]] = {}

    def note(self, b: ScoredBatch, rollout_index: int) -> None:
        for j, name in enumerate(b.names):
            if np.isnan(b.matrix[:, j]).all():
                first, count = self.state.get(name, (rollout_index, 0))
                self.state[name] = (first, count + 1)

    def warnings(self) -> list[str]:
        return [f"reward {name!r} returned None for every completion in {count} rollout batch(es), first in rollout "
                f"{first}: it adds no learning signal (does the data have the columns it reads?)"
                for name, (first, count) in sorted(self.state.items())]


@dataclass
class StepClock:
    """The seconds of one optimizer step, as the loop measured them."""

    started: float = field(default_factory=time.time)
    train_s: float = 0.0  # optimizer_step, wall clock
    forward_backward_s: float = 0.0
    optimizer_s: float = 0.0
    weight_sync_s: float = 0.0


def step_timing(ro: Rollout, first: bool, clock: StepClock) -> dict[str, float]:
    """The `timing/*` metrics of a step. The rollout's own seconds (sampling, rewards, the old/reference logprob
    passes, async waits, each pool instance) belong to its first update only."""
    own = ro.timings if first else {}
    prep = own.get("prep_s", 0.0)
    timing = {
        "timing/rollout_s": own.get("rollout_s", 0.0),
        "timing/reward_s": own.get("reward_s", 0.0),
        "timing/train_s": clock.train_s + prep,
        "timing/forward_backward_s": clock.forward_backward_s + prep,
        "timing/optimizer_s": clock.optimizer_s,
        "timing/weight_sync_s": clock.weight_sync_s + own.get("weight_sync_s", 0.0),
        "timing/step_s": time.time() - clock.started,
    }
    timing.update({k: v for k, v in own.items() if k.startswith("timing/")})
    if "rollout_wait_s" in own:
        timing["timing/rollout_wait_s"] = own["rollout_wait_s"]
    return timing


def metrics_row(step: int, elapsed_s: float, ro: Rollout, train: dict[str, float], timing: dict[str, float],
                extra: dict[str, float]) -> dict[str, Any]:
    """The step's `metrics.jsonl` line: the batch's metrics, the update's, timing, throughput, staleness, and
    `extra` (async counters, telemetry, evaluation)."""
    row: dict[str, Any] = {"step": step, "time": time.time(), "elapsed_s": elapsed_s, "rollout": ro.index}
    row.update({k: v for k, v in ro.metrics.items() if k != "completion_tokens"})
    row.update(train)
    row.update(timing)
    tokens = ro.metrics["completion_tokens"]
    row["completions/tokens"] = tokens  # the rollout's count, so no reader rebuilds it from the rate
    row["throughput/completion_tokens_per_s"] = tokens / max(timing["timing/step_s"], 1e-9)
    row["staleness"] = float(step - 1 - ro.policy_version)
    row.update(extra)
    return row


def robust_step_s(durations: list[float], period: int = 1) -> float:
    """Seconds per step from recent step durations, robust to a few slow (or fast) steps.

    The median, not the mean: one slow step (a long rollout, a checkpoint flush, the page cache, another
    process on the machine) moves a window's mean by outlier/window, a 300 s step among 1 s steps by 15x, and
    the ETA then swings from minutes to an hour and back; the median moves by at most one rank. With
    `period` > 1 (num_iterations: a rollout's first step samples and scores, the others only train) the
    steps do not share one typical duration, so the median is taken over blocks of `period` consecutive
    steps, counted back from the newest (each block holds exactly one sampling step), as each block's
    mean: the rate of whole rollouts. Fewer durations than one block: their mean. None: 0.0."""
    xs = [float(d) for d in durations if d == d and d >= 0]  # NaN and negative clocks are not durations
    period = max(1, int(period))
    if len(xs) < period:
        return sum(xs) / len(xs) if xs else 0.0
    blocks = [sum(xs[i - period:i]) / period for i in range(len(xs), period - 1, -period)]
    return float(np.median(blocks))


class Eta:
    """Seconds left: a robust recent rate (`robust_step_s` over the last `window` steps) times the steps left.

    The first step this process times is left out once a second one is timed: it carries the warm-up (the
    engine's first call, kernel compilation, allocator growth) that no later step repeats."""

    def __init__(self, window: int = 20, period: int = 1) -> None:
        self.period = max(1, int(period))
        self.recent: deque[float] = deque(maxlen=max(window, 3 * self.period))
        self.timed = 0

    def update(self, step_s: float, steps_left: int) -> float:
        if self.timed == 1:
            self.recent.clear()  # the warm-up step
        self.timed += 1
        self.recent.append(step_s)
        return steps_left * robust_step_s(list(self.recent), self.period)
