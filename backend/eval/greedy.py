"""Greedy evaluation: one deterministic completion per held-out row, scored by the run's reward functions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from backend.agent.episodes import EpisodeRunner, episode_metrics, score_inputs
from backend.data import render_prompt
from backend.rollout.base import PromptInput, RolloutEngine, SamplingParams
from backend.spec import DataSection


def greedy_eval(engine: RolloutEngine, tokenizer: Any, rows: list[dict[str, Any]], data: DataSection, scorer: Any,
                max_tokens: int, prompts: list[tuple[str, list[int]] | tuple[str, list[int], dict | None]] | None = None,
                episodes: EpisodeRunner | None = None) -> dict[str, float]:
    """Returns eval/reward (weighted sum, mean over rows) and eval/rewards/<fn>/mean; with `episodes` (a run with
    tools or an environment) each row is a greedy episode through the same tool loop, plus its tool metrics.

    `prompts` (text, token ids[, image inputs]) per row, as the trainer renders them; else rendered here (text only)."""
    if not rows:
        return {}
    if prompts is None:
        tools = episodes.tools if episodes is not None else None
        texts = [render_prompt(r, data, tokenizer, tools) for r in rows]
        prompts = [(t, tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    inputs = [PromptInput(p[1], (p[2] if len(p) > 2 else None) or {}) for p in prompts]
    sampling = SamplingParams(n=1, max_tokens=max_tokens, top_k=1, seed=0)
    if episodes is None:
        groups = engine.generate(inputs, sampling)
    else:
        def reprompt(k: int, observation: str) -> PromptInput:
            text = render_prompt(rows[k], data, tokenizer, episodes.tools, observation)
            return PromptInput(tokenizer(text, add_special_tokens=False)["input_ids"])

        groups = episodes.run(engine, inputs, sampling, rows, reprompt)
    flat = [g[0] for g in groups]
    texts, scored_rows, chats = score_inputs(flat, rows)
    mat = scorer.score([p[0] for p in prompts], texts, scored_rows, conversations=chats)
    out = {"eval/reward": float(np.nansum(mat * scorer.weights[None, :], axis=1).mean())}
    for j, name in enumerate(scorer.names):
        col = mat[:, j]
        out[f"eval/rewards/{name}/mean"] = float(np.nanmean(col)) if not np.isnan(col).all() else math.nan
    out.update({f"eval/{k}": v for k, v in episode_metrics([c.episode for c in flat]).items()})
    return out
