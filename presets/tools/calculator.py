"""Calculator tool for the tiny tool-use demo (assets/tiny-tools): the model calls `add` instead of summing in its head.

A tool is a plain function with type hints and a Google-style docstring, the convention of
`transformers.utils.get_json_schema` (and TRL), so the same file works with TRL's `tools=[add]`.
"""

from __future__ import annotations


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.

    Returns:
        The sum a + b.
    """
    return int(a) + int(b)
