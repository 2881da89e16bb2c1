"""Rollout engines behind one interface (see base.py); `make_engine` picks one from the RunSpec."""

from backend.rollout.base import Completion, RolloutEngine, SamplingParams

__all__ = ["Completion", "RolloutEngine", "SamplingParams"]
