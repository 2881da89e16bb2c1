"""Reward functions written the way TRL / open-r1 users write them; they must work unchanged."""

import asyncio
import os
import re

import numpy as np


def think_answer_format(completions, **kwargs):
    # open-r1 style: conversational completions, read via completion[0]["content"]
    texts = [completion[0]["content"] for completion in completions]
    return [1.0 if re.fullmatch(r"<think>.*</think><answer>.*</answer>", t, re.DOTALL) else 0.0 for t in texts]


def matches_solution(completions, solution, **kwargs):
    return [float(c.strip() == s) for c, s in zip(completions, solution)]


def only_completions(completions):
    # no **kwargs: receives only what it names
    return [float(len(c)) for c in completions]


def token_count(completions, completion_ids=None, **kwargs):
    return [float(len(ids)) for ids in completion_ids]


def scaled(completions, scale=1.0, **kwargs):
    return np.full(len(completions), scale)  # a numpy array is accepted


async def slow_judge(completions, prompts=None, **kwargs):
    await asyncio.sleep(0.01)
    return [0.5 for _ in completions]


def where_am_i(completions, **kwargs):
    return [float(os.getpid())] * len(completions)


def maybe_none(completions, **kwargs):
    print("a plugin that prints: this must not reach stdout of `check --json`")
    return [None if c == "" else 1.0 for c in completions]


def _helper(x):
    return x
