"""Step time under 1 and 2 training ranks on CPU, plain torch.distributed and each DeepSpeed ZeRO stage.

    python -m bench.scale [--steps 8] [--ranks 2] [--set section.field=value ...]

Each configuration trains the tiny preset (same global batch, same seed) as `python -m backend.train`
would launch it (torchrun with gloo for 2 ranks) and prints, side by side: median seconds per step,
median training seconds (loss passes, gradient reduction, update) per step, the speed-up over 1 rank,
and the communication share of a training step. Communication is what the ranks spend in collectives:
the rollout broadcast, the normaliser counts and gradient all-reduce for stage 0 (timed by the
trainer), and every DeepSpeed collective for stages 1-3 (DeepSpeed's comms logger, which synchronises
each op, so those stages run slightly slower here than without it). The first 2 steps are warm-up.
On 2 CPU cores shared by both ranks, 2 ranks cannot be faster than 1: the figures show the overhead
each mode adds; on GPUs each rank has its own device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from backend.rundir import RunDir, read_jsonl
from bench.common import ROOT, TINY

WARMUP = 2


def run_config(name: str, overrides: list[str], steps: int, tmp: Path) -> dict[str, float]:
    args = [f"output.runs_dir={tmp / name}", "output.eval_steps=0", "output.save_steps=0", "output.log_samples_steps=0",
            "resources.device=cpu", f"algorithm.max_steps={steps}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "backend.train", "--config", str(TINY),
                           *sum((["--set", a] for a in args), [])], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    rows = read_jsonl(RunDir(proc.stdout.splitlines()[0].strip()).metrics_path)[0][WARMUP:]
    train = statistics.median(r["timing/train_s"] for r in rows)
    comm = statistics.median(r.get("timing/comm_s", 0.0) for r in rows)
    return {"step_s": statistics.median(r["timing/step_s"] for r in rows), "train_s": train,
            "comm_share": comm / train if train else 0.0, "loss_end": rows[-1]["loss"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        comms = tmp / "comms.json"
        comms.write_text(json.dumps({"comms_logger": {"enabled": True, "prof_all": True, "verbose": False}}))
        n = f"resources.nproc_per_node={args.ranks}"
        configs = [("1 rank", []), (f"{args.ranks} ranks, torch.distributed", [n])]
        configs += [(f"{args.ranks} ranks, ZeRO-{s}", [n, f"resources.deepspeed_stage={s}",
                                                        f"resources.deepspeed_config={comms}"]) for s in (1, 2, 3)]
        results = {}
        for name, over in configs:
            results[name] = run_config(name.replace(" ", "_").replace(",", ""), [*over, *args.overrides], args.steps, tmp)
            print(f"  done: {name}", file=sys.stderr, flush=True)
    base = results["1 rank"]["step_s"]
    print(f"{'configuration':34} {'s/step':>8} {'train s':>8} {'vs 1 rank':>10} {'comm share':>11}")
    for name, r in results.items():
        print(f"{name:34} {r['step_s']:8.3f} {r['train_s']:8.3f} {base / r['step_s']:9.2f}x {100 * r['comm_share']:10.1f}%")


if __name__ == "__main__":
    main()
