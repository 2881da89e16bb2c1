"""Sample-level scores -> evaluation metrics: accuracy, pass@k, majority vote, lengths, truncation.

Definitions (n samples per prompt, c of them correct):
- accuracy: mean over prompts of c / n (the expected pass@1 of one sample).
- pass@k: mean over prompts of 1 - C(n - c, k) / C(n, k), the unbiased estimator of Chen et al. 2021
  ("Evaluating Large Language Models Trained on Code"): the chance that at least one of k samples drawn
  without replacement from the n is correct. Defined for k <= n.
- maj@n: a prompt counts as solved when the most frequent extracted answer among its n samples is
  correct (ties go to the answer seen first). Samples with no extracted answer do not vote.
- mean_length: mean completion tokens; truncation_rate: share of completions that hit max_tokens.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt: 1 - C(n-c, k) / C(n, k), computed as a stable product."""
    if not 0 <= c <= n:
        raise ValueError(f"correct count {c} outside 0..{n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} needs 1 <= k <= n={n} samples per prompt")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Is the plurality answer correct? answers[i] is sample i's extracted answer (None = none)."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(a for a in answers if a is not None and votes[a] == top)  # first seen among the tied
    return bool(correct[answers.index(winner)])


@dataclass(frozen=True)
class PromptResult:
    """One prompt's n samples, as the metrics need them."""
    correct: list[bool]
    answers: list[str | None]
    lengths: list[int]
    truncated: list[bool]
    rewards: list[float]  # weighted total reward per sample


def summarize(results: Sequence[PromptResult], ks: Sequence[int]) -> dict[str, float]:
    """The metrics of the module docstring over prompts with the same n."""
    if not results:
        return {}
    n = len(results[0].correct)
    if any(len(r.correct) != n for r in results):
        raise ValueError("every prompt needs the same number of samples")
    out: dict[str, float] = {"prompts": float(len(results)), "samples_per_prompt": float(n)}
    cs = [sum(r.correct) for r in results]
    out["accuracy"] = float(np.mean([c / n for c in cs]))
    for k in sorted(set(ks)):
        if k > n:
            raise ValueError(f"pass@{k} needs at least {k} samples per prompt (n={n}); raise --n")
        out[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in cs]))
    out[f"maj@{n}"] = float(np.mean([majority_correct(r.answers, r.correct) for r in results]))
    lengths = [x for r in results for x in r.lengths]
    out["mean_length"] = float(np.mean(lengths))
    out["truncation_rate"] = float(np.mean([t for r in results for t in r.truncated]))
    rewards = [x for r in results for x in r.rewards if not math.isnan(x)]
    out["reward"] = float(np.mean(rewards)) if rewards else math.nan
    return out
