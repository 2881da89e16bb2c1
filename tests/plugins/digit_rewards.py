"""A dense reward the tiny model can move within a few steps, for short learning tests of objectives."""


def ones_share(completions, **kwargs):
    """The share of '1' characters in the completion (0 for an empty one)."""
    return [c.count("1") / len(c) if c else 0.0 for c in completions]
