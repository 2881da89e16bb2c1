"""Test a RunSpec's rewards on a few dataset rows, before launching a run.

Completions are the rows' own solutions (through a template, so format rewards can be checked too:
"<think>…</think><answer>{solution}</answer>"), and/or completions sampled from the spec's model: with tools or an
environment (the spec's `tools` section), whole episodes played as the trainer plays them, scored as the trainer
scores them (built-ins on the final answer, plugins on the chat messages, the `tool_calls` / `env_reward` columns).
Everything is scored in the reward worker (isolate_builtins=True), so a caller in the studio never
runs reward code in its own process, and failures are reported per function instead of raised.

    check_rewards(spec, rows=8, plugin="my_rewards.py")  -> [{"function": ..., "mean": ..., ...}, ...]
    run_check(...)                                        -> CheckResult(functions=[...], samples=[...])
    python -m backend.rewards check --spec RUN.yaml [--plugin FILE] [--rows N] [--completions solution,model]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from backend.agent.episodes import sample_fields
from backend.rewards.plugins import read_plugin
from backend.rewards.registry import BUILTIN_REWARDS
from backend.rewards.scorer import RewardScorer
from backend.spec import RewardFunction, RunSpec

SOURCES = ("solution", "model")


@dataclass
class CheckResult:
    functions: list[dict[str, Any]] = field(default_factory=list)  # one per (source, function), then the sum
    samples: list[dict[str, Any]] = field(default_factory=list)  # one per scored completion


def _rewards_with_plugins(spec: RunSpec, plugins: list[str], base_dir: Path) -> Any:
    """The spec's rewards, plus each extra plugin file and its reward functions not already listed."""
    rewards = spec.rewards.model_copy(deep=True)
    rewards.on_error = "skip"  # report failures in the table rather than stop at the first
    names = [f.name for f in rewards.functions]
    for p in plugins:
        if p not in rewards.plugins:
            rewards.plugins = [*rewards.plugins, p]
        path = Path(p) if Path(p).is_absolute() else base_dir / p
        for name in read_plugin(path)[1]:
            if name not in names:
                names.append(name)
                rewards.functions = [*rewards.functions, RewardFunction(name=name)]
    return rewards


def _prompts(spec: RunSpec, rows: list[dict[str, Any]], base_dir: Path, tokenizer: Any) -> list[str]:
    from backend.data import render_prompt

    out = []
    for r in rows:
        try:
            out.append(render_prompt(r, spec.data, tokenizer))
        except Exception:  # no tokenizer here (hub model offline): the raw prompt is enough to score
            p = r.get(spec.data.prompt_column, "")
            out.append(p if isinstance(p, str) else str(p))
    return out


def _has_chat_template(spec: RunSpec, base_dir: Path) -> bool:
    """Whether rendering prompts may need the tokenizer's chat template. For a local model directory
    this reads its files, sparing the studio the import of transformers (and torch) for a quick check."""
    import json

    from backend.data import is_hub_id

    if spec.data.chat_template == "off":
        return False
    ref = spec.model.name_or_path
    path = Path(ref) if Path(ref).is_absolute() else base_dir / ref
    if is_hub_id(ref) or not path.is_dir():
        return True
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((path / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return True


def _tokenizer(spec: RunSpec, base_dir: Path) -> Any:
    try:
        from backend.models import spec_tokenizer

        return spec_tokenizer(spec, base_dir)
    except Exception:
        return None


def _fill(template: str, row: dict[str, Any]) -> str:
    try:
        return template.format_map({**row, "solution": row.get("solution", "")})
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"completion template {template!r}: {err!r} is not a column "
                         f"(columns: {', '.join(sorted(row))})") from None


@dataclass
class Sampled:
    """The model's completions of the check's prompts: what the scorer takes of them (an episode's final answer,
    its rows with `tool_calls` / `env_reward`, its chat messages for plugins) and the episodes for the samples."""
    texts: list[str]
    ids: list[list[int]]
    rows: list[dict[str, Any]]
    conversations: list[list[dict[str, Any]]] | None = None
    episodes: list[Any] = field(default_factory=list)


def _model_completions(spec: RunSpec, base_dir: Path, tokenizer: Any, rows: list[dict[str, Any]], device: str
                       ) -> Sampled:
    """One sampled completion per row from the spec's model, with the spec's sampling settings; with tools or an
    environment (spec.tools), one episode per row, played as the trainer plays them (backend.agent)."""
    import torch

    from backend.agent import Agent, context_window
    from backend.agent.episodes import score_inputs
    from backend.data import render_prompt
    from backend.models import load_base
    from backend.rollout.base import PromptInput, SamplingParams
    from backend.rollout.hf import HFEngine

    if tokenizer is None:
        raise RuntimeError(f"cannot load the tokenizer of {spec.model.name_or_path}")
    model = load_base(spec, base_dir, torch.device(device)).eval()
    r = spec.rollout
    sampling = SamplingParams(n=1, max_tokens=r.max_completion_length, temperature=r.temperature, top_p=r.top_p,
                              top_k=r.top_k, seed=spec.algorithm.seed)
    engine = HFEngine(model, tokenizer, max_batch=64)
    if not spec.tools.enabled:
        prompts = _prompts(spec, rows, base_dir, tokenizer)
        ids = [PromptInput(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
        flat = [g[0] for g in engine.generate(ids, sampling)]
        return Sampled([c.text for c in flat], [list(c.token_ids) for c in flat], rows)
    agent = Agent.of_run(spec, tokenizer, base_dir, context_window(model))
    try:
        def prompt_ids(row: dict[str, Any], observation: str | None = None) -> PromptInput:
            text = render_prompt(row, spec.data, tokenizer, agent.schemas or None, observation)
            return PromptInput(tokenizer(text, add_special_tokens=False)["input_ids"])

        flat = [g[0] for g in agent.runner.run(engine, [prompt_ids(row) for row in rows], sampling, rows,
                                                lambda k, obs: prompt_ids(rows[k], obs))]
    finally:
        agent.close()
    texts, scored_rows, chats = score_inputs(flat, rows)
    return Sampled(texts, [list(c.token_ids) for c in flat], scored_rows, chats, [c.episode for c in flat])


def _placement(name: str) -> str:
    """Where the function runs during training (everything runs in the worker during the check)."""
    b = BUILTIN_REWARDS.get(name)
    return "trainer" if b is not None and not b.isolate else "worker"


def _summary(source: str, name: str, weight: float | None, where: str, col: np.ndarray, errors: int, error: str,
             seconds: float | None) -> dict[str, Any]:
    scored = col[~np.isnan(col)]
    stat = (lambda f: float(f(scored)) if scored.size else None)
    return {"source": source, "function": name, "weight": weight, "where": where, "n": int(col.size),
            "scored": int(scored.size), "mean": stat(np.mean), "std": stat(np.std), "min": stat(np.min),
            "max": stat(np.max), "errors": errors, "error": error, "seconds": seconds}


def run_check(spec: RunSpec, rows: int = 8, plugin: str | list[str] | None = None,
              completions: str | list[str] = "solution", template: str = "{solution}",
              base_dir: str | Path = ".", device: str = "cpu") -> CheckResult:
    """Score `rows` dataset rows with the spec's rewards (plus `plugin` files' functions). `completions`:
    "solution" (the row's solution through `template`, a str.format over the row's columns), "model"
    (one sample per prompt from the spec's model, on `device`), or both."""
    from backend.data import load_rows

    base = Path(base_dir)
    plugins = [plugin] if isinstance(plugin, str) else list(plugin or [])
    sources = [completions] if isinstance(completions, str) else list(completions)
    bad = [s for s in sources if s not in SOURCES]
    if bad:
        raise ValueError(f"completions must be among {SOURCES}, got {bad}")
    rewards = _rewards_with_plugins(spec, plugins, base)
    data = load_rows(spec.data.sources, spec.data, spec.algorithm.seed, base)[: max(rows, 1)]
    tokenizer = _tokenizer(spec, base) if "model" in sources or _has_chat_template(spec, base) else None
    prompts = _prompts(spec, data, base, tokenizer)

    result = CheckResult()
    with RewardScorer(rewards, base, device, isolate_builtins=True) as scorer:
        for source in sources:
            if source == "solution":
                sampled = Sampled([_fill(template, r) for r in data], [], data)
            else:
                sampled = _model_completions(spec, base, tokenizer, data, device)
            texts = sampled.texts
            before = dict(scorer.error_counts)
            t0 = time.perf_counter()
            matrix = scorer.score(prompts, texts, sampled.rows, completion_ids=sampled.ids or None,
                                  conversations=sampled.conversations)
            total_s = time.perf_counter() - t0
            for j, name in enumerate(scorer.names):
                failed = scorer.error_counts[name] - before[name]
                error = scorer.last_errors.get(name, "") if failed else ""
                result.functions.append(_summary(source, name, float(scorer.weights[j]), _placement(name),
                                                 matrix[:, j], failed, error, scorer.last_timings.get(name)))
            total = np.nansum(matrix * scorer.weights[None, :], axis=1)
            result.functions.append(_summary(source, "(weighted sum)", None, "", total, 0, "", total_s))
            for i, (p, c) in enumerate(zip(prompts, texts, strict=True)):
                result.samples.append({
                    "source": source, "prompt": p, "completion": c, "solution": data[i].get("solution"),
                    "rewards": {n: None if math.isnan(v) else float(v) for n, v in zip(scorer.names, matrix[i],
                                                                                        strict=True)},
                    "reward": float(total[i]),
                    **sample_fields(sampled.episodes[i] if sampled.episodes else None),
                })
    return result


def check_rewards(spec: RunSpec, rows: int = 8, plugin: str | list[str] | None = None, **kwargs: Any
                  ) -> list[dict[str, Any]]:
    """Per-function summaries (see run_check): keys source, function, weight, where (trainer or worker, during
    training), n, scored, mean, std, min, max, errors, error (the last message), seconds. Never raises for a
    failing reward function: see `errors` and `error`."""
    return run_check(spec, rows=rows, plugin=plugin, **kwargs).functions


def format_table(functions: list[dict[str, Any]]) -> str:
    """A plain-text table of check results (one block per completion source)."""
    def num(v: Any) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    head = ("function", "weight", "where", "scored", "mean", "std", "min", "max", "errors", "ms")
    lines: list[str] = []
    for source in dict.fromkeys(f["source"] for f in functions):
        rows = [(f["function"], num(f["weight"]), f["where"], f"{f['scored']}/{f['n']}", num(f["mean"]),
                 num(f["std"]), num(f["min"]), num(f["max"]), str(f["errors"]),
                 "-" if f["seconds"] is None else f"{f['seconds'] * 1000:.1f}")
                for f in functions if f["source"] == source]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
        lines.append(f"completions: {source}")
        for r in (head, *rows):
            lines.append("  " + "  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)).rstrip())
        for f in functions:
            if f["source"] == source and f["error"]:
                lines.append(f"  ! {f['error']}")
    return "\n".join(lines)
