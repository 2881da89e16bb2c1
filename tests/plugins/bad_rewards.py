"""Misbehaving reward functions: the worker must contain every one of them."""

import os
import time


def raises(completions, **kwargs):
    return [1.0 / (len(c) - 3) for c in completions]  # ZeroDivisionError on 3-character completions


def wrong_length(completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def not_finite(completions, **kwargs):
    return [float("nan") if "nan" in c else 1.0 for c in completions]


def not_a_list(completions, **kwargs):
    return 1.0


def loops_forever(completions, **kwargs):
    while True:
        time.sleep(0.001)


def exits(completions, **kwargs):
    os._exit(7)


def ok(completions, **kwargs):
    return [1.0] * len(completions)
