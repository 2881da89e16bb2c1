"""Page faults and step time of CPU training steps with and without memory.keep_freed_memory.

    python -m bench.malloc [--steps 20] [--windows 3]

Each side runs in a fresh interpreter (malloc settings are process-wide): the tiny model, forward, backward,
fused AdamW, gradients set to None, one torch thread. After 3 warm-up steps it prints, per window of `steps`
steps, the minor page faults and wall seconds per step, then the ratio without / with. How much the setting
pays depends on glibc's dynamic mmap threshold, which the allocation history moves, so it is a figure here
and not a test (tests/test_grpo_math.py checks what the setting does to malloc itself).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from backend.project import PROJECT_ROOT

SCRIPT = """
import json, resource, sys, time, torch
from transformers import AutoModelForCausalLM
from backend.train.memory import keep_freed_memory
torch.set_num_threads(1)
if sys.argv[1] == "1":
    assert keep_freed_memory()
model = AutoModelForCausalLM.from_pretrained("assets/tiny-add", dtype=torch.float32)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
ids = torch.randint(2, 100, (16, 12))
def step():
    model(input_ids=ids).logits.sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
for _ in range(3):
    step()
out = []
for _ in range(int(sys.argv[3])):
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    for _ in range(int(sys.argv[2])):
        step()
    out.append(((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / int(sys.argv[2]),
                (time.perf_counter() - t0) / int(sys.argv[2])))
print(json.dumps(out))
"""


def run(on: bool, steps: int, windows: int) -> list[tuple[float, float]]:
    """[(page faults per step, seconds per step)] per window, in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, "1" if on else "0", str(steps), str(windows)],
                          capture_output=True, text=True, check=True, cwd=PROJECT_ROOT,
                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    return [tuple(w) for w in json.loads(proc.stdout.split("\n")[-2])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--windows", type=int, default=3)
    args = parser.parse_args()
    results = {on: run(on, args.steps, args.windows) for on in (False, True)}
    for on, windows in results.items():
        cells = "  ".join(f"{f:7.0f} faults {s * 1000:6.1f} ms" for f, s in windows)
        print(f"keep_freed_memory={'on ' if on else 'off'}  per step, by window: {cells}")
    faults = {on: statistics.median(f for f, _ in w) for on, w in results.items()}
    secs = {on: statistics.median(s for _, s in w) for on, w in results.items()}
    print(f"median faults per step off/on: {faults[False]:.0f} / {faults[True]:.0f};"
          f" step time off / on: {secs[False] / secs[True]:.2f}x")


if __name__ == "__main__":
    main()
