"""Success replay (backend.train.replay): what it stores and puts back, by hand."""

from __future__ import annotations

import numpy as np

from backend.rollout.base import Completion
from backend.train.batch import Prompt, ScoredGroup
from backend.train.replay import SolvedReplay

PROMPT = Prompt("1+2=", [1, 2, 3])


def group(row: int, rewards: list[float]) -> ScoredGroup:
    comps = [Completion([10 + i], f"c{i}", "stop", [-0.1 * (i + 1)]) for i in range(len(rewards))]
    return ScoredGroup(row, PROMPT, comps, np.array([[r] for r in rewards], dtype=np.float32))


def apply(replay: SolvedReplay, g: ScoredGroup) -> bool:
    return replay.apply(g, g.rewards[:, 0])  # one reward function of weight 1: the total is its score


def test_stores_the_first_solved_and_puts_it_back_last_in_a_failed_group() -> None:
    replay = SolvedReplay(1.0)
    assert not apply(replay, group(3, [0.0, 1.0, 1.0]))  # solved: c1 is stored for row 3
    failed = group(3, [0.0, 0.0, 0.0])
    assert apply(replay, failed)
    assert [c.text for c in failed.completions] == ["c0", "c1", "c1"]
    assert failed.completions[2].logprobs == [-0.2]  # the sampling logprobs of the step that drew it
    assert failed.rewards[:, 0].tolist() == [0.0, 0.0, 1.0] and failed.replayed == (2,)
    other = group(4, [0.0, 0.0, 0.0])  # nothing stored for row 4: unchanged
    assert not apply(replay, other) and other.replayed == () and other.rewards[:, 0].tolist() == [0, 0, 0]
    newer = group(3, [1.0, 0.0, 0.0])  # solved again: the newer solution replaces the stored one
    assert not apply(replay, newer)
    again = group(3, [0.0, 0.0, 0.0])
    apply(replay, again)
    assert again.completions[2].text == "c0"


def test_solved_at_is_a_threshold_on_the_weighted_total() -> None:
    replay = SolvedReplay(1.0)
    apply(replay, group(0, [0.5, 1.5]))
    assert replay.store[0].completion.text == "c1"
    replay = SolvedReplay(2.0)
    assert not apply(replay, group(0, [1.0, 1.5])) and not replay.store


def test_state_round_trips() -> None:
    replay = SolvedReplay(1.0)
    apply(replay, group(7, [1.0, 0.0]))
    restored = SolvedReplay(1.0)
    restored.load_state_dict(replay.state_dict())
    g = group(7, [0.0, 0.0])
    assert apply(restored, g)
    assert g.completions[1] == replay.store[7].completion and g.rewards[1].tolist() == [1.0]
