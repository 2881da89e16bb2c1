"""Built-in rewards on hand-written cases, tricky ones included; parameter validation through check_spec."""

from __future__ import annotations

import math
from typing import Any

import pytest

from backend.checks import check_spec
from backend.rewards.registry import BUILTIN_REWARDS
from backend.rewards.tasks import countdown_equation
from backend.rewards.text import last_boxed
from backend.spec import RewardFunction, RunSpec


def score(name: str, completions: list[Any], params: dict[str, Any] | None = None, **columns: Any) -> list[Any]:
    fn = BUILTIN_REWARDS[name].make(params or {})
    return fn(completions=completions, prompts=columns.pop("prompts", ["p"] * len(completions)), **columns)


def test_every_builtin_documents_a_formula() -> None:
    expected = {"accuracy", "format", "tag_count", "countdown", "counting", "cosine", "repetition",
                "soft_overlong", "length", "reward_model", "exact_match", "digit_match"}
    assert expected <= set(BUILTIN_REWARDS)
    for name, b in BUILTIN_REWARDS.items():
        assert len(b.doc) > 40, name


# ----------------------------------------------------------------------------- accuracy

@pytest.mark.parametrize("completion, gold, want", [
    ("<answer>\\frac{2}{4}</answer>", "\\frac{1}{2}", 1.0),            # equivalent fractions
    ("<answer>0.5</answer>", "$\\frac{1}{2}$", 1.0),                      # decimal vs LaTeX
    ("<answer>\\dfrac12</answer>", "1/2", 1.0),                           # bare LaTeX inside the tag
    ("so $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),                           # braces nested inside the box
    ("first \\boxed{3}, no wait: \\boxed{\\frac{3}{4}}", "3/4", 1.0),     # the last box wins
    ("\\boxed{\\boxed{7}}", "7", 1.0),                                    # nested boxes
    ("<answer>5</answer> but \\boxed{6}", "5", 1.0),                      # the tag wins over a box
    ("The answer is 3", "3", 1.0),                                        # no tag, no box: whole completion
    ("<answer>½</answer>", "\\frac{1}{2}", 1.0),                          # unicode vulgar fraction
    ("<answer>３</answer>", "3", 1.0),                                    # full-width digit
    ("<answer>−3</answer>", "-3", 1.0),                                   # unicode minus
    ("<answer>4</answer>", "3", 0.0),
    ("<answer>1/3</answer>", "\\frac{1}{2}", 0.0),
    ("", "3", 0.0),
    ("<answer></answer>", "3", 0.0),
    ("<answer>3</answer>", "<answer> 3 </answer>", 1.0),                  # tagged gold
    ("<answer>58</answer>", 58, 1.0),                                     # numeric gold column
])
def test_accuracy(completion: str, gold: Any, want: float) -> None:
    assert score("accuracy", [completion], solution=[gold]) == [want]


def test_accuracy_is_none_when_the_gold_cannot_be_parsed() -> None:
    got = score("accuracy", ["<answer>3</answer>", "<answer>3</answer>", "x"],
                solution=["no answer here", None, "3"])
    assert got == [None, None, 0.0]


def test_accuracy_reads_conversational_completions() -> None:
    assert score("accuracy", [[{"role": "assistant", "content": "<answer>2</answer>"}]], solution=["2"]) == [1.0]


def test_last_boxed_handles_escaped_braces_and_unbalanced_input() -> None:
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert last_boxed("\\boxed{\\frac{1}{2}") is None
    assert last_boxed("no box") is None


# ----------------------------------------------------------------------------- format and tags

@pytest.mark.parametrize("completion, want", [
    ("<think>a</think><answer>b</answer>", 1.0),
    ("  <think>\nreason\n</think>\n\n<answer>\n42\n</answer>\n", 1.0),   # white space tolerated
    ("<think>a</think>", 0.0),                                             # missing answer
    ("<answer>b</answer>", 0.0),                                           # missing think
    ("<answer>b</answer><think>a</think>", 0.0),                           # wrong order
    ("<think>a</think><answer>b</answer> trailing", 0.0),                  # something else after
    ("<think>a</think><answer>b</answer><answer>c</answer>", 0.0),         # a second answer block
    ("<think>ü 中文 🙂</think><answer>ü</answer>", 1.0),                   # unicode content
])
def test_format(completion: str, want: float) -> None:
    assert score("format", [completion]) == [want]


def test_react_format_is_ms_swifts_pattern() -> None:
    got = score("react_format", ["<think>plan</think>\nAction: search\nAction Input: {\"q\": 1}",
                                 "<think>plan</think> Action Input: x Action: y",   # the input before the action
                                 "Action: search\nAction Input: x",                 # no think block first
                                 "<think>\nmulti\nline\n</think>Action:a Action Input:b\ntrailing"])
    assert got == [1.0, 0.0, 0.0, 1.0]  # anything may follow 'Action Input:' (its `.*?$`, MULTILINE)


def test_tag_count() -> None:
    got = score("tag_count", ["<think>a</think><answer>b</answer>", "<think>a</think>", "", "<think><think></think>"])
    assert got == [1.0, 0.5, 0.0, 0.25]


# ----------------------------------------------------------------------------- countdown

def countdown(completions: list[str], nums: list[int], target: int, **params: Any) -> list[Any]:
    n = len(completions)
    return score("countdown", completions, params, nums=[nums] * n, target=[target] * n)


def test_countdown_right_and_wrong() -> None:
    got = countdown(["<answer>(25 - 5) * 3</answer>", "<answer>(25 - 5) * 3 = 60</answer>",
                     "<answer>25 * 3 - 5 * 3</answer>",           # 5 used twice, 25... numbers differ
                     "<answer>(25 - 5) * 2</answer>",             # wrong number
                     "<answer>25 - 5</answer>",                   # a number unused
                     "(25 - 5) * 3",                              # no answer tag
                     "<answer>(25 − 5) × 3</answer>"],            # unicode operators
                    [25, 5, 3], 60)
    assert got == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def test_countdown_exact_rational_arithmetic() -> None:
    # 8 / (3 - 8 / 3) = 24 exactly; floating point gives 23.99999...
    assert countdown(["<answer>8 / (3 - 8 / 3)</answer>"], [8, 3, 8, 3], 24) == [1.0]


@pytest.mark.parametrize("equation", [
    "5 / (3 - 3) + 2",          # division by zero
    "2 ** 3",                   # power
    "__import__('os').system('echo hacked')",
    "abs(-3) + 5",
    "-5 + 3 + 2",               # unary minus
    "5 // 2 + 3",               # floor division
    "5.0 + 3",                  # float literal
    "(" * 300 + "1" + ")" * 300,  # deep nesting
    "1 + " * 400 + "1",         # over the length limit
    "",
])
def test_countdown_rejects_unsafe_or_invalid(equation: str) -> None:
    assert countdown_equation(equation) is None
    assert countdown([f"<answer>{equation}</answer>"], [5, 3, 3, 2], 2)[0] == 0.0


def test_countdown_none_without_columns_and_format_score() -> None:
    fn = BUILTIN_REWARDS["countdown"].make({"format_score": 0.1})
    assert fn(completions=["<answer>1+2</answer>"], prompts=["p"]) == [None]
    assert countdown(["<answer>1 + 2</answer>", "nothing"], [1, 2], 4, format_score=0.1) == [0.1, 0.0]
    custom = BUILTIN_REWARDS["countdown"].make({"nums_column": "numbers", "target_column": "goal"})
    assert custom(completions=["<answer>1+2</answer>"], prompts=["p"], numbers=[[1, 2]], goal=[3]) == [1.0]


# ----------------------------------------------------------------------------- counting

def test_counting() -> None:
    got = score("counting",
                ["<answer>3</answer>", "<answer> There are 3 cubes </answer>", "<answer>three</answer>",
                 "<answer>３</answer>", "<answer>4</answer>", "3", "<answer>3</answer>", "<answer>3.0</answer>"],
                solution=["<answer> 3 </answer>", "3", 3, "3", "3", "3", "many", "3"])
    assert got == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, None, 1.0]


# ----------------------------------------------------------------------------- length-shaped rewards

def test_cosine_scales_length_by_correctness() -> None:
    right_short, right_long = "<answer>2</answer>", "<answer>2</answer>" + "x" * 2000
    wrong_short, wrong_long = "<answer>3</answer>", "<answer>3</answer>" + "x" * 2000
    got = score("cosine", [right_short, right_long, wrong_short, wrong_long], {"max_len": 1000},
                solution=["2"] * 4)
    assert got[0] == pytest.approx(1.0 - 0.5 * 0.5 * (1 - math.cos(math.pi * 18 / 1000)))
    assert got[1] == pytest.approx(0.5)                  # correct at max_len: min_value_correct
    assert got[2] == pytest.approx(-1.0, abs=1e-3)       # wrong and short: the worst
    assert got[3] == pytest.approx(-0.5)                 # wrong at max_len: max_value_wrong
    # token lengths when completion_ids are given: 500 of 1000 tokens = halfway
    mid = score("cosine", [right_short], {"max_len": 1000}, solution=["2"], completion_ids=[[0] * 500])
    assert mid == [pytest.approx(0.75)]
    assert score("cosine", ["x"], solution=["unparsable words"]) == [None]


def test_length_penalty_within_groups() -> None:
    comps = ["<answer>2</answer>", "<answer>2</answer> padding", "<answer>5</answer> pad", "<answer>9</answer>"]
    got = score("length", comps, solution=["2", "2", "2", "7"], prompts=["a", "a", "a", "b"])
    assert got[0] == pytest.approx(0.5)                  # correct and shortest
    assert got[1] == pytest.approx(-0.5)                 # correct and longest
    assert got[2] <= 0.0                                 # wrong: min(0, lambda)
    assert got[3] == 0.0                                 # a group of one: all lengths equal


def test_repetition() -> None:
    got = score("repetition", ["a b c d e f", "a b a b a b a b", "a b", "", "The the THE the the"],
                {"ngram_size": 2})
    assert got[0] == 0.0 and got[2] == 0.0 and got[3] == 0.0
    assert got[1] == pytest.approx(-(1 - 2 / 7))
    assert got[4] == pytest.approx(-0.75)                # lower-cased: one distinct bigram of four
    zh = score("repetition", ["哈哈哈哈哈哈", "今天天气很好"], {"ngram_size": 2, "unit": "char"})
    assert zh[0] == pytest.approx(-0.8) and zh[1] == 0.0


def test_soft_overlong() -> None:
    params = {"max_completion_len": 10, "cache_len": 4}
    got = score("soft_overlong", ["x" * 6, "x" * 8, "x" * 10, "x" * 11, ""], params)
    assert got == [0.0, pytest.approx(-0.5), -1.0, -1.0, 0.0]
    by_tokens = score("soft_overlong", ["short text", "short"], params, completion_ids=[[1] * 12, [1] * 7])
    assert by_tokens == [-1.0, pytest.approx(-0.25)]


def test_exact_and_digit_match_kept() -> None:
    assert score("exact_match", [" 58 ", "85"], solution=["58", "58"]) == [1.0, 0.0]
    assert score("digit_match", ["581", "5"], solution=["58", "58"]) == [pytest.approx(2 / 3), 0.5]


# ----------------------------------------------------------------------------- params in RunSpec

@pytest.mark.parametrize("name, params, field", [
    ("repetition", {"ngram_size": 0}, "ngram_size"),
    ("repetition", {"max_penalty": 0.5}, "max_penalty"),
    ("soft_overlong", {"max_completion_len": 100}, "cache_len"),
    ("soft_overlong", {"max_completion_len": 100, "cache_len": 100}, "cache_len"),
    ("cosine", {"max_len": 0}, "max_len"),
    ("accuracy", {"bogus": 1}, "bogus"),
    ("reward_model", {}, "path"),
])
def test_check_spec_rejects_bad_params_naming_the_field(name: str, params: dict[str, Any], field: str) -> None:
    spec = RunSpec()
    spec.rewards.functions = [RewardFunction(name=name, params=params)]
    issues = [i for i in check_spec(spec) if i.field == "rewards.functions"]
    assert issues and field in issues[0].message and name in issues[0].message


def test_check_spec_accepts_good_params() -> None:
    spec = RunSpec()
    spec.rewards.functions = [RewardFunction(name="soft_overlong", params={"max_completion_len": 8, "cache_len": 2}),
                              RewardFunction(name="repetition", params={"ngram_size": 2, "unit": "char"})]
    assert not [i for i in check_spec(spec) if i.field.startswith("rewards")]
