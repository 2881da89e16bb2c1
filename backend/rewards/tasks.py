"""Task rewards: Countdown (reach a target with the given numbers) and CLEVR-style counting."""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from backend.rewards.registry import builtin
from backend.rewards.text import answer_tag, completion_text, normalize_unicode

MAX_EQUATION_CHARS = 512  # a Countdown equation is short; longer input is not an answer (and bounds ast's work)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class _NotAllowed(ValueError):
    pass


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Exact value of an expression made of integer literals, + - * / and parentheses; anything else
    (names, calls, powers, unary minus, floats) raises _NotAllowed. Division by zero raises ZeroDivisionError."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left, used), _evaluate(node.right, used))
    raise _NotAllowed(type(node).__name__)


def countdown_equation(text: str) -> tuple[Fraction, list[int]] | None:
    """Parse an equation like "(25 - 5) × 3 = 60" (the "= target" part is optional and ignored):
    (value, numbers used), or None when it is not a well-formed + - × ÷ expression or divides by zero.
    Parsed with ast and evaluated on the tree with exact fractions, never eval()."""
    expr = normalize_unicode(text).replace("x", "*").replace("X", "*")
    if expr.count("=") > 1:
        return None
    expr = expr.split("=")[0].strip()
    if not expr or len(expr) > MAX_EQUATION_CHARS or not re.fullmatch(r"[\d+\-*/().\s]+", expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval")
        used: list[int] = []
        return _evaluate(tree.body, used), used
    except (SyntaxError, _NotAllowed, ZeroDivisionError, RecursionError, MemoryError, ValueError):
        return None


class CountdownParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nums_column: str = Field("nums", description="Dataset column with the list of given numbers.")
    target_column: str = Field("target", description="Dataset column with the target number.")
    format_score: float = Field(0.0, ge=-10.0, le=10.0,
                                description="Reward for a well-formed equation in <answer> that misses "
                                            "(TinyZero uses 0.1; 0 = plain 1/0).")


@builtin("countdown", CountdownParams, needs=lambda p: (p.nums_column, p.target_column),
         kinds=lambda p: {p.nums_column: ("list of int values", "list of float values", "list of text values"),
                          p.target_column: ("int", "float", "text")})  # int(x) of each number, Fraction(str(target))
def countdown(completions: list[Any], prompts: list[Any] | None = None, *, nums_column: str = "nums",
              target_column: str = "target", format_score: float = 0.0, **columns: Any) -> list[float | None]:
    """1 if the equation in the last <answer>…</answer> uses each number of `nums` exactly once, only
    + - × ÷ and parentheses, and equals `target` exactly (rational arithmetic); format_score if it is a
    well-formed equation that misses; else 0 (no tag, other numbers, division by zero).
    None where the row has no nums/target. Columns as in Jiayi-Pan/Countdown-Tasks-3to4."""
    n = len(completions)
    nums_col, target_col = columns.get(nums_column) or [None] * n, columns.get(target_column) or [None] * n
    out: list[float | None] = []
    for c, nums, target in zip(completions, nums_col, target_col, strict=True):
        if nums is None or target is None:
            out.append(None)
            continue
        tagged = answer_tag(completion_text(c))
        parsed = countdown_equation(tagged) if tagged is not None else None
        if parsed is None:
            out.append(0.0)
            continue
        value, used = parsed
        right = sorted(used) == sorted(int(x) for x in nums) and value == Fraction(str(target))
        out.append(1.0 if right else format_score)
    return out


_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WORD = re.compile(r"[a-z]+")


def count_of(text: str) -> float | None:
    """The last number in the text (digits, full-width digits, or an English word up to twenty)."""
    t = normalize_unicode(text).lower()
    nums = _NUMBER.findall(t)
    if nums:
        return float(nums[-1])
    words = [_WORDS[w] for w in _WORD.findall(t) if w in _WORDS]
    return float(words[-1]) if words else None


@builtin("counting", needs=("solution",))
def counting(completions: list[Any], prompts: list[Any] | None = None, solution: list[Any] | None = None,
             **_: Any) -> list[float | None]:
    """1 if the count in <answer>…</answer> (its last number, digits or words) equals the `solution` count,
    else 0 (also 0 without the tag). The solution may itself be "<answer> 3 </answer>" (R1-V/CLEVR
    style), "3" or 3. None where the solution holds no count."""
    sols = solution if solution is not None else [None] * len(completions)
    out: list[float | None] = []
    for c, s in zip(completions, sols, strict=True):
        if isinstance(s, (int, float)) and not isinstance(s, bool):
            gold: float | None = float(s)
        else:
            st = "" if s is None else completion_text(s)
            gold = count_of(answer_tag(st) or st)
        if gold is None:
            out.append(None)
            continue
        tagged = answer_tag(completion_text(c))
        pred = count_of(tagged) if tagged is not None else None
        out.append(float(pred is not None and pred == gold))
    return out


@builtin("env_reward")
def env_reward(completions: list[Any], prompts: list[Any] | None = None, *, env_reward: list[Any] | None = None,
               **_: Any) -> list[float | None]:
    """The environment's reward of each episode: the sum of the rewards its step() returned (docs/agent.md).
    None where the environment gave none (and for runs without an environment)."""
    vals = env_reward if env_reward is not None else [None] * len(completions)
    return [None if v is None else float(v) for v in vals]
