"""Side by side: our trainer vs TRL's GRPOTrainer on the same tiny model, data, rewards and batch.

    python -m bench.vs_trl [--steps 40] [--repeats 2] [--set section.field=value ...]

Prints seconds per step, completion tokens per second, the ratio, and the reward at the end
(mean of the last 5 steps), for our trainer in sync and async-rollout mode and for TRL.
TRL runs at its best here: float32 and no gradient checkpointing.
The first 3 steps of each run are warm-up and not timed.
"""

from __future__ import annotations

import argparse
import statistics

from bench.common import StepClock, run_ours, tiny_spec, trl_trainer

WARMUP = 3


def ours(spec) -> dict[str, float]:
    rows = run_ours(spec)
    timed = rows[WARMUP:]
    secs = sum(r["timing/step_s"] for r in timed)
    tokens = sum(r["completions/mean_length"] * spec.completions_per_step for r in timed)
    return {"s_per_step": secs / len(timed), "tok_per_s": tokens / secs,
            "reward_end": statistics.mean(r["reward"] for r in rows[-5:])}


def trl(spec) -> dict[str, float]:
    clock = StepClock()
    trainer = trl_trainer(spec, [clock])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    times = clock.times
    secs = times[-1] - times[WARMUP]
    tokens = sum(h["completions/mean_length"] * spec.completions_per_step for h in logs[WARMUP:])
    return {"s_per_step": secs / (len(times) - 1 - WARMUP), "tok_per_s": tokens / secs,
            "reward_end": statistics.mean(h["reward"] for h in logs[-5:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2, help="alternate ours/TRL this many times; medians are shown")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    spec = tiny_spec([f"algorithm.max_steps={args.steps}", *args.overrides])
    print(f"task: {spec.model.name_or_path}, {spec.algorithm.prompts_per_step} prompts x {spec.rollout.num_generations} "
          f"completions of <= {spec.rollout.max_completion_length} tokens per step, {args.steps} steps, "
          f"loss {spec.algorithm.loss_type}, lr {spec.algorithm.learning_rate}")
    async_spec = spec.model_copy(deep=True)
    async_spec.rollout.async_generation = True
    runners = {"ours": lambda: ours(spec), "ours-async": lambda: ours(async_spec), "trl": lambda: trl(spec)}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for i in range(args.repeats):
        for name, fn in runners.items():
            res = fn()
            results[name].append(res)
            print(f"  run {i + 1} {name:10s} {res['s_per_step']:.3f} s/step  {res['tok_per_s']:.0f} tok/s  "
                  f"reward at end {res['reward_end']:.3f}", flush=True)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in results.items()}
    print(f"{'':12s}{'s/step':>10s}{'tok/s':>10s}{'reward@end':>12s}")
    for n in runners:
        print(f"{n:12s}{med[n]['s_per_step']:10.3f}{med[n]['tok_per_s']:10.0f}{med[n]['reward_end']:12.3f}")
    print(f"ratio ours/TRL completion tokens per second: {med['ours']['tok_per_s'] / med['trl']['tok_per_s']:.2f}x "
          f"(target >= 1.5x); step time TRL/ours: {med['trl']['s_per_step'] / med['ours']['s_per_step']:.2f}x; "
          f"async/sync: {med['ours-async']['tok_per_s'] / med['ours']['tok_per_s']:.2f}x")


if __name__ == "__main__":
    main()
