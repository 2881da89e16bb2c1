"""Thinking efficiency of a reasoning trace with a think block: rule-based, pure functions.

Definitions, for one completion (tokens are counted by `count`, the model's tokenizer in evals, or
`rough_tokens` - one per CJK character, word, number or punctuation mark - when none is given):
- reasoning: the text inside <think>...</think>; an unclosed <think> runs to the end, and a lone
  </think> (templates that open the block in the prompt) closes a block that starts at the beginning.
  No think tags -> the completion has no reasoning and every metric below is None.
- reasoning_tokens: tokens of the reasoning.
- first_correct_tokens: tokens from the start of the reasoning to the end of the first intermediate
  answer that is correct. Candidate answers are \\boxed{...} contents and numbers (integers, decimals,
  fractions a/b); `is_correct(candidate)` decides. None when no candidate is correct. A judge
  (`first_correct_by_judge`) may replace the rule: it is shown growing prefixes cut at the ends of
  sentences and says whether the answer has been reached.
- reflection_tokens: reasoning_tokens - first_correct_tokens (what the model thinks after it already
  had the answer); None when first_correct_tokens is None.
- thought_switches: occurrences of switch markers in the reasoning ("wait", "alternatively", "等等",
  "另外", ...; configurable). English markers match whole words, case-insensitive; Chinese ones as
  substrings; longer markers win where they overlap ("but wait" counts once).
- efficiency: first_correct_tokens / reasoning_tokens when the final answer is correct, else 0
  (1 = stopped thinking at the first right answer; small = long reflection after it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

EN_SWITCHES = ("wait", "alternatively", "on second thought", "let me reconsider", "let me double-check",
               "let me check again", "hmm")
ZH_SWITCHES = ("等等", "等一下", "另外", "换个思路", "换一种方法", "不对", "再检查一下", "或者说")
DEFAULT_SWITCHES = EN_SWITCHES + ZH_SWITCHES

_TOKEN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[A-Za-z]+|\d+|[^\sA-Za-z\d\u3400-\u9fff\uf900-\ufaff]")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:/\d+)?(?![\w])")
_SENTENCE_END = re.compile(r"[.!?。！？\n]+")


def rough_tokens(text: str) -> int:
    """A tokenizer-free count: each CJK character, word, digit run and punctuation mark is one token."""
    return len(_TOKEN.findall(text))


def reasoning_span(text: str) -> tuple[int, int] | None:
    """(start, end) character offsets of the reasoning in `text`, or None without think tags."""
    open_i, close_i = text.find("<think>"), text.find("</think>")
    if open_i < 0 and close_i < 0:
        return None
    start = open_i + len("<think>") if open_i >= 0 else 0
    if close_i < start:
        close_i = text.find("</think>", start)
    return start, (close_i if close_i >= 0 else len(text))


def candidate_answers(reasoning: str) -> list[tuple[int, str]]:
    """(end offset, answer text) of every intermediate answer in order: \\boxed{} contents and numbers."""
    found: list[tuple[int, str]] = []
    i = 0
    while (i := reasoning.find("\\boxed{", i)) >= 0:
        depth, j = 1, i + len("\\boxed{")
        while j < len(reasoning) and depth:
            depth += {"{": 1, "}": -1}.get(reasoning[j], 0)
            j += 1
        if depth == 0:
            found.append((j, reasoning[i + len("\\boxed{"): j - 1]))
        i = j
    found.extend((m.end(), m.group()) for m in _NUMBER.finditer(reasoning))
    return sorted(found, key=lambda x: x[0])


def count_switches(reasoning: str, markers: Sequence[str] = DEFAULT_SWITCHES) -> int:
    if not markers:
        return 0
    parts = []
    for m in sorted(set(markers), key=len, reverse=True):  # longest first: "but wait" before "wait"
        esc = re.escape(m)
        parts.append(rf"\b{esc}\b" if re.fullmatch(r"[\w\s'-]+", m) and m.isascii() else esc)
    return len(re.findall("|".join(parts), reasoning, flags=re.IGNORECASE))


def first_correct_by_rule(reasoning: str, is_correct: Callable[[str], bool]) -> int | None:
    """Character offset where the first correct intermediate answer ends, or None."""
    for end, ans in candidate_answers(reasoning):
        if is_correct(ans):
            return end
    return None


def first_correct_by_judge(reasoning: str, judge: Callable[[str], bool]) -> int | None:
    """Character offset of the shortest sentence-cut prefix that `judge(prefix)` says reaches the answer."""
    cuts = [m.end() for m in _SENTENCE_END.finditer(reasoning)]
    if not cuts or cuts[-1] != len(reasoning):
        cuts.append(len(reasoning))
    for cut in cuts:
        if judge(reasoning[:cut]):
            return cut
    return None


@dataclass(frozen=True)
class ThinkingStats:
    reasoning_tokens: int
    first_correct_tokens: int | None
    reflection_tokens: int | None
    thought_switches: int
    efficiency: float

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def thinking_stats(completion: str, final_correct: bool, is_correct: Callable[[str], bool] | None = None,
                   count: Callable[[str], int] = rough_tokens, markers: Sequence[str] = DEFAULT_SWITCHES,
                   judge: Callable[[str], bool] | None = None) -> ThinkingStats | None:
    """The module docstring's metrics for one completion; None when it has no think block.
    `is_correct` checks a candidate answer (rule), `judge` a reasoning prefix (judge model); one is needed
    for first_correct_tokens (without either it is None)."""
    span = reasoning_span(completion)
    if span is None:
        return None
    reasoning = completion[span[0]:span[1]]
    total = count(reasoning)
    if judge is not None:
        cut = first_correct_by_judge(reasoning, judge)
    elif is_correct is not None:
        cut = first_correct_by_rule(reasoning, is_correct)
    else:
        cut = None
    first = count(reasoning[:cut]) if cut is not None else None
    reflection = total - first if first is not None else None
    eff = first / total if final_correct and first is not None and total > 0 else 0.0
    return ThinkingStats(total, first, reflection, count_switches(reasoning, markers), float(eff))


def summarize_thinking(stats: Sequence[ThinkingStats | None]) -> dict[str, float]:
    """Means over the completions that have a think block (first_correct/reflection: over those with one)."""
    have = [s for s in stats if s is not None]
    if not have:
        return {}
    out = {"thinking/with_think_block": len(have) / len(stats),
           "thinking/reasoning_tokens": float(np.mean([s.reasoning_tokens for s in have])),
           "thinking/thought_switches": float(np.mean([s.thought_switches for s in have])),
           "thinking/efficiency": float(np.mean([s.efficiency for s in have]))}
    found = [s for s in have if s.first_correct_tokens is not None]
    if found:
        out["thinking/first_correct_tokens"] = float(np.mean([s.first_correct_tokens for s in found]))
        out["thinking/reflection_tokens"] = float(np.mean([s.reflection_tokens for s in found]))
    return out


class LocalJudge:
    """A local causal LM as the judge of first_correct_by_judge: it reads the question, the reference
    answer and a reasoning prefix and is asked whether the prefix already reaches the answer; "yes" wins
    when its next-token logit beats "no"'s."""

    PROMPT = ("Question: {question}\nReference answer: {answer}\nPartial reasoning:\n{prefix}\n\n"
              "Has the partial reasoning already reached the reference answer? Answer yes or no.\nAnswer:")

    def __init__(self, path: str, device: str = "cpu") -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from backend.models import load_tokenizer

        self.torch = torch
        self.tok = load_tokenizer(path)
        self.model = AutoModelForCausalLM.from_pretrained(path).to(device).eval()
        self.device = device
        self.yes = self._first_id(" yes"), self._first_id("yes")
        self.no = self._first_id(" no"), self._first_id("no")

    def _first_id(self, word: str) -> int:
        ids = self.tok(word, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"the judge's tokenizer cannot encode {word!r}")
        return ids[0]

    def for_question(self, question: str, answer: str) -> Callable[[str], bool]:
        def judge(prefix: str) -> bool:
            text = self.PROMPT.format(question=question, answer=answer, prefix=prefix)
            ids = self.tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"].to(self.device)
            with self.torch.no_grad():
                logits = self.model(input_ids=ids).logits[0, -1]
            return bool(max(logits[i] for i in self.yes) > max(logits[i] for i in self.no))
        return judge
