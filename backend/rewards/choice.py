"""Multiple-choice reward (GPQA-style questions with lettered options)."""

from __future__ import annotations

import re
from typing import Any

from backend.rewards.registry import builtin
from backend.rewards.text import answer_tag, completion_text, last_boxed, normalize_unicode

_STATED = re.compile(r"answer\s*(?:is|:)?\s*[:：]?\s*\(?\**\s*([A-J])\b", re.IGNORECASE)
_LONE = re.compile(r"(?<![A-Za-z])\(?([A-J])\)?(?![A-Za-z])")


def choice_letter(text: str) -> str | None:
    """The chosen option letter: the <answer> tag's or the last \\boxed{}'s letter, else the last
    "answer is (X)" / "Answer: X", else the last lone capital letter A-J; None when there is none."""
    t = normalize_unicode(text)
    for region in (answer_tag(t), last_boxed(t)):
        if region is not None:
            m = _LONE.search(region.strip().upper())
            return m.group(1).upper() if m else None
    stated = _STATED.findall(t)
    if stated:
        return stated[-1].upper()
    lone = [m.group(1) for m in _LONE.finditer(t) if m.group(1).isupper()]
    return lone[-1] if lone else None


@builtin("multiple_choice", needs=("solution",), kinds={"solution": ("text",)})
def multiple_choice(completions: list[Any], prompts: list[Any] | None = None, solution: list[Any] | None = None,
                    **_: Any) -> list[float | None]:
    """1 if the chosen letter (see choice_letter: <answer>, \\boxed{}, "answer is X", last lone capital)
    equals the solution letter, else 0. None where the solution is not a single letter A-J."""
    sols = solution or [None] * len(completions)
    out: list[float | None] = []
    for c, s in zip(completions, sols, strict=True):
        gold = str(s).strip().strip("()").upper() if s is not None else ""
        if not re.fullmatch(r"[A-J]", gold):
            out.append(None)
            continue
        out.append(float(choice_letter(completion_text(c)) == gold))
    return out
