"""Greedy evaluation: one deterministic completion per held-out row, scored by the run's reward functions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from backend.data import render_prompt
from backend.rollout.base import PromptInput, RolloutEngine, SamplingParams
from backend.spec import DataSection


def greedy_eval(engine: RolloutEngine, tokenizer: Any, rows: list[dict[str, Any]], data: DataSection, scorer: Any,
                max_tokens: int, prompts: list[tuple[str, list[int]] | tuple[str, list[int], dict | None]] | None = None
                ) -> dict[str, float]:
    """Returns eval/reward (weighted sum, mean over rows) and eval/rewards/<fn>/mean.

    `prompts` (text, token ids[, image inputs]) per row, as the trainer renders them; else rendered here (text only)."""
    if not rows:
        return {}
    if prompts is None:
        texts = [render_prompt(r, data, tokenizer) for r in rows]
        prompts = [(t, tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    groups = engine.generate([PromptInput(p[1], (p[2] if len(p) > 2 else None) or {}) for p in prompts],
                             SamplingParams(n=1, max_tokens=max_tokens, top_k=1, seed=0))
    mat = scorer.score([p[0] for p in prompts], [g[0].text for g in groups], rows)
    out = {"eval/reward": float(np.nansum(mat * scorer.weights[None, :], axis=1).mean())}
    for j, name in enumerate(scorer.names):
        col = mat[:, j]
        out[f"eval/rewards/{name}/mean"] = float(np.nanmean(col)) if not np.isnan(col).all() else math.nan
    return out
