"""Evaluation: greedy accuracy during training (`greedy.py`)."""
