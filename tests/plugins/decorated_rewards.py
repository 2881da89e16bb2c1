"""A plugin that marks its rewards with the decorator, one under another name."""

from backend.rewards.plugins import reward_function


def helper(completions):  # takes completions but is not marked: not a reward of this file
    return completions


@reward_function(name="short_answer")
def short(completions, max_chars=3, **kwargs):
    return [1.0 if len(c) <= max_chars else 0.0 for c in completions]


@reward_function
def has_digit(completions, **kwargs):
    return [float(any(ch.isdigit() for ch in c)) for c in completions]
