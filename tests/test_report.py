"""The trainer's ETA (backend.train.report.robust_step_s, Eta) on hand-made step timings: one slow step must
not swing it, the first step's warm-up is left out, and a rollout reused for several steps is timed whole."""

from __future__ import annotations

import pytest

from backend.train.report import Eta, robust_step_s


def test_one_slow_step_does_not_swing_the_eta():
    eta = Eta()
    estimates = [eta.update(s, 100 - i) for i, s in enumerate([30.0] + [2.0] * 15, start=1)]  # warm-up, then 2 s
    before = estimates[-1]
    assert before == pytest.approx(2.0 * (100 - 16))  # the warm-up step is not in the rate
    after = eta.update(300.0, 100 - 17)  # one step 150x slower (the mean of 20 would grow 8x)
    assert after / before < 1.2
    assert eta.update(2.0, 100 - 18) == pytest.approx(2.0 * 82)  # and back at once


def test_a_lasting_change_of_pace_moves_it():
    eta = Eta(window=10)
    for _ in range(10):
        eta.update(1.0, 50)
    for _ in range(6):  # the run slowed for good (longer completions): most of the window is the new pace
        last = eta.update(4.0, 50)
    assert last == pytest.approx(4.0 * 50)


def test_several_steps_per_rollout_are_timed_by_whole_rollouts():
    # num_iterations 3: a sampling step of 7 s, then two training steps of 1 s: 3 s a step on average
    timings = [7.0, 1.0, 1.0] * 5
    assert robust_step_s(timings, period=3) == pytest.approx(3.0)
    assert robust_step_s(timings[:-1], period=3) == pytest.approx(3.0)  # blocks counted from the newest
    assert robust_step_s([], 1) == 0.0 and robust_step_s([4.0], 3) == 4.0
    assert robust_step_s([1.0, float("nan"), 1.0, 90.0, 1.0]) == 1.0
