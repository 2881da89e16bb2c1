"""What each CPU fast path of our trainer pays, end to end: our step with it on vs off, side by side.

    python -m bench.fast_paths [--shapes preset long] [--repeats 2] [--pieces lean tape gemm kernel]

Pieces, each turned off alone with the rest on:
    lean    the lean passes (backend.rollout.fast_decode.set_lean: the hf engine's prefill and decode and the
            training forward; the activation tape rides on them, so it is off too)
    tape    the activation tape (resources.activation_reuse_mb=0)
    gemm    large float32 products through oneDNN (backend.gemm.set_enabled)
    kernel  the C decode-attention kernel (backend.rollout.decode_attention.set_enabled)
Per shape of bench.vs_trl: one throwaway warm-up run (first-run costs: a kernel build, the page cache), then
`repeats` rounds of our trainer alone with everything on and with each piece off, every other round in reverse
order, so a drift in a shared host's speed cancels in the ratios. Printed per run: seconds per step (wall clock
between step ends after bench.vs_trl.WARMUP steps, and CPU seconds of this process), the rollout's share and the
host's load; per piece the median over rounds of (step time with it off) / (step time with all on) within the
round, its speed-up, by wall clock and by CPU second (the steadier of the two on a busy shared host, where the
wall clock swings with the neighbours' load). Pin OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from backend import gemm
from backend.rollout import decode_attention, fast_decode
from backend.spec import RunSpec
from bench.common import run_ours
from bench.vs_trl import SHAPES, WARMUP, shape_model, shape_spec

# a piece's process-wide switch: set(enabled) -> the previous setting
SWITCHES: dict[str, Callable[[bool], bool]] = {"lean": fast_decode.set_lean, "gemm": gemm.set_enabled,
                                               "kernel": decode_attention.set_enabled}
PIECES = ("lean", "tape", "gemm", "kernel")


@dataclass(frozen=True)
class StepTime:
    seconds: float  # wall clock per step after the warm-up
    cpu: float  # CPU seconds of this process per step, same steps
    rollout: float  # the rollout's share of the step


def step_time(spec: RunSpec, off: str = "") -> StepTime:
    """Our trainer on `spec` with the piece `off` turned off (its switch restored after the run)."""
    switch = SWITCHES.get(off)
    before = switch(False) if switch else None
    try:
        ends: list[tuple[float, float]] = []
        rows = run_ours(spec, on_step=lambda trainer, row: ends.append((time.time(), time.process_time())))[WARMUP:]
    finally:
        if switch:
            switch(before)
    n = len(ends) - WARMUP
    rollout = sum(r["timing/rollout_s"] for r in rows) / sum(r["timing/step_s"] for r in rows)
    return StepTime((ends[-1][0] - ends[WARMUP - 1][0]) / n, (ends[-1][1] - ends[WARMUP - 1][1]) / n, rollout)


def load() -> str:
    """The host's 1-, 5- and 15-minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Speedup:
    """A piece's (step time with it off) / (with all on), one entry per round."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def speedups(spec: RunSpec, pieces: list[str], repeats: int) -> dict[str, Speedup]:
    """Per piece, its speed-up in each round (module docstring)."""
    tape_off = spec.model_copy(deep=True)
    tape_off.resources.activation_reuse_mb = 0
    runs: list[tuple[str, Callable[[], StepTime]]] = [("", lambda: step_time(spec))]
    runs += [(p, (lambda: step_time(tape_off)) if p == "tape" else (lambda p=p: step_time(spec, p))) for p in pieces]
    warm = spec.model_copy(deep=True)
    warm.algorithm.max_steps = WARMUP + 1
    step_time(warm)  # the throwaway warm-up run
    ratios = {p: Speedup() for p in pieces}
    for i in range(repeats):
        times: dict[str, StepTime] = {}
        for off, run in runs if i % 2 == 0 else runs[::-1]:
            times[off] = t = run()
            print(f"  round {i + 1} {off + ' off' if off else 'all on':10s} {t.seconds:.3f} s/step (CPU {t.cpu:.3f} s, "
                  f"rollout {t.rollout:.0%}) load {load()}", flush=True)
        for p in pieces:
            ratios[p].wall.append(times[p].seconds / times[""].seconds)
            ratios[p].cpu.append(times[p].cpu / times[""].cpu)
        print(f"  round {i + 1} speed-ups: " + ", ".join(f"{p} {ratios[p].wall[-1]:.3f}x (CPU {ratios[p].cpu[-1]:.3f}x)"
                                                         for p in pieces), flush=True)
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["preset", "long"])
    ap.add_argument("--repeats", type=int, default=2, help="rounds; every other one in reverse order")
    ap.add_argument("--pieces", nargs="+", choices=PIECES, default=list(PIECES))
    ap.add_argument("--steps", type=int, default=0, help="steps per run (0 = the shape's default)")
    args = ap.parse_args()
    summary = []
    with tempfile.TemporaryDirectory(prefix="bench-fast-paths-") as tmp:
        for name in args.shapes:
            shape = SHAPES[name] if not args.steps else replace(SHAPES[name], steps=args.steps)
            print(f"== {name}: {shape.prompts} x {shape.generations} completions of <= {shape.max_tokens} tokens, "
                  f"{shape.steps} steps, load {load()}", flush=True)
            ratios = speedups(shape_spec(shape, shape_model(shape, Path(tmp)), []), args.pieces, args.repeats)
            line = f"{name:7s} " + " | ".join(
                f"{p} {statistics.median(r.wall):.2f}x, per CPU second {statistics.median(r.cpu):.2f}x "
                f"(rounds {', '.join(f'{x:.3f}' for x in r.wall)}; CPU {', '.join(f'{x:.3f}' for x in r.cpu)})"
                for p, r in ratios.items())
            print(line, flush=True)
            summary.append(line)
    print("\nsummary: each piece's speed-up (step time off / on), median over rounds, wall clock and per CPU second")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
