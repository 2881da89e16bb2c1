"""Evaluation figures: throughput of each installed engine on the tiny model, and accuracy before/after
the tiny preset, all through `backend.eval` (the same code path as `python -m backend.eval`).

    python -m bench.eval [--engines hf,vllm] [--steps 300] [--skip-train] [--device cpu]

Throughput = completions / generation seconds (model load and scoring excluded) on the 500 held-out
sums, greedy (n=1) and sampled (n=8, temperature 1); accuracy = greedy exact match on the same sums.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path

from backend.eval.options import EvalConfig
from backend.eval.run import run_eval
from bench.common import ROOT, TINY

DATA = str(ROOT / "assets/data/add_test.jsonl")


def evaluate(model: str, out: Path, engine: str = "hf", n: int = 1, device: str = "cpu") -> dict:
    cfg = EvalConfig(model=model, data=DATA, ks=[1] if n == 1 else [1, n], n=n, temperature=None if n == 1 else 1.0,
                     max_tokens=6, batch=500, rewards=["exact_match"], engine=engine,
                     device=device, out=str(out), base_dir=str(ROOT))
    return run_eval(cfg, log=lambda s: None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="hf")
    ap.add_argument("--steps", type=int, default=300, help="tiny preset steps (300 = as shipped)")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    figures: dict = {"throughput_samples_per_s": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in a.engines.split(","):
            if engine != "hf" and importlib.util.find_spec(engine) is None:
                print(f"{engine}: not installed here, skipped")
                continue
            for n in (1, 8):
                res = evaluate(str(ROOT / "assets/tiny-add"), Path(tmp) / f"{engine}-{n}", engine, n, a.device)
                sps = res["timing"]["samples_per_s"]
                figures["throughput_samples_per_s"][f"{engine} n={n}"] = sps
                print(f"{engine:8s} n={n}: {sps:8.1f} samples/s  ({res['timing']['generate_s']:.2f} s for "
                      f"{500 * n} completions; accuracy {res['metrics']['accuracy']:.3f})")
        if not a.skip_train:
            from backend.rundir import create_run
            from backend.spec import load_spec
            from backend.train.loop import GRPOTrainer

            spec = load_spec(TINY, [f"output.runs_dir={tmp}/runs", f"algorithm.max_steps={a.steps}",
                                    "output.eval_steps=0", "output.save_steps=0", "output.log_samples_steps=0"])
            run = create_run(spec, ROOT)
            GRPOTrainer(spec, run, ROOT).setup().train()
            before = evaluate(f"{run.path}:base", Path(tmp) / "before")["metrics"]["accuracy"]
            after = evaluate(str(run.path), Path(tmp) / "after")["metrics"]["accuracy"]
            figures.update(accuracy_before=before, accuracy_after=after, steps=a.steps)
            print(f"tiny preset, {a.steps} steps: greedy held-out accuracy {before:.3f} -> {after:.3f}")
    if a.json:
        a.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
