"""Tool-use GRPO on the shipped tiny model: held-out greedy accuracy with the greedy tool loop, before and after.

    python -m bench.tools_learning [--seeds 0 1 2] [--steps 150] [--skip-control]

Each seed trains presets/tiny-tools-cpu.yaml for --steps steps (eval on the 500 held-out sums every 25 steps,
through the same tool loop as training: backend.eval.greedy with the run's episodes). The base model is evaluated
once with `python -m backend.eval` and the add tool. The control trains the same preset with the tools removed
(tools.functions=[]): the model must add in its head, as it was never able to. Prints a table and JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "presets" / "tiny-tools-cpu.yaml"


def base_accuracy(out: Path, tools: bool) -> dict[str, float]:
    cmd = [sys.executable, "-m", "backend.eval", "--model", "assets/tiny-tools", "--data", "assets/data/tools_test.jsonl",
           "--rewards", "exact_match", "--max-tokens", "96", "--out", str(out)]
    if tools:
        cmd += ["--tools", "add", "--tool-files", "presets/tools/calculator.py"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    m = json.loads((out / "results.json").read_text())["metrics"]
    return {"accuracy": m["accuracy"], "tool_calls": m.get("tools/call_frequency", 0.0)}


def train(runs: Path, seed: int, steps: int, tools: bool) -> dict[str, object]:
    sets = [f"output.runs_dir={runs}", f"algorithm.seed={seed}", f"algorithm.max_steps={steps}", "output.eval_steps=25",
            "output.save_steps=0"]
    if not tools:
        sets += ["tools.functions=[]", "tools.files=[]"]
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "backend.train", "--config", str(PRESET),
                           *[x for s in sets for x in ("--set", s)]], cwd=ROOT, check=True, capture_output=True, text=True)
    wall = time.time() - t0
    run = Path(proc.stdout.splitlines()[0].strip())
    evals = [json.loads(line) for line in (run / "eval" / "during_training.jsonl").read_text().splitlines()]
    last = evals[-1]
    return {"seed": seed, "tools": tools, "wall_s": round(wall, 1),
            "curve": [(e["step"], round(e["eval/rewards/exact_match/mean"], 3)) for e in evals],
            "accuracy": last["eval/rewards/exact_match/mean"], "tool_calls": last.get("eval/tools/call_frequency", 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--skip-control", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = base_accuracy(Path(tmp) / "base", tools=True)
        base_plain = base_accuracy(Path(tmp) / "base-plain", tools=False)
        runs = [train(Path(tmp) / "runs", s, args.steps, True) for s in args.seeds]
        control = None if args.skip_control else train(Path(tmp) / "runs", args.seeds[0], args.steps, False)
    print(f"base model, greedy with the tool loop: accuracy {base['accuracy']:.3f}, tool calls per episode "
          f"{base['tool_calls']:.3f}; without tools: accuracy {base_plain['accuracy']:.3f}")
    print("| seed | steps | wall s | accuracy | gain (points) | tool calls/episode | curve (step, accuracy) |")
    print("|---|---|---|---|---|---|---|")
    for r in runs + ([control] if control else []):
        ref = base if r["tools"] else base_plain
        label = str(r["seed"]) + ("" if r["tools"] else " (control: no tools)")
        print(f"| {label} | {args.steps} | {r['wall_s']} | {r['accuracy']:.3f} | "
              f"{100 * (r['accuracy'] - ref['accuracy']):+.1f} | {r['tool_calls']:.3f} | {r['curve']} |")
    mean = statistics.mean(r["accuracy"] for r in runs)
    print(f"mean over {len(runs)} seeds: {mean:.3f} ({100 * (mean - base['accuracy']):+.1f} points)")
    print(json.dumps({"base": base, "base_without_tools": base_plain, "runs": runs, "control": control}))


if __name__ == "__main__":
    main()
