"""The `code` reward (open-r1's `code_reward`; `binary_code` with `binary`) and `code_format` (open-r1's).

`code` runs the completion's last ```python block against the row's tests.

The row's `verification_info` column holds open-r1's format (open-r1/verifiable-coding-problems-python):
`{"language": "python", "test_cases": [{"input": "...", "output": "...", "type": "stdin_stdout"}, ...]}`, as a
dict or its JSON text. Each test runs the program in `backend.sandbox` (a fresh interpreter, rlimits, no network
where the kernel allows) with the test's input on stdin; it passes when the program exits 0 within its limits and
its stdout, stripped, equals the expected output line by line (each line stripped, the same number of lines:
open-r1 zips the lines, so a program that prints only the first line of a longer answer passes there; not here).
The score is the fraction of tests passed; 0 without a ```python block; None when the row has no test cases or a
language other than python (it cannot be scored).

Registered with `isolate=True`: it runs in the reward worker, never in the trainer, and each test is a child
process of that worker. A batch takes up to completions x tests x `timeout_s` / `workers` seconds: keep
`rewards.timeout_s` above that.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from backend.rewards.registry import builtin
from backend.rewards.text import completion_text
from backend.sandbox import SandboxLimits, run_code

_BLOCK = re.compile(r"```python[ \t]*\r?\n(.*?)```", re.DOTALL)


class CodeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    column: str = Field("verification_info", description="Dataset column with the test cases (open-r1's format).")
    timeout_s: float = Field(5.0, ge=0.1, le=60.0, description="Wall-clock limit of one test run (open-r1: 5 s); "
                                                               "its CPU limit is the same, rounded up to seconds.")
    memory_mb: int = Field(512, ge=64, le=16384, description="Address-space limit of one test run, in MB.")
    max_tests: int = Field(50, ge=1, le=1000, description="Run at most this many of a row's test cases (the first).")
    max_output_kb: int = Field(256, ge=1, le=65536, description="Output cap of one test run, in KB.")
    workers: int = Field(4, ge=1, le=64, description="Test runs at once (each is a child process).")
    binary: bool = Field(False, description="Score 1 when the program passes every test (a fraction above 0.99), "
                                            "else 0: open-r1's binary_code reward.")


class CodeFormatParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    language: str = Field("python", pattern=r"^[\w+#.-]{1,32}$",
                          description="The fence's language tag the answer must carry (open-r1: python).")


def extract_code(text: str) -> str | None:
    """The last ```python fenced block of the text, or None when there is none."""
    found = _BLOCK.findall(text)
    return found[-1] if found else None


def final_text(completion: Any) -> str:
    """The text a code reward reads: the last assistant message of a conversation (open-r1 reads completion[-1]),
    else the completion's text."""
    if isinstance(completion, list):
        said = [m for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
        if said:
            return completion_text(said[-1])
    return completion_text(completion)


def cases_of(info: Any) -> list[dict[str, Any]] | None:
    """The python stdin/stdout test cases of a verification_info cell, or None when it has none (or another
    language, or is not open-r1's format)."""
    if isinstance(info, str):
        try:
            info = json.loads(info)
        except ValueError:
            return None
    if not isinstance(info, dict) or str(info.get("language", "python")).lower() != "python":
        return None
    cases = [c for c in info.get("test_cases") or [] if isinstance(c, dict) and "output" in c
             and c.get("type", "stdin_stdout") == "stdin_stdout"]
    return cases or None


def same_output(got: str, want: str) -> bool:
    """stdout against the expected output: both stripped, then line by line, each line stripped."""
    return [line.strip() for line in got.strip().splitlines()] == [line.strip() for line in want.strip().splitlines()]


def _passes(code: str, case: dict[str, Any], limits: SandboxLimits) -> bool:
    stdin = case.get("input", "")
    result = run_code(code, limits=limits, stdin=stdin if isinstance(stdin, str) else str(stdin))
    want = case["output"] if isinstance(case["output"], str) else str(case["output"])
    return result.ok and same_output(result.stdout, want)


@builtin("code", CodeParams, isolate=True, needs=lambda p: (p.column,), kinds=lambda p: {p.column: ("dict", "text", "null")})
def code(completions: list[Any], prompts: list[Any] | None = None, *, column: str = "verification_info",
         timeout_s: float = 5.0, memory_mb: int = 512, max_tests: int = 50, max_output_kb: int = 256, workers: int = 4,
         binary: bool = False, **columns: Any) -> list[float | None]:
    """Fraction of the row's test cases (open-r1's `verification_info`: stdin -> expected stdout) that the last
    ```python block of the completion passes, each run in the sandbox (`backend.sandbox`) with `timeout_s` and
    `memory_mb`; 0 without a block; None where the row has no python test cases. With `binary`, 1 where that
    fraction exceeds 0.99 and 0 elsewhere (open-r1's binary_code_reward)."""
    infos = columns.get(column) or [None] * len(completions)
    limits = SandboxLimits(cpu_s=timeout_s, wall_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_kb << 10)
    out: list[float | None] = [None] * len(completions)
    jobs: list[tuple[int, str, dict[str, Any]]] = []
    totals: dict[int, int] = {}
    for i, (c, info) in enumerate(zip(completions, infos, strict=True)):
        cases = cases_of(info)
        if cases is None:
            continue
        source = extract_code(final_text(c))
        if source is None:
            out[i] = 0.0
            continue
        cases = cases[:max_tests]
        totals[i] = len(cases)
        jobs += [(i, source, case) for case in cases]
    passed = dict.fromkeys(totals, 0)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for (i, _, _), ok in zip(jobs, pool.map(lambda j: _passes(j[1], j[2], limits), jobs), strict=True):
            passed[i] += int(ok)
    for i, total in totals.items():
        out[i] = passed[i] / total
    if binary:
        return [None if v is None else float(v > 0.99) for v in out]
    return out


@builtin("code_format", CodeFormatParams)
def code_format(completions: list[Any], prompts: list[Any] | None = None, *, language: str = "python",
                **_: Any) -> list[float | None]:
    """open-r1's code_format reward: 1 if the completion matches
    `^<think>\\n.*?\\n</think>\\n<answer>\\n.*?```LANGUAGE.*?```.*?\\n</answer>$` from its start (dot matches newlines,
    `$` at any line end, as open-r1 compiles it), else 0."""
    pattern = re.compile(rf"^<think>\n.*?\n</think>\n<answer>\n.*?```{re.escape(language)}.*?```.*?\n</answer>$",
                         re.DOTALL | re.MULTILINE)
    return [float(pattern.match(final_text(c)) is not None) for c in completions]
