"""Math rewards built on math-verify: accuracy, and the length-shaped cosine and length rewards.

math-verify parses LaTeX and plain expressions into sympy and compares them (fractions, decimals,
sets, intervals, equivalent forms). Its own per-call timeouts use SIGALRM, which only works in the
main thread: elsewhere (a studio thread) they are switched off and the caller's timeout applies.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from backend.rewards.registry import builtin
from backend.rewards.text import answer_tag, completion_text, last_boxed, lengths, normalize_unicode

MV_TIMEOUT_S = 5
_PROSE = re.compile(r"[A-Za-z]{3}")
GOLD_ANSWER_CHARS = 120  # longer solutions are worked solutions, not bare answers


def _timeout() -> int | None:
    return MV_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def parse_math(text: str, region: bool = True) -> list[Any]:
    r"""Parse an answer with math-verify; [] when nothing parses.

    A region (the inside of <answer> or \boxed) that is bare LaTeX is wrapped in \boxed{} (math-verify
    ignores unanchored LaTeX such as \dfrac12); plain text is tried as an expression first, so
    "The answer is 3" gives 3 rather than a product of letters. A whole completion is never wrapped:
    math-verify's own anchors ($…$, "the answer is", the last number) find the answer in prose, and
    parsing paragraphs as LaTeX would be slow and wrong."""
    from math_verify import parse

    text = normalize_unicode(text).strip()
    if not text:
        return []
    t = _timeout()
    if not region or any(a in text for a in ("$", "\\boxed", "\\fbox", "\\(", "\\[")):
        tries = [text]
    elif "\\" in text:
        tries = [f"\\boxed{{{text}}}", text]
    elif _PROSE.search(text):
        tries = [text]  # as LaTeX, words would become products of letters
    else:
        tries = [text, f"\\boxed{{{text}}}"]  # "B", "x^2+1": math-verify reads them only as LaTeX
    for s in tries:
        try:
            got = parse(s, parsing_timeout=t)
        except Exception:  # a parser bug on odd input is "no answer", not a crashed reward
            got = []
        if got:
            return got
    return []


def answer_region(completion: str) -> tuple[str, bool]:
    r"""What accuracy compares, and whether it is an extracted region: the last <answer>…</answer>,
    else the last \boxed{…}, else the whole completion."""
    tagged = answer_tag(completion)
    if tagged is not None:
        return tagged, True
    boxed = last_boxed(completion)
    return (boxed, True) if boxed is not None else (completion, False)


def gold_of(solution: Any) -> list[Any]:
    """Parsed reference answer; [] when it cannot be parsed. Numbers are accepted as they are. A short
    one-line solution is an answer ("80\\sqrt{34}"); a longer text is a worked solution whose answer
    math-verify finds itself (its \\boxed{}, or its last expression)."""
    if solution is None:
        return []
    text = completion_text(solution) if not isinstance(solution, (int, float)) else repr(solution)
    tagged = answer_tag(text)
    if tagged is not None:
        return parse_math(tagged)
    return parse_math(text, region="\n" not in text.strip() and len(text) <= GOLD_ANSWER_CHARS)


def correctness(completions: Sequence[Any], solutions: Sequence[Any]) -> list[bool | None]:
    """Per completion: True/False, or None where the gold does not parse. The gold is parsed once per
    distinct solution (a group of G completions shares one)."""
    from math_verify import verify

    golds: dict[str, list[Any]] = {}
    out: list[bool | None] = []
    t = _timeout()
    for c, s in zip(completions, solutions, strict=True):
        key = repr(s)
        if key not in golds:
            golds[key] = gold_of(s)
        gold = golds[key]
        if not gold:
            out.append(None)
            continue
        pred = parse_math(*answer_region(completion_text(c)))
        try:
            out.append(bool(pred) and bool(verify(gold, pred, timeout_seconds=t)))
        except Exception:
            out.append(False)
    return out


def _solutions(solution: list[Any] | None, n: int) -> list[Any]:
    return list(solution) if solution is not None else [None] * n


@builtin("accuracy", isolate=True, needs=("solution",))
def accuracy(completions: list[Any], prompts: list[Any] | None = None, solution: list[Any] | None = None,
             **_: Any) -> list[float | None]:
    """1 if math-verify finds the answer equal to the `solution` column, else 0.
    answer = <answer>…</answer> if present, else the last \\boxed{…}, else the whole completion;
    None where the gold answer cannot be parsed (excluded from the mean, not counted as 0)."""
    ok = correctness(completions, _solutions(solution, len(completions)))
    return [None if x is None else float(x) for x in ok]


class CosineParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_value_wrong: float = Field(-1.0, description="Reward of a wrong answer of length 0.")
    max_value_wrong: float = Field(-0.5, description="Reward of a wrong answer of length >= max_len.")
    min_value_correct: float = Field(0.5, description="Reward of a correct answer of length >= max_len.")
    max_value_correct: float = Field(1.0, description="Reward of a correct answer of length 0.")
    max_len: int = Field(1000, ge=1, description="Length at which the cosine reaches its end (tokens or characters).")


@builtin("cosine", CosineParams, isolate=True, needs=("solution",))
def cosine(completions: list[Any], prompts: list[Any] | None = None, solution: list[Any] | None = None,
           completion_ids: list[list[int]] | None = None, *, min_value_wrong: float = -1.0,
           max_value_wrong: float = -0.5, min_value_correct: float = 0.5, max_value_correct: float = 1.0,
           max_len: int = 1000, **_: Any) -> list[float | None]:
    """Cosine length scaling by correctness (Yeo et al. 2025, "Demystifying Long CoT"):
    r = lo + (hi - lo) * (1 + cos(pi * min(L, max_len) / max_len)) / 2, with
    (hi, lo) = (max_value_correct, min_value_correct) when correct: short right answers earn most;
    (hi, lo) = (min_value_wrong, max_value_wrong) when wrong: short wrong answers cost most.
    L = len(completion_ids) when given, else characters. None where the gold cannot be parsed."""
    ok = correctness(completions, _solutions(solution, len(completions)))
    out: list[float | None] = []
    for good, length in zip(ok, lengths(completions, completion_ids), strict=True):
        if good is None:
            out.append(None)
            continue
        hi, lo = (max_value_correct, min_value_correct) if good else (min_value_wrong, max_value_wrong)
        out.append(lo + (hi - lo) * 0.5 * (1.0 + math.cos(math.pi * min(length, max_len) / max_len)))
    return out


@builtin("length", isolate=True, needs=("solution",))
def length(completions: list[Any], prompts: list[Any] | None = None, solution: list[Any] | None = None,
           completion_ids: list[list[int]] | None = None, **_: Any) -> list[float | None]:
    """Length penalty within each prompt's group (Kimi k1.5): lam = 0.5 - (L - L_min) / (L_max - L_min),
    r = lam if correct else min(0, lam); 0 for the whole group when all lengths are equal. Groups are
    completions with the same prompt in the batch; L = len(completion_ids) when given, else characters.
    None where the gold cannot be parsed."""
    n = len(completions)
    ok = correctness(completions, _solutions(solution, n))
    sizes = lengths(completions, completion_ids)
    keys = [repr(p) for p in prompts] if prompts is not None else [""] * n
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out: list[float | None] = [None] * n
    for idx in groups.values():
        lo, hi = min(sizes[i] for i in idx), max(sizes[i] for i in idx)
        for i in idx:
            if ok[i] is None:
                continue
            lam = 0.0 if hi == lo else 0.5 - (sizes[i] - lo) / (hi - lo)
            out[i] = lam if ok[i] else min(0.0, lam)
    return out
