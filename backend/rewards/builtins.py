"""Built-in reward functions. Each docstring states its formula."""

from __future__ import annotations

from typing import Any

from backend.rewards.registry import builtin


def _text(c: Any) -> str:
    # Conversational completions arrive as [{"role": "assistant", "content": ...}].
    if isinstance(c, list):
        return "".join(m.get("content", "") for m in c if isinstance(m, dict))
    return str(c)


@builtin("exact_match")
def exact_match(completions: list[Any], prompts: list[Any], solution: list[Any] | None = None,
                **_: Any) -> list[float | None]:
    """1 if the completion, stripped of surrounding white space, equals the solution exactly, else 0.
    None where the row has no solution."""
    sols = solution or [None] * len(completions)
    return [None if s is None else float(_text(c).strip() == str(s).strip()) for c, s in zip(completions, sols)]


@builtin("digit_match")
def digit_match(completions: list[Any], prompts: list[Any], solution: list[Any] | None = None,
                **_: Any) -> list[float | None]:
    """Positional character agreement: #{i : c[i] == s[i]} / max(len(c), len(s)) on stripped strings,
    so missing or extra characters cost. Partial credit that gives GRPO a gradient before exact answers."""
    sols = solution or [None] * len(completions)
    out: list[float | None] = []
    for c, s in zip(completions, sols):
        if s is None:
            out.append(None)
            continue
        c, s = _text(c).strip(), str(s).strip()
        width = max(len(c), len(s))
        out.append(sum(x == y for x, y in zip(c, s)) / width if width else 1.0)
    return out
