"""Reward layer: built-in reward functions, user plugins in an isolated worker, reward models.

registry.py   `@builtin(name, ParamsModel)` and BUILTIN_REWARDS (params validated by check_spec)
builtins.py   exact_match, digit_match, format, tag_count, repetition, soft_overlong     choice.py  multiple choice
math_rewards  accuracy, cosine, length (math-verify)      tasks.py  countdown, counting
code.py       code (open-r1: the completion's python block against the row's tests, in backend.sandbox)
reward_model  the reward_model kind (sequence classification)
plugins.py    plugin files: the @reward_function decorator, ast reading, TRL-style calls
worker.py     the reward worker process: timeouts, restarts, blame of the first failing sample
scorer.py     RewardScorer, what the trainer calls      check.py / __main__.py  `python -m backend.rewards check`

Importing the package registers every built-in (each module registers its own with `@builtin`); Python runs
this file before any `backend.rewards.*` module, so every reader of BUILTIN_REWARDS sees the whole table.
"""

from backend.rewards import builtins, choice, code, math_rewards, reward_model, tasks  # noqa: F401 - they register
