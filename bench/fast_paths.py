"""What each CPU fast path of our trainer pays, end to end: our step with it on vs off, side by side.

    python -m bench.fast_paths [--shapes preset long] [--pairs 0] [--pieces lean]

Pieces, each turned off alone with the rest on:
    lean    the lean passes (backend.rollout.fast_decode.set_lean: the hf engine's prefill and decode and the
            training forward)
Per shape of bench.vs_trl and piece: one run of our trainer whose steps alternate, after bench.vs_trl.WARMUP
steps, between the piece on and off (switched between steps), for `pairs` pairs (0: the shape's step count).
Neighbouring steps share the host's load, so on a shared machine whose speed swings with the neighbours' work
the pairs still compare like with like, where whole runs one after another do not. Printed per piece: seconds per
step on and off (wall clock between step ends, and CPU seconds of this process), the host's load, and the
speed-up (step time off / on; per CPU second too, the steadier of the two on a busy host). Pin OMP_NUM_THREADS=1.
A piece stays on the default path only while it pays at least 10% at the shape where it claims to
(bench/RESULTS.md: oneDNN products, a C decode-attention kernel and the activation tape paid less and were removed).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.rollout import fast_decode
from backend.spec import RunSpec
from bench.common import run_ours
from bench.vs_trl import SHAPES, WARMUP, shape_model, shape_spec


def _process_wide(set_enabled: Callable[[bool], bool]) -> Callable[[Any, bool], None]:
    return lambda trainer, on: set_enabled(on)


# a piece's switch, applied between steps: switch(trainer, on)
PIECES: dict[str, Callable[[Any, bool], None]] = {"lean": _process_wide(fast_decode.set_lean)}


@dataclass(frozen=True)
class Paired:
    on: float  # wall-clock seconds per step with the piece on
    off: float
    cpu_on: float  # CPU seconds of this process per step
    cpu_off: float


def paired(spec: RunSpec, piece: str, pairs: int) -> Paired:
    """One run of WARMUP + 2 x pairs steps: the piece on for the warm-up, then off and on by turns (module
    docstring); every switch is on again afterwards."""
    switch = PIECES[piece]
    spec = spec.model_copy(deep=True)
    spec.algorithm.max_steps = WARMUP + 2 * pairs
    ends: list[tuple[float, float]] = []

    def on_step(trainer: Any, row: dict[str, Any]) -> None:
        ends.append((time.time(), time.process_time()))
        done = len(ends)  # steps finished; the next step is done + 1
        if done >= WARMUP:
            switch(trainer, (done - WARMUP) % 2 == 1)  # off for the first step after the warm-up, then by turns

    try:
        run_ours(spec, on_step=on_step)
    finally:
        for fn in PIECES.values():
            fn(None, True)
    wall = {True: 0.0, False: 0.0}
    cpu = {True: 0.0, False: 0.0}
    for i in range(WARMUP, len(ends)):
        on = (i - WARMUP) % 2 == 1
        wall[on] += ends[i][0] - ends[i - 1][0]
        cpu[on] += ends[i][1] - ends[i - 1][1]
    return Paired(*(d[k] / pairs for d in (wall, cpu) for k in (True, False)))


def load() -> str:
    """The host's 1-, 5- and 15-minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["preset", "long"])
    ap.add_argument("--pairs", type=int, default=0, help="on/off step pairs per piece (0 = the shape's step count)")
    ap.add_argument("--pieces", nargs="+", choices=list(PIECES), default=list(PIECES))
    args = ap.parse_args()
    summary = []
    with tempfile.TemporaryDirectory(prefix="bench-fast-paths-") as tmp:
        for name in args.shapes:
            shape = SHAPES[name]
            pairs = args.pairs or shape.steps
            spec = shape_spec(shape, shape_model(shape, Path(tmp)), [])
            print(f"== {name}: {shape.prompts} x {shape.generations} completions of <= {shape.max_tokens} tokens, "
                  f"{pairs} on/off step pairs per piece", flush=True)
            for piece in args.pieces:
                before = load()
                p = paired(spec, piece, pairs)
                line = (f"{name:7s} {piece:7s} on {p.on:.3f} s/step, off {p.off:.3f} s/step: {p.off / p.on:.2f}x | per CPU "
                        f"second: on {p.cpu_on:.3f} s, off {p.cpu_off:.3f} s: {p.cpu_off / p.cpu_on:.2f}x | load "
                        f"{before} -> {load()}")
                print(line, flush=True)
                summary.append(line)
    print("\nsummary: each piece's speed-up (step time off / on) over alternating steps")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
