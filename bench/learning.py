"""Held-out accuracy of the shipped model before and after GRPO, ours vs TRL for the same wall-clock time.

    python -m bench.learning [--minutes 5] [--skip-trl] [--set section.field=value ...]

Accuracy is greedy exact match on assets/data/add_test.jsonl (500 sums never used for training).
Our run uses presets/tiny-cpu.yaml as shipped (overridable); TRL gets the same model, data, rewards,
batch and learning rate, in float32 without gradient checkpointing, and the same time budget.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.data import load_rows
from backend.eval.greedy import greedy_eval
from backend.rewards.scorer import RewardScorer
from backend.rollout.hf import HFEngine
from backend.spec import RunSpec, load_spec
from bench.common import ROOT, TINY, run_ours, trl_trainer


def accuracy(model, tok, spec: RunSpec) -> float:
    rows = load_rows(spec.data.eval_sources, spec.data, 0, ROOT)
    scorer = RewardScorer(spec.rewards)
    res = greedy_eval(HFEngine(model, tok), tok, rows, spec.data, scorer, spec.rollout.max_completion_length)
    return res["eval/rewards/exact_match/mean"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    budget = args.minutes * 60
    spec = load_spec(TINY, ["algorithm.max_steps=1000000", "output.save_steps=0", "output.eval_steps=0",
                            "output.log_samples_steps=0", *args.overrides])
    tok = AutoTokenizer.from_pretrained(ROOT / spec.model.name_or_path)
    base = AutoModelForCausalLM.from_pretrained(ROOT / spec.model.name_or_path, dtype=torch.float32)
    before = accuracy(base, tok, spec)
    print(f"held-out greedy accuracy before: {before:.3f}", flush=True)
    figures: dict[str, float] = {"before": before, "budget_s": budget}

    holder: dict[str, object] = {}
    start = time.time()

    def until_budget(trainer, row) -> None:  # noqa: ANN001
        holder["model"] = trainer.policy
        if time.time() - start >= budget:
            trainer.stop_at_step = trainer.step

    rows = run_ours(spec, on_step=until_budget)
    figures["ours_after"] = accuracy(holder["model"], tok, spec)
    figures["ours_steps"] = len(rows)
    print(f"ours: {len(rows)} steps in {time.time() - start:.0f}s -> accuracy {figures['ours_after']:.3f} "
          f"({100 * (figures['ours_after'] - before):+.1f} points)", flush=True)

    if not args.skip_trl:
        from transformers import TrainerCallback

        class Budget(TrainerCallback):
            def __init__(self) -> None:
                self.start = time.time()

            def on_step_end(self, a, state, control, **kw):  # noqa: ANN001
                if time.time() - self.start >= budget:
                    control.should_training_stop = True

        trl_spec = spec.model_copy(deep=True)
        trl_spec.algorithm.max_steps = 1000000
        t0 = time.time()
        trainer = trl_trainer(trl_spec, [Budget()])
        trainer.train()
        figures["trl_after"] = accuracy(trainer.model, tok, spec)
        figures["trl_steps"] = trainer.state.global_step
        print(f"trl:  {trainer.state.global_step} steps in {time.time() - t0:.0f}s -> accuracy "
              f"{figures['trl_after']:.3f} ({100 * (figures['trl_after'] - before):+.1f} points)", flush=True)

    print(f"gain ours {100 * (figures['ours_after'] - before):+.1f} points in {args.minutes:g} min (target >= +30)"
          + (f"; TRL {100 * (figures['trl_after'] - before):+.1f}" if "trl_after" in figures else ""))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
