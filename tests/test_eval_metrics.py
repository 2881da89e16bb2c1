"""Eval metrics on hand-made outputs: pass@k against the closed form, majority vote, thinking efficiency."""

from __future__ import annotations

import itertools
import math

import pytest

from backend.eval.metrics import PromptResult, majority_correct, pass_at_k, summarize
from backend.eval.thinking import (
    count_switches,
    first_correct_by_judge,
    reasoning_span,
    rough_tokens,
    summarize_thinking,
    thinking_stats,
)


@pytest.mark.parametrize("n,c,k", [(n, c, k) for n in (1, 2, 5, 10) for c in range(n + 1) for k in range(1, n + 1)])
def test_pass_at_k_matches_the_closed_form(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_is_the_chance_a_random_k_subset_has_a_correct_sample() -> None:
    samples = [True, False, False, True, False]  # n=5, c=2
    for k in range(1, 6):
        subsets = list(itertools.combinations(samples, k))
        assert pass_at_k(5, 2, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # hand-worked: 1 - C(3,2)/C(4,2) = 1 - 3/6
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(4, 1, 5)


def test_majority_vote() -> None:
    assert majority_correct(["7", "7", "8", None], [True, True, False, False])
    assert not majority_correct(["8", "7", "8", "7"], [False, True, False, True])  # tie: first seen ("8") wins
    assert not majority_correct([None, None], [True, True])  # nobody voted


def test_summarize_hand_worked() -> None:
    a = PromptResult([True, False], ["1", "2"], [3, 5], [False, True], [1.0, 0.0])
    b = PromptResult([False, False], ["4", "4"], [2, 2], [False, False], [0.0, 0.5])
    m = summarize([a, b], [1, 2])
    assert m["accuracy"] == pytest.approx(0.25)
    assert m["pass@1"] == pytest.approx(0.25) and m["pass@2"] == pytest.approx(0.5)
    assert m["maj@2"] == pytest.approx(0.5)  # a: tie between "1"(right) and "2" -> "1"; b: "4" wrong
    assert m["mean_length"] == pytest.approx(3.0) and m["truncation_rate"] == pytest.approx(0.25)
    assert m["reward"] == pytest.approx(0.375)
    with pytest.raises(ValueError, match="--n"):
        summarize([a], [3])


EN = ("<think>First, 12 * 3 = 36. Then subtract 7 to get 29. Wait, let me double-check: 36 - 7 = 29. "
      "Alternatively, count down from 36. Hmm, yes 29.</think><answer>29</answer>")
ZH = "<think>先算 12 乘 3 得 36，再减 7 得 28。等等，36 减 7 应该是 29。另外，也可以倒着数，答案是 29。</think>答案：\\boxed{29}"


def test_reasoning_span_variants() -> None:
    assert reasoning_span("no tags") is None
    t = "a</think>b"  # the template opened the block in the prompt
    assert t[slice(*reasoning_span(t))] == "a"
    t = "<think>unclosed"
    assert t[slice(*reasoning_span(t))] == "unclosed"


def test_rough_tokens_counts_cjk_characters_words_and_marks() -> None:
    assert rough_tokens("Wait, 36 - 7 = 29.") == 8  # Wait , 36 - 7 = 29 .
    assert rough_tokens("等等，36减7") == 6  # 等 等 ， 36 减 7


def test_english_trace() -> None:
    s = thinking_stats(EN, True, lambda a: a == "29")
    reasoning = EN[len("<think>"):EN.index("</think>")]
    assert s.reasoning_tokens == rough_tokens(reasoning)
    upto = reasoning[: reasoning.index("29") + 2]  # "... subtract 7 to get 29"
    assert s.first_correct_tokens == rough_tokens(upto)
    assert s.reflection_tokens == s.reasoning_tokens - s.first_correct_tokens
    assert s.thought_switches == 4  # "Wait", "let me double-check", "Alternatively", "Hmm"
    assert (s.reasoning_tokens, s.first_correct_tokens) == (41, 14)  # counted by hand
    assert s.efficiency == pytest.approx(s.first_correct_tokens / s.reasoning_tokens)
    assert thinking_stats(EN, False, lambda a: a == "29").efficiency == 0.0  # wrong final answer: 0


def test_chinese_trace() -> None:
    s = thinking_stats(ZH, True, lambda a: a == "29")
    reasoning = ZH[len("<think>"):ZH.index("</think>")]
    upto = reasoning[: reasoning.index("29") + 2]  # the first 29 comes after the wrong 28 and "等等"
    assert s.first_correct_tokens == rough_tokens(upto)
    assert s.thought_switches == 2  # 等等, 另外
    assert 0 < s.efficiency < 1


def test_switch_markers_are_configurable_and_whole_words() -> None:
    assert count_switches("Wait. await waiting wait", ["wait"]) == 2
    assert count_switches("but wait, wait", ["but wait", "wait"]) == 2  # the longer marker wins its overlap
    assert count_switches("等一下等等", ["等等", "等一下"]) == 2
    assert count_switches("anything", []) == 0


def test_judge_replaces_the_rule() -> None:
    reasoning = "Try 28. No. It is 29. Check again."
    calls: list[str] = []

    def judge(prefix: str) -> bool:
        calls.append(prefix)
        return "29" in prefix

    cut = first_correct_by_judge(reasoning, judge)
    assert reasoning[:cut] == "Try 28. No. It is 29."
    s = thinking_stats(f"<think>{reasoning}</think>29", True, judge=judge)
    assert s.first_correct_tokens == rough_tokens("Try 28. No. It is 29.")


def test_no_think_block_and_summary() -> None:
    assert thinking_stats("<answer>29</answer>", True, lambda a: True) is None
    none_found = thinking_stats("<think>no numbers here</think>", False, lambda a: True)
    assert none_found.first_correct_tokens is None and none_found.reflection_tokens is None
    en = thinking_stats(EN, True, lambda a: a == "29")
    summ = summarize_thinking([en, None, none_found])
    assert summ["thinking/with_think_block"] == pytest.approx(2 / 3)
    assert summ["thinking/first_correct_tokens"] == en.first_correct_tokens  # only traces that found one
    assert summ["thinking/efficiency"] == pytest.approx(en.efficiency / 2)
