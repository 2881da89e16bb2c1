"""Held-out accuracy of the shipped model under GRPO, ours vs TRL, for the same wall-clock time.

    python -m bench.learning [--minutes 5] [--seeds 0 1 2] [--evals 10] [--clock wall|cpu] [--skip-trl] [--set ...]

Accuracy is greedy exact match on assets/data/add_test.jsonl (500 sums never used for training).
Our run uses presets/tiny-cpu.yaml as shipped (overridable); TRL gets the same model, data, rewards,
batch, learning rate and schedule (over the preset's max_steps), in float32 without gradient checkpointing,
and the same time budget; TRL has no counterpart of algorithm.skip_solved_prompts (it samples every prompt in
turn) or algorithm.replay_solved (it learns nothing from a group that all fails), so those options are part of
what is compared. A run ends when its budget is spent or at max_steps, whichever comes first.
Both trainers are evaluated at the same moments of their training time (the clock stops while evaluating),
and the figure reported is the gain of the mean of the last 3 evaluations: one lucky evaluation does not count.
The budget is wall clock; on a shared machine `--clock cpu` budgets CPU time instead: this process's and its
rollout workers' (with OMP_NUM_THREADS=1 that is what the run would take on a quiet machine with one core).
Each run also prints the CPU seconds it got.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.data import load_rows
from backend.eval.greedy import greedy_eval
from backend.rewards.scorer import RewardScorer
from backend.rollout.hf import HFEngine
from backend.spec import RunSpec, load_spec
from bench.common import ROOT, TINY, cpu_seconds, run_ours, trl_trainer

LAST = 3  # evaluations averaged at the end


def accuracy(model, tok, spec: RunSpec) -> float:
    rows = load_rows(spec.data.eval_sources, spec.data, 0, ROOT)
    scorer = RewardScorer(spec.rewards)
    was_training = model.training
    res = greedy_eval(HFEngine(model, tok), tok, rows, spec.data, scorer, spec.rollout.max_completion_length)
    model.train(was_training)
    return res["eval/rewards/exact_match/mean"]


@dataclass
class Budget:
    """Training time (evaluations excluded) and evaluations at evenly spaced moments of it."""

    seconds: float
    evals: int
    tok: object
    spec: RunSpec
    clock: str = "wall"
    start: float = 0.0
    paused: float = 0.0
    cpu_start: float = 0.0
    curve: list[tuple[float, int, float]] = field(default_factory=list)  # (train seconds, step, accuracy)

    def now(self) -> float:
        return cpu_seconds() if self.clock == "cpu" else time.time()

    def begin(self) -> None:
        self.start, self.cpu_start = self.now(), cpu_seconds()

    def cpu(self) -> float:
        return cpu_seconds() - self.cpu_start

    def spent(self) -> float:
        return self.now() - self.start - self.paused

    def at_step_end(self, model, step: int) -> bool:
        """Evaluate when due; True once the budget is spent (after a final evaluation)."""
        spent = self.spent()
        over = spent >= self.seconds
        if over or spent >= self.seconds * (len(self.curve) + 1) / self.evals:
            t0 = self.now()
            self.curve.append((spent, step, accuracy(model, self.tok, self.spec)))
            self.paused += self.now() - t0
            print(f"  eval at {spent:.0f}s ({self.clock}) step {step}: {self.curve[-1][2]:.3f}", flush=True)
        return over

    def finish(self, model=None, step: int = 0) -> Budget:  # noqa: ANN001
        """A run that ended (max_steps) before its budget gets its final evaluation here."""
        if model is not None and (not self.curve or self.curve[-1][1] != step):
            self.curve.append((self.spent(), step, accuracy(model, self.tok, self.spec)))
        return self

    def final(self) -> float:
        return statistics.mean(a for _, _, a in self.curve[-LAST:])


def run_ours_budget(spec: RunSpec, budget: Budget) -> Budget:
    last: dict[str, object] = {}

    def on_step(trainer, row) -> None:  # noqa: ANN001
        last.update(model=trainer.policy, step=trainer.step)
        if budget.at_step_end(trainer.policy, trainer.step):
            trainer.stop_at_step = trainer.step

    budget.begin()
    run_ours(spec, on_step=on_step)
    return budget.finish(last["model"], last["step"])


def run_trl_budget(spec: RunSpec, budget: Budget) -> Budget:
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        def on_step_end(self, a, state, control, model=None, **kw):  # noqa: ANN001
            if budget.at_step_end(model, state.global_step):
                control.should_training_stop = True

    trainer = trl_trainer(spec, [Stop()])
    budget.begin()
    trainer.train()
    return budget.finish(trainer.model, trainer.state.global_step)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--evals", type=int, default=10, help="evaluations spread over the budget")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="what the budget counts")
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--skip-ours", action="store_true", help="TRL only (e.g. its seeds in a parallel process)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    budget_s = args.minutes * 60
    # the budget or the preset's max_steps ends the run, whichever comes first: the preset's schedule decays
    # over max_steps, sized to end near 5 minutes here (pass --set algorithm.max_steps=... to change it)
    base_spec = load_spec(TINY, ["output.save_steps=0", "output.eval_steps=0", "output.log_samples_steps=0",
                                 *args.overrides])
    tok = AutoTokenizer.from_pretrained(ROOT / base_spec.model.name_or_path)
    base = AutoModelForCausalLM.from_pretrained(ROOT / base_spec.model.name_or_path, dtype=torch.float32)
    before = accuracy(base, tok, base_spec)
    print(f"held-out greedy accuracy before: {before:.3f}; budget {args.minutes:g} min of training per run, "
          f"{args.evals} evaluations, gain = mean of the last {LAST} - before", flush=True)
    a = base_spec.algorithm
    print(f"preset: lr {a.learning_rate} {a.lr_scheduler} warmup {a.warmup_steps} max_steps {a.max_steps}, "
          f"{a.prompts_per_step} x {base_spec.rollout.num_generations}, mu {a.num_iterations}, loss {a.loss_type}",
          flush=True)
    figures: dict[str, object] = {"before": before, "budget_s": budget_s, "runs": []}
    gains: dict[str, list[float]] = {"ours": [], "trl": []}
    for seed in args.seeds:
        spec = base_spec.model_copy(deep=True)
        spec.algorithm.seed = seed
        runners = ({} if args.skip_ours else {"ours": run_ours_budget}) | ({} if args.skip_trl else {"trl": run_trl_budget})
        for name, fn in runners.items():
            b = fn(spec, Budget(budget_s, args.evals, tok, spec, args.clock))
            gain = b.final() - before
            gains[name].append(gain)
            curve = " ".join(f"{acc:.3f}" for _, _, acc in b.curve)
            print(f"seed {seed} {name:4s}: {b.curve[-1][1]} steps in {b.curve[-1][0]:.0f}s ({args.clock}; "
                  f"{b.cpu():.0f} CPU s incl. evaluations) -> {b.final():.3f} "
                  f"({100 * gain:+.1f} points); curve {curve}", flush=True)
            figures["runs"].append({"seed": seed, "trainer": name, "gain": gain, "cpu_s": b.cpu(), "curve": b.curve})
    parts = [f"{name} {100 * statistics.mean(g):+.1f} points" for name, g in gains.items() if g]
    line = f"mean gain over {len(args.seeds)} seed(s): " + "; ".join(parts) + " (target: ours >= +50)"
    if gains["ours"] and gains["trl"]:
        ours, trl = statistics.mean(gains["ours"]), statistics.mean(gains["trl"])
        line += f"; ratio {ours / trl if trl > 0 else float('inf'):.2f}x (target >= 2x)"
    print(line, flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
