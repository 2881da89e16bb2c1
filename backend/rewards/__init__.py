"""Reward layer: built-in reward functions, user plugins in an isolated worker, reward models.

registry.py   `@builtin(name, ParamsModel)` and BUILTIN_REWARDS (params validated by check_spec)
builtins.py   exact_match, digit_match, format, tag_count, repetition, soft_overlong (+ registers the rest)
math_rewards  accuracy, cosine, length (math-verify)      tasks.py  countdown, counting
reward_model  the reward_model kind (sequence classification)
plugins.py    plugin files: the @reward_function decorator, ast reading, TRL-style calls
worker.py     the reward worker process: timeouts, restarts, blame of the first failing sample
scorer.py     RewardScorer, what the trainer calls      check.py / __main__.py  `python -m backend.rewards check`
"""
