r"""Standard benchmark formats by name: GSM8K, MATH-500, AIME, GPQA, read from the user's local files.

Each format turns its published rows into eval rows {"prompt", "solution", "id", ...original columns}
and names the reward that scores them. Files are JSONL, JSON, CSV or Parquet (whatever
`backend.data.load_source` reads). Nothing is downloaded: point `--data NAME=FILE` at your copy, or use
`--data NAME` for the tiny sample of the format we ship in assets/bench/ (made by
assets/make_bench_samples.py, not taken from the benchmarks).

| name    | columns read                                   | gold answer                    | reward          |
|---------|------------------------------------------------|--------------------------------|-----------------|
| gsm8k   | question, answer ("... #### 72")               | text after "####", no commas   | accuracy        |
| math500 | problem, answer                                | answer                         | accuracy        |
| aime    | problem / Problem / question, answer / Answer  | the integer answer             | accuracy        |
| gpqa    | Question, Correct Answer, Incorrect Answer 1-3 | letter of the correct option   | multiple_choice |

Math prompts ask for the answer in \boxed{} (the Qwen2.5-Math convention); `accuracy` compares it with
math-verify (answer = <answer> tag, else the last \boxed{}, else math-verify's own anchors in the text).
GPQA's four options are shuffled per question by a hash of the question text (the same order on every
run and machine) and lettered A-D; `multiple_choice` reads the letter from <answer>, \boxed{},
"answer is X" or the last lone capital letter.

Majority vote groups samples by `extract_answer`: the normalized <answer> / \boxed{} / last number
(math) or the option letter (GPQA).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.data import DataError, load_source
from backend.rewards.choice import choice_letter
from backend.rewards.text import answer_tag, completion_text, last_boxed, normalize_unicode

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
CHOICE_SUFFIX = "\n\nAnswer with the letter of the correct option in \\boxed{}, for example \\boxed{A}."
SAMPLES_DIR = Path(__file__).resolve().parents[2] / "assets" / "bench"
_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def math_answer(completion: str) -> str | None:
    """A normalized answer for voting: the <answer> tag, else the last \\boxed{}, else the last number."""
    text = normalize_unicode(completion_text(completion))
    region = answer_tag(text)
    if region is None:
        region = last_boxed(text)
    if region is None:
        nums = _NUM.findall(text)
        region = nums[-1] if nums else None
    if region is None:
        return None
    r = re.sub(r"\s+", "", region).replace(",", "").strip("$.")
    r = re.sub(r"^\\text\{(.*)\}$", r"\1", r)
    return r or None


def plain_answer(completion: str) -> str | None:
    """For data that is not a named benchmark: the <answer> tag, else the last \\boxed{}, else the whole
    stripped completion."""
    text = completion_text(completion)
    for region in (answer_tag(text), last_boxed(text)):
        if region is not None:
            return region.strip()
    return text.strip() or None


def _first(row: dict[str, Any], names: tuple[str, ...], bench: str, i: int) -> Any:
    for n in names:
        if row.get(n) not in (None, ""):
            return row[n]
    raise DataError(f"{bench} row {i}: none of the columns {list(names)} (columns: {sorted(row)})")


def _gsm8k(row: dict[str, Any], i: int) -> dict[str, Any]:
    q, a = _first(row, ("question",), "gsm8k", i), str(_first(row, ("answer",), "gsm8k", i))
    if "####" not in a:
        raise DataError(f"gsm8k row {i}: the answer column has no '#### <number>' final answer")
    gold = a.rsplit("####", 1)[1].strip().replace(",", "")
    return {"prompt": f"{q}{MATH_SUFFIX}", "solution": gold}


def _math500(row: dict[str, Any], i: int) -> dict[str, Any]:
    return {"prompt": f"{_first(row, ('problem',), 'math500', i)}{MATH_SUFFIX}",
            "solution": str(_first(row, ("answer",), "math500", i))}


def _aime(row: dict[str, Any], i: int) -> dict[str, Any]:
    p = _first(row, ("problem", "Problem", "question"), "aime", i)
    ans = str(_first(row, ("answer", "Answer"), "aime", i)).strip()
    return {"prompt": f"{p}{MATH_SUFFIX}", "solution": ans.lstrip("0") or "0"}


def gpqa_order(question: str) -> list[int]:
    """The fixed option order of a question: [correct, wrong1, wrong2, wrong3] indices, permuted by the
    SHA-256 of the question text."""
    digest = hashlib.sha256(question.encode()).digest()
    order = [0, 1, 2, 3]
    for j in range(3, 0, -1):  # Fisher-Yates driven by the digest's bytes
        k = digest[j] % (j + 1)
        order[j], order[k] = order[k], order[j]
    return order


def _gpqa(row: dict[str, Any], i: int) -> dict[str, Any]:
    q = str(_first(row, ("Question", "question"), "gpqa", i)).strip()
    options = [str(_first(row, (c,), "gpqa", i)).strip() for c in
               ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")]
    order = gpqa_order(q)
    letters = "ABCD"
    listed = "\n".join(f"{letters[pos]}) {options[idx]}" for pos, idx in enumerate(order))
    return {"prompt": f"{q}\n\n{listed}{CHOICE_SUFFIX}", "solution": letters[order.index(0)]}


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    convert: Callable[[dict[str, Any], int], dict[str, Any]]
    reward: str  # the built-in reward that decides correctness
    extract_answer: Callable[[str], str | None]
    sample: str  # file name of the shipped format sample in assets/bench/


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("gsm8k", "GSM8K", _gsm8k, "accuracy", math_answer, "gsm8k.jsonl"),
    Benchmark("math500", "MATH-500", _math500, "accuracy", math_answer, "math500.jsonl"),
    Benchmark("aime", "AIME", _aime, "accuracy", math_answer, "aime.parquet"),
    Benchmark("gpqa", "GPQA (multiple choice)", _gpqa, "multiple_choice", lambda c: choice_letter(completion_text(c)),
              "gpqa.jsonl"),
)}


def parse_data_ref(ref: str) -> tuple[Benchmark | None, str]:
    """'gsm8k=path' -> (GSM8K, path); 'gsm8k' -> (GSM8K, the shipped sample); 'file.jsonl' -> (None, file)."""
    name, sep, path = ref.partition("=")
    if sep:
        bench = BENCHMARKS.get(name.strip().lower())
        if bench is None:
            raise DataError(f"--data {ref!r}: unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})")
        if not path.strip():
            raise DataError(f"--data {ref!r}: give the file after '=', e.g. {name}=test.jsonl")
        return bench, path.strip()
    bench = BENCHMARKS.get(ref.strip().lower())
    if bench is not None:
        return bench, str(SAMPLES_DIR / bench.sample)
    return None, ref


def load_benchmark(bench: Benchmark, path: str, base_dir: Path) -> list[dict[str, Any]]:
    """All rows of a local benchmark file in eval form, in file order (no shuffling: results line up)."""
    ds = load_source(path, base_dir, seed=0)
    rows = []
    for i, raw in enumerate(ds.to_list()):
        row = bench.convert(raw, i)
        rows.append({**{k: v for k, v in raw.items() if k not in ("prompt", "solution")}, **row})
    return rows
