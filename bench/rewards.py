"""Reward throughput: python -m bench.rewards [--batch 512] [--reps 2]

Prints completions scored per second for each built-in (called in this process), then the reward
worker's overhead per batch: the same functions scored through the worker (RewardScorer with
isolate_builtins=True: pickling, the socket round trip, unpickling), next to the same calls made
in-process; the overhead is the worker's wall time minus its own time inside the functions. Every
repetition scores a fresh batch, so math-verify's caches do not flatter it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backend.rewards.registry import BUILTIN_REWARDS
from backend.rewards.scorer import RewardScorer
from backend.spec import RewardFunction, RewardsSection

ROOT = Path(__file__).resolve().parents[1]
PARAMS: dict[str, dict[str, Any]] = {"soft_overlong": {"max_completion_len": 400, "cache_len": 100},
                                     "reward_model": {"path": str(ROOT / "assets/tiny-reward"), "batch_size": 64,
                                                      "max_length": 256}}
CHEAP_REPS = 25  # repetitions for sets that take milliseconds
NOOP_PLUGIN = "def noop(completions, **kwargs):\n    return [0.0] * len(completions)\n"


def math_batch(n: int, seed: int, group: int = 8) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """n completions in groups sharing a prompt: R1-style reasoning then an answer, right or wrong, in
    <answer> tags, \\boxed{} or plain text; gold answers are fractions, integers or LaTeX."""
    rng = random.Random(seed)
    prompts, completions, rows = [], [], []
    for g in range(n // group):
        a, b = rng.randint(1, 99), rng.randint(2, 99)
        gold = rng.choice([f"\\frac{{{a}}}{{{b}}}", str(a * b), f"{a}\\sqrt{{{b}}}"])
        prompt = f"Problem {seed}-{g}: compute the value of the expression with a={a}, b={b}."
        for _ in range(group):
            k = rng.randint(1, 4)
            answer = rng.choice([gold, f"\\frac{{{a * k}}}{{{b * k}}}", str(a * b + k), f"{a}/{b}", f"{a + k}"])
            thought = " ".join(rng.choice(["so", "then", "we", "multiply", "the", "terms", "check", "carry"])
                               for _ in range(rng.randint(20, 120)))
            shape = rng.randrange(3)
            body = (f"<think>\n{thought}\n</think>\n<answer>\n{answer}\n</answer>" if shape == 0 else
                    f"{thought} so the answer is $\\boxed{{{answer}}}$." if shape == 1 else f"{thought} = {answer}")
            prompts.append(prompt)
            completions.append(body)
            rows.append({"prompt": prompt, "solution": gold, "nums": [a, b, k], "target": a + b * k})
    return prompts, completions, rows


def countdown_completions(rows: list[dict[str, Any]], seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for r in rows:
        a, b, k = r["nums"]
        eq = rng.choice([f"{a} + {b} * {k}", f"({a} + {b}) * {k}", f"{a} / ({k} - {k})", f"{a} + {b}"])
        out.append(f"<think>try</think><answer>{eq}</answer>")
    return out


def best(times: list[float]) -> float:
    return min(times) if times else float("nan")


def bench_builtins(n: int, reps: int) -> dict[str, float]:
    """Seconds per batch of n, per built-in, called directly in this process."""
    out: dict[str, float] = {}
    fns = {name: b.make(PARAMS.get(name, {}), "cpu", ROOT) for name, b in sorted(BUILTIN_REWARDS.items())}
    for name, fn in fns.items():
        times: list[float] = []
        rep = 0
        # cheap functions get more repetitions: their milliseconds are at the mercy of the scheduler
        while rep <= reps or (rep <= CHEAP_REPS and sum(times) < 0.5):
            prompts, completions, rows = math_batch(n, seed=1000 + rep)
            if name == "countdown":
                completions = countdown_completions(rows, rep)
            cols = {k: [r[k] for r in rows] for k in ("solution", "nums", "target")}
            t0 = time.perf_counter()
            fn(completions=completions, prompts=prompts, **cols)
            if rep:  # the first call pays imports and model warm-up
                times.append(time.perf_counter() - t0)
            rep += 1
        out[name] = best(times)
    return out


def bench_worker(names: list[str], n: int, reps: int, plugin: str | None = None) -> dict[str, float]:
    """Seconds per batch of n for a set of functions: "inproc" (called here), "wall" (RewardScorer.score with
    them all in the worker), "compute" (the worker's own timing of the calls) and "overhead" = wall - compute:
    what the worker adds (pickling, the socket round trip, waking the process). Medians over reps
    (CHEAP_REPS for sets of cheap functions)."""
    functions = [RewardFunction(name=x, params=PARAMS.get(x, {})) for x in names]
    rewards = RewardsSection(functions=functions, plugins=[plugin] if plugin else [], timeout_s=600)
    local: list[Callable[..., Any]] = [BUILTIN_REWARDS[x].make(PARAMS.get(x, {}), "cpu", ROOT)
                                       if x in BUILTIN_REWARDS else (lambda completions, **_: [0.0] * len(completions))
                                       for x in names]
    got: dict[str, list[float]] = {"inproc": [], "wall": [], "compute": [], "overhead": []}
    cheap = not any(x in BUILTIN_REWARDS and BUILTIN_REWARDS[x].isolate for x in names)
    with RewardScorer(rewards, ROOT, "cpu", isolate_builtins=True) as scorer:
        for rep in range(1 + (CHEAP_REPS if cheap else reps)):
            prompts, completions, rows = math_batch(n, seed=2000 + rep)
            cols = {k: [r[k] for r in rows] for k in ("solution", "nums", "target")}
            t0 = time.perf_counter()
            for fn in local:
                fn(completions=completions, prompts=prompts, **cols)
            t1 = time.perf_counter()
            scorer.score(prompts, completions, rows)
            t2 = time.perf_counter()
            compute = sum(scorer.last_timings[x] for x in names)
            if rep:  # the first batch pays the worker's warm-up
                for k, v in (("inproc", t1 - t0), ("wall", t2 - t1), ("compute", compute),
                             ("overhead", t2 - t1 - compute)):
                    got[k].append(v)
    return {k: statistics.median(v) for k, v in got.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=512, help="completions per batch (default 512)")
    ap.add_argument("--reps", type=int, default=2, help="timed batches per measurement (default 2)")
    args = ap.parse_args(argv)
    n = args.batch

    print(f"built-ins, in-process, batch of {n} (best of {args.reps}, or of up to {CHEAP_REPS} for fast ones):")
    for name, sec in bench_builtins(n, args.reps).items():
        where = "worker" if BUILTIN_REWARDS[name].isolate else "trainer"
        print(f"  {name:<14} {n / sec:>12,.0f} completions/s  {sec * 1000:>9.2f} ms/batch   runs in: {where}")

    print(f"\nreward worker overhead per batch of {n} (median of {args.reps}, of {CHEAP_REPS} for cheap sets);\n"
          f"overhead = worker wall time - the worker's own time in the functions:")
    with tempfile.TemporaryDirectory() as tmp:
        noop = Path(tmp) / "noop_plugin.py"
        noop.write_text(NOOP_PLUGIN)
        sets = [(["accuracy"], None), (["accuracy", "format", "tag_count"], None), (["cosine"], None),
                (["exact_match", "digit_match"], None), (["format", "tag_count", "countdown"], None),
                (["noop"], str(noop))]
        for names, plugin in sets:
            r = bench_worker(names, n, args.reps, plugin)
            pct = f"{100 * r['overhead'] / r['compute']:7.1f}%" if r["compute"] > 1e-4 else "     n/a"
            print(f"  {'+'.join(names):<28} in-process {r['inproc'] * 1000:8.2f} ms | worker: wall "
                  f"{r['wall'] * 1000:8.2f} ms, in functions {r['compute'] * 1000:8.2f} ms, "
                  f"overhead {r['overhead'] * 1000:6.2f} ms = {pct} of the reward time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
