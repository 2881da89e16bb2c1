"""Reward layer: built-in reward functions, the registry, and the scorer the trainer calls."""
