"""Score completions with the RunSpec's reward functions.

Returns an (N, F) float matrix with NaN where a function returned None; `combine_rewards`
then weights and sums it. Output shape and values are checked so a broken reward fails with
a message that names the function and the first offending sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from backend.rewards.registry import BUILTIN_REWARDS
from backend.spec import RewardsSection


class RewardError(RuntimeError):
    pass


def columns_for(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Per-completion rows -> {column: values}, the keyword arguments of a TRL reward function."""
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    return {k: [r.get(k) for r in rows] for k in keys}


def check_scores(name: str, scores: Any, n: int) -> list[float]:
    """Validate one function's output: a list of n numbers or None, no NaN or inf."""
    if not isinstance(scores, (list, tuple)):
        raise RewardError(f"reward {name!r} returned {type(scores).__name__}, expected a list of {n} floats")
    if len(scores) != n:
        raise RewardError(f"reward {name!r} returned {len(scores)} scores for {n} completions")
    out = []
    for i, s in enumerate(scores):
        if s is None:
            out.append(math.nan)
            continue
        try:
            v = float(s)
        except (TypeError, ValueError):
            raise RewardError(f"reward {name!r} sample {i}: {s!r} is not a number") from None
        if not math.isfinite(v):
            raise RewardError(f"reward {name!r} sample {i}: {v} is not finite")
        out.append(v)
    return out


class RewardScorer:
    """In-process scorer for built-in reward functions."""

    def __init__(self, rewards: RewardsSection, base_dir: Path = Path("."), device: str = "cpu"):
        self.error_counts: dict[str, int] = {}
        self.names = [f.name for f in rewards.functions]
        self.weights = np.array([f.weight for f in rewards.functions], dtype=np.float32)
        self._fns: list[Callable[..., Any]] = []
        for f in rewards.functions:
            if f.name not in BUILTIN_REWARDS:
                raise RewardError(f"unknown reward {f.name!r}")
            self._fns.append(BUILTIN_REWARDS[f.name].bind(f.params))

    def score(self, prompts: list[str], completions: list[str], rows: list[dict[str, Any]]) -> np.ndarray:
        cols = columns_for(rows)
        cols.pop("prompt", None)
        cols.pop("completions", None)
        out = np.empty((len(completions), len(self._fns)), dtype=np.float32)
        for j, (name, fn) in enumerate(zip(self.names, self._fns)):
            try:
                scores = fn(completions, prompts, **cols)
            except RewardError:
                raise
            except Exception as err:
                raise RewardError(f"reward {name!r} raised {type(err).__name__}: {err}") from err
            out[:, j] = check_scores(name, scores, len(completions))
        return out

    def close(self) -> None:
        pass
