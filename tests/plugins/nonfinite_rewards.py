"""Rewards whose group statistics overflow, for tests/test_faults.py. 3e38 fits in the float32 score matrix
(a larger value or ±inf is refused by the scorer itself), but the sum of two does not."""

_calls = {"huge_once": 0}


def huge(completions, **kwargs):
    """3e38 for every completion."""
    return [3e38 for _ in completions]


def huge_once(completions, **kwargs):
    """3e38 for every completion of the first batch, 0 afterwards."""
    _calls["huge_once"] += 1
    return [3e38 if _calls["huge_once"] == 1 else 0.0 for _ in completions]


def astronomic(completions, **kwargs):
    """1e308: a float64, beyond float32."""
    return [1e308 for _ in completions]
