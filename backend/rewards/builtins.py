"""Built-in reward functions. Each docstring states its formula.

Every built-in has the TRL signature `fn(completions, prompts, **columns) -> list[float | None]`
(its parameters from RunSpec arrive as keyword arguments), so the same function runs in the trainer
or in the reward worker. Math rewards live in math_rewards.py, task rewards (countdown, counting)
in tasks.py, the reward-model kind in reward_model.py; each module registers its own when imported, and
the package (backend/rewards/__init__.py) imports them all once.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backend.rewards.registry import builtin
from backend.rewards.text import completion_text, lengths

_STRING_LIKE = {"solution": ("text", "blank", "int")}  # compared as str(solution): 2.0 would read "2.0"


@builtin("exact_match", needs=("solution",), kinds=_STRING_LIKE)
def exact_match(completions: list[Any], prompts: list[Any] | None = None, solution: list[Any] | None = None,
                **_: Any) -> list[float | None]:
    """1 if the completion, stripped of surrounding white space, equals the solution exactly, else 0.
    None where the row has no solution."""
    sols = solution or [None] * len(completions)
    return [None if s is None else float(completion_text(c).strip() == str(s).strip())
            for c, s in zip(completions, sols, strict=True)]


@builtin("digit_match", needs=("solution",), kinds=_STRING_LIKE)
def digit_match(completions: list[Any], prompts: list[Any] | None = None, solution: list[Any] | None = None,
                **_: Any) -> list[float | None]:
    """Positional character agreement: #{i : c[i] == s[i]} / max(len(c), len(s)) on stripped strings,
    so missing or extra characters cost. Partial credit that gives GRPO a gradient before exact answers."""
    sols = solution or [None] * len(completions)
    out: list[float | None] = []
    for c, s in zip(completions, sols, strict=True):
        if s is None:
            out.append(None)
            continue
        c, s = completion_text(c).strip(), str(s).strip()
        width = max(len(c), len(s))
        out.append(sum(x == y for x, y in zip(c, s, strict=False)) / width if width else 1.0)
    return out


_FORMAT = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


@builtin("format")
def format_(completions: list[Any], prompts: list[Any] | None = None, **_: Any) -> list[float | None]:
    """1 if the completion is <think>…</think> then <answer>…</answer> and nothing else (white space
    allowed around and between the blocks), each tag exactly once; else 0."""
    out: list[float | None] = []
    for c in completions:
        t = completion_text(c)
        # the count check stops ".*?" from swallowing a second block, e.g. "...</answer><answer>..."
        ok = _FORMAT.fullmatch(t) is not None and all(t.count(tag) == 1 for tag in _TAGS)
        out.append(float(ok))
    return out


_REACT = re.compile(r"^<think>.*?</think>\s*Action:.*?Action Input:.*?$", re.DOTALL | re.MULTILINE)


@builtin("react_format")
def react_format(completions: list[Any], prompts: list[Any] | None = None, **_: Any) -> list[float | None]:
    """ms-swift's react_format: 1 if the completion starts with <think>…</think>, then 'Action:' and later
    'Action Input:' (its pattern `^<think>.*?</think>\\s*Action:.*?Action Input:.*?$`, dot matching newlines),
    else 0."""
    return [float(_REACT.match(completion_text(c)) is not None) for c in completions]


@builtin("tag_count")
def tag_count(completions: list[Any], prompts: list[Any] | None = None, **_: Any) -> list[float | None]:
    """0.25 for each of <think>, </think>, <answer>, </answer> that occurs exactly once (0 to 1).
    A softer format signal than `format`, from open-r1."""
    return [sum(0.25 for tag in _TAGS if completion_text(c).count(tag) == 1) for c in completions]


class RepetitionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ngram_size: int = Field(3, ge=1, le=64, description="n of the n-grams compared.")
    max_penalty: float = Field(-1.0, le=0.0, description="Reward when every n-gram is a repeat (<= 0).")
    unit: Literal["word", "char"] = Field(
        "word", description="n-grams of white-space separated words, or of characters (for text without spaces, "
                            "e.g. Chinese).")


@builtin("repetition", RepetitionParams)
def repetition(completions: list[Any], prompts: list[Any] | None = None, *, ngram_size: int = 3,
               max_penalty: float = -1.0, unit: str = "word", **_: Any) -> list[float | None]:
    """N-gram repetition penalty (open-r1, after Yeo et al. 2025):
    r = max_penalty * (1 - #distinct n-grams / #n-grams), on lower-cased words (or characters);
    0 when the completion has fewer than n units."""
    out: list[float | None] = []
    for c in completions:
        t = completion_text(c).lower()
        units = t.split() if unit == "word" else [ch for ch in t if not ch.isspace()]
        total = len(units) - ngram_size + 1
        if total <= 0:
            out.append(0.0)
            continue
        distinct = len({tuple(units[i:i + ngram_size]) for i in range(total)})
        out.append((1.0 - distinct / total) * max_penalty + 0.0)  # + 0.0 turns -0.0 into 0.0
    return out


class SoftOverlongParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_completion_len: int = Field(ge=1, description="L_max: the generation limit (tokens, or characters "
                                                      "when completion_ids are not passed).")
    cache_len: int = Field(ge=0, description="Soft zone before L_max where the penalty ramps from 0 to -1.")

    @field_validator("cache_len")
    @classmethod
    def _below_max(cls, v: int, info: Any) -> int:
        top = info.data.get("max_completion_len")
        if top is not None and v >= top:
            raise ValueError(f"must be smaller than max_completion_len ({top})")
        return v


@builtin("soft_overlong", SoftOverlongParams)
def soft_overlong(completions: list[Any], prompts: list[Any] | None = None,
                  completion_ids: list[list[int]] | None = None, *, max_completion_len: int = 1, cache_len: int = 0,
                  **_: Any) -> list[float | None]:
    """DAPO soft overlong punishment, with L_max = max_completion_len and c = cache_len:
    r = 0 if L <= L_max - c; (L_max - c - L) / c if L_max - c < L <= L_max; -1 if L > L_max.
    L = len(completion_ids) when passed (tokens, as in DAPO), else the completion's characters."""
    start = max_completion_len - cache_len
    out: list[float | None] = []
    for L in lengths(completions, completion_ids):
        if L <= start:
            out.append(0.0)
        elif L <= max_completion_len:
            out.append((start - L) / cache_len)
        else:
            out.append(-1.0)
    return out
