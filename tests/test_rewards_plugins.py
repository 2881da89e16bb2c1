"""User plugins: TRL/open-r1 compatibility, and isolation in the reward worker (exceptions, wrong
lengths, NaN, an infinite loop that the timeout must stop, os._exit), in fail and skip modes."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from backend.checks import check_spec
from backend.rewards.plugins import read_plugin
from backend.rewards.scorer import RewardError, RewardScorer
from backend.spec import RewardFunction, RewardsSection, RunSpec

PLUGINS = Path(__file__).parent / "plugins"
COMPAT, BAD, DECORATED = PLUGINS / "compat_rewards.py", PLUGINS / "bad_rewards.py", PLUGINS / "decorated_rewards.py"


def section(names: list[str], plugin: Path, on_error: str = "fail", timeout_s: float = 20.0,
            params: dict[str, dict] | None = None) -> RewardsSection:
    params = params or {}
    return RewardsSection(functions=[RewardFunction(name=n, params=params.get(n, {})) for n in names],
                          plugins=[str(plugin)], on_error=on_error, timeout_s=timeout_s)


def batch(completions: list[str]) -> tuple[list[str], list[str], list[dict]]:
    n = len(completions)
    return ["1+1="] * n, completions, [{"prompt": "1+1=", "solution": "2"} for _ in range(n)]


def test_trl_style_functions_work_unchanged() -> None:
    names = ["matches_solution", "only_completions", "token_count", "scaled", "slow_judge", "where_am_i",
             "maybe_none", "exact_match"]
    rewards = section(names, COMPAT, params={"scaled": {"scale": 2.5}})
    with RewardScorer(rewards) as scorer:
        assert scorer.names == names and scorer.weights.dtype == np.float32
        assert scorer.where == ["worker"] * 7 + ["trainer"]  # plugins in the worker, cheap built-ins here
        m = scorer.score(*batch(["2", "", "3"]), completion_ids=[[5, 1], [1], [7, 8, 1]])
        assert m.shape == (3, 8) and m.dtype == np.float32
        np.testing.assert_array_equal(m[:, 0], [1, 0, 0])
        np.testing.assert_array_equal(m[:, 1], [1, 0, 1])
        np.testing.assert_array_equal(m[:, 2], [2, 1, 3])
        np.testing.assert_array_equal(m[:, 3], [2.5] * 3)
        np.testing.assert_array_equal(m[:, 4], [0.5] * 3)
        assert m[0, 5] != os.getpid()  # plugin code ran in another process
        assert math.isnan(m[1, 6]) and m[0, 6] == 1.0  # None -> NaN
        np.testing.assert_array_equal(m[:, 7], [1, 0, 0])
        assert scorer.error_counts == dict.fromkeys(names, 0)


def test_conversational_rows_get_trl_message_format() -> None:
    chat = [{"role": "user", "content": "1+1?"}]
    rows = [{"prompt": chat, "solution": "2"}] * 2
    with RewardScorer(section(["think_answer_format", "format"], COMPAT)) as scorer:
        good, bad = "<think>a</think><answer>2</answer>", "2"
        m = scorer.score(["rendered"] * 2, [good, bad], rows)
    np.testing.assert_array_equal(m, [[1, 1], [0, 0]])


def test_decorator_names_and_params(tmp_path: Path) -> None:
    names, rewards = read_plugin(DECORATED)
    assert rewards == {"short_answer": "short", "has_digit": "has_digit"}  # helper is not a reward
    assert {"short_answer", "short", "has_digit", "helper", "reward_function"} <= names
    spec = RunSpec()
    spec.rewards.plugins = [str(DECORATED)]
    spec.rewards.functions = [RewardFunction(name="short_answer"), RewardFunction(name="nope")]
    issues = [str(i) for i in check_spec(spec) if i.field.startswith("rewards")]
    assert len(issues) == 1 and "nope" in issues[0]
    rs = section(["short_answer", "has_digit"], DECORATED, params={"short_answer": {"max_chars": 1}})
    with RewardScorer(rs) as scorer:
        np.testing.assert_array_equal(scorer.score(*batch(["2", "22", "x"])), [[1, 1], [0, 1], [1, 0]])


def test_bad_plugins_fail_at_start() -> None:
    with pytest.raises(RewardError, match="fails when imported"):
        RewardScorer(section(["reward"], PLUGINS / "broken_import.py"))
    with pytest.raises(RewardError, match="'missing' is not defined in the plugin"):
        RewardScorer(section(["missing"], COMPAT))
    with pytest.raises(RewardError, match="does not accept params"):
        RewardScorer(section(["only_completions"], COMPAT, params={"only_completions": {"x": 1}}))
    with pytest.raises(RewardError, match="plugin file not found"):
        RewardScorer(section(["x"], PLUGINS / "absent.py"))
    with pytest.raises(RewardError, match="unknown reward"):
        RewardScorer(RewardsSection(functions=[RewardFunction(name="nope")]))


@pytest.mark.parametrize("name, pattern", [
    ("raises", r"reward 'raises' raised ZeroDivisionError.*bad_rewards.py:\d+.*first failing sample 1 "
               r"\(completion 'abc'\)"),
    ("wrong_length", r"reward 'wrong_length' returned 2 scores for 3 completions; first unscored: sample 2"),
    ("not_finite", r"reward 'not_finite' sample 1 \(completion 'nan'\): nan is not finite"),
    ("not_a_list", r"reward 'not_a_list' returned float"),
])
def test_fail_mode_names_function_and_sample(name: str, pattern: str) -> None:
    with RewardScorer(section([name], BAD)) as scorer:
        with pytest.raises(RewardError, match=pattern):
            scorer.score(*batch(["ok", "abc" if name == "raises" else "nan", "fine"]))
        assert scorer.error_counts[name] == 1


def test_skip_mode_contains_every_failure_and_recovers() -> None:
    names = ["ok", "raises", "wrong_length", "not_finite", "loops_forever", "exits", "exact_match"]
    rewards = section(names, BAD, on_error="skip", timeout_s=1.5)
    scorer = RewardScorer(rewards)
    try:
        t0 = time.monotonic()
        m = scorer.score(*batch(["2", "abc", "nan"]))
        elapsed = time.monotonic() - t0
        # the loop was stopped by the timeout: not much more than 1.5 s, and not forever
        assert 1.5 <= elapsed < 15, elapsed
        np.testing.assert_array_equal(m[:, 0], [1, 1, 1])
        np.testing.assert_array_equal(m[:, 6], [1, 0, 0])
        assert np.isnan(m[:, 1:6]).all()
        assert scorer.error_counts == {"ok": 0, "raises": 1, "wrong_length": 1, "not_finite": 1,
                                       "loops_forever": 1, "exits": 1, "exact_match": 0}
        assert "timed out after 1.5s" in scorer.last_errors["loops_forever"]
        assert "exited with code 7" in scorer.last_errors["exits"]
        starts = scorer.worker_starts
        assert starts == 2  # the first, then a fresh one after the timeout (os._exit came last)
        # the next batch scores normally again (a fresh worker where needed), counters keep adding up
        m2 = scorer.score(*batch(["2", "abcd", "x"]))
        np.testing.assert_array_equal(m2[:, 1], [-0.5, 1.0, -0.5])  # 1 / (len - 3)
        assert scorer.error_counts["raises"] == 1 and scorer.error_counts["loops_forever"] == 2
    finally:
        scorer.close()
        scorer.close()  # safe twice


def test_fail_mode_timeout_and_exit_raise_clear_errors() -> None:
    with RewardScorer(section(["loops_forever"], BAD, timeout_s=1.0)) as scorer:
        t0 = time.monotonic()
        with pytest.raises(RewardError, match=r"'loops_forever': timed out after 1s .*first sample 0"):
            scorer.score(*batch(["2"]))
        assert time.monotonic() - t0 < 10
    with RewardScorer(section(["exits"], BAD)) as scorer:
        with pytest.raises(RewardError, match="'exits': reward worker exited with code 7"):
            scorer.score(*batch(["2"]))


def test_close_stops_the_worker_process() -> None:
    scorer = RewardScorer(section(["ok"], BAD))
    proc = scorer._worker.proc
    assert proc is not None and proc.poll() is None
    scorer.close()
    assert proc.poll() is not None
    scorer.close()
    with pytest.raises(RewardError, match="closed"):
        scorer.score(*batch(["2"]))


def test_empty_batch_and_mismatched_inputs() -> None:
    with RewardScorer(RewardsSection()) as scorer:
        assert scorer.score([], [], []).shape == (0, 2)
        with pytest.raises(ValueError, match="one prompt and one row per completion"):
            scorer.score(["a"], ["b", "c"], [{}])
