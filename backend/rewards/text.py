"""Text helpers shared by the built-in rewards: completion text, tag and \\boxed{} extraction."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Unicode forms models emit that math parsers and ast do not read (NFKC handles full-width digits).
_UNICODE_OPS = str.maketrans({"−": "-", "–": "-", "⁄": "/", "÷": "/", "×": "*", "·": "*", "∗": "*"})


def completion_text(c: Any) -> str:
    """Plain text of a completion: a string, or conversational [{"role": ..., "content": ...}] messages,
    whose content may itself be a list of {"type": "text", "text": ...} parts (multimodal chat)."""
    if isinstance(c, str):
        return c
    if isinstance(c, dict):
        c = [c]
    if isinstance(c, list):
        parts = []
        for m in c:
            content = m.get("content", "") if isinstance(m, dict) else m
            if isinstance(content, list):
                parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
            else:
                parts.append(str(content))
        return "".join(parts)
    return "" if c is None else str(c)


def answer_tag(text: str) -> str | None:
    """Content of the last complete <answer>…</answer>, or None."""
    found = _ANSWER.findall(text)
    return found[-1] if found else None


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{…} (or \\fbox{…}) with balanced braces, so \\boxed{\\frac{1}{2}} gives
    \\frac{1}{2}; for nested boxes the innermost-last one wins. None when absent or unbalanced."""
    starts = [m.end() for m in _BOX.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            ch = text[i]
            if ch == "{" and text[i - 1] != "\\":
                depth += 1
            elif ch == "}" and text[i - 1] != "\\":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


def normalize_unicode(text: str) -> str:
    """NFKC (full-width digits, ½ -> 1⁄2) then ASCII operators for −, ⁄, ÷, ×."""
    return unicodedata.normalize("NFKC", text).translate(_UNICODE_OPS)


def snippet(text: Any, width: int = 80) -> str:
    """A short repr of a completion for error messages."""
    s = completion_text(text)
    return repr(s if len(s) <= width else s[: width - 3] + "...")


def lengths(completions: Sequence[Any], completion_ids: Sequence[Sequence[int]] | None = None) -> list[int]:
    """Completion lengths: tokens when completion_ids are passed (TRL passes them; so may our trainer),
    else characters of the text."""
    if completion_ids is not None:
        return [len(ids) for ids in completion_ids]
    return [len(completion_text(c)) for c in completions]
