"""Rollout engines behind one interface (base.py); the trainer's builders pick one from the RunSpec."""

from backend.rollout.base import Completion, RolloutEngine, SamplingParams

__all__ = ["Completion", "RolloutEngine", "SamplingParams"]
