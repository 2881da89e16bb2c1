"""Side by side: our trainer vs TRL's GRPOTrainer, same model, data, rewards and batch, over four shapes.

    python -m bench.vs_trl [--shapes small preset long 20m] [--repeats 2] [--async] [--set section.field=value ...]

Shapes (prompts x completions, max completion tokens):
    small   2 x 8, <= 16   the shipped tiny model: per-call overhead dominates
    preset  8 x 8, <= 6    presets/tiny-cpu.yaml's model, reward and rollout (replay_solved and skip_solved_prompts off, as in TRL)
    long    8 x 8, <= 128  a random-initialised copy of the tiny model that never stops early
    20m     4 x 8, <= 32   a random-initialised ~20 M-parameter Qwen2 that never stops early: compute dominates
Random models are made in a temp dir at run time (nothing is downloaded); "never stops" means EOS is a token
past the model's vocabulary, so every completion is max length in both trainers. A random model's rewards are
exact_match and a character repetition penalty, which differs between its completions: with exact_match alone
every group would tie and our loss pass would skip them all (exactly: their gradient is zero), so a compute shape
would time no training on our side. The share of groups that trained is printed with our step's split.

Both trainers are timed by wall clock between step ends (logging included), after WARMUP steps; the ratio per CPU
second (CPU time over the same steps, of this process and its children such as rollout workers) is printed beside
it, as it holds on a busy shared machine where wall clock swings with the neighbours' load (single-threaded: pin
OMP_NUM_THREADS=1). With --async two more columns: rollout.async_generation with the engine in this process (a
sampling thread over a copy of the weights) and with the hf engine in its own worker process (placement
separate: sampling and training overlap on two cores; its per-CPU-second ratio counts both processes), and TRL run
with two torch threads and ours with two torch threads, so the two-core modes are also compared with TRL's better
use of two cores (the last figure: our fastest mode over TRL's faster run). Printed per
shape: seconds per step, completion tokens per second, the ratio ours/TRL, the share of our step in each phase
(from our metrics: rollout, reward, training forward+backward, optimizer, the rest), and the decode loop's time
per token against the model's bare forward time for one token at that batch size (1.00 = no loop overhead).
TRL runs without gradient checkpointing, in the spec's dtype like ours: float32 by default (TRL's best at the
small shapes here), `--set model.dtype=bfloat16` runs both under bf16 autocast over float32 weights (TRL's best at
the compute-bound shapes on a CPU with AVX512-BF16). Pin OMP_NUM_THREADS=1 for a fair comparison.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.spec import RewardFunction, RunSpec
from bench.common import StepClock, cpu_seconds, param_count, random_model, run_ours, tiny_spec, trl_trainer

WARMUP = 3
PHASES = ("timing/rollout_s", "timing/reward_s", "timing/forward_backward_s", "timing/optimizer_s")


@dataclass(frozen=True)
class Shape:
    name: str
    prompts: int
    generations: int
    max_tokens: int
    steps: int
    model: str = ""  # "" = the shipped tiny model; "copy" / "20m" = random-initialised


# steps per run: enough that each timed window lasts seconds (the small shape's step is ~45 ms: 40 steps timed
# under 2 s, where one scheduler hiccup on a shared host moved the ratio by 0.3)
SHAPES = {
    "small": Shape("small", 2, 8, 16, 150),
    "preset": Shape("preset", 8, 8, 6, 100),
    "long": Shape("long", 8, 8, 128, 8, "copy"),
    "20m": Shape("20m", 4, 8, 32, 6, "20m"),
}


def shape_model(shape: Shape, tmp: Path) -> Path | None:
    """The shape's random-initialised model, made under `tmp`; None for the shipped tiny model."""
    if shape.model == "copy":
        return random_model(tmp / "copy")
    if shape.model == "20m":
        return random_model(tmp / "20m", hidden=512, layers=6, intermediate=1536, heads=8)
    return None


def shape_spec(shape: Shape, model_dir: Path | None, overrides: list[str]) -> RunSpec:
    # the objective TRL runs: the preset's replay_solved and skip_solved_prompts change which groups train (work
    # per step), not how fast a step runs, and TRL has neither
    sets = [f"algorithm.max_steps={shape.steps}", f"algorithm.prompts_per_step={shape.prompts}",
            f"rollout.num_generations={shape.generations}", f"rollout.max_completion_length={shape.max_tokens}",
            "algorithm.replay_solved=false", "algorithm.skip_solved_prompts=0"]
    if model_dir is not None:
        sets.append(f"model.name_or_path={model_dir}")
    spec = tiny_spec([*sets, *overrides])
    if model_dir is not None:
        # a random model never answers exactly: with exact_match alone every group's rewards tie, our loss pass
        # skips them all (exact: their gradient is zero) and only TRL would train. A character repetition
        # penalty (1 - distinct characters / characters) differs between random completions, so both trainers run
        # the whole step
        spec.rewards.functions = [RewardFunction(name="exact_match"),
                                  RewardFunction(name="repetition", params={"unit": "char", "ngram_size": 1})]
    return spec


def ours(spec: RunSpec) -> dict[str, float]:
    ends: list[tuple[float, float]] = []
    rows = run_ours(spec, on_step=lambda trainer, row: ends.append((time.time(), cpu_seconds())))
    timed = rows[WARMUP:]
    secs = ends[-1][0] - ends[WARMUP - 1][0]
    cpu = ends[-1][1] - ends[WARMUP - 1][1]
    tokens = sum(r["completions/mean_length"] * spec.completions_per_step for r in timed)
    res = {"s_per_step": secs / len(timed), "tok_per_s": tokens / secs, "tok_per_cpu_s": tokens / cpu}
    step = sum(r["timing/step_s"] for r in timed)
    for k in PHASES:
        res[k] = sum(r.get(k, 0.0) for r in timed) / step
    res["other"] = 1.0 - sum(res[k] for k in PHASES)
    # groups whose rewards all tie skip our loss pass (exact) but not TRL's: shown, so a shape where none train is seen
    res["groups_trained"] = 1.0 - sum(r["frac_reward_zero_std"] for r in timed) / len(timed)
    return res


def trl(spec: RunSpec, threads: int = 0) -> dict[str, float]:
    """TRL's trainer timed like ours; `threads` > 0 runs it with that many torch threads (then restores)."""
    clock = StepClock()
    trainer = trl_trainer(spec, [clock])
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        trainer.train()
    finally:
        torch.set_num_threads(before)
    logs = [h for h in trainer.state.log_history if "reward" in h]
    times = clock.times
    secs = times[-1] - times[WARMUP]
    cpu = clock.cpu[-1] - clock.cpu[WARMUP]
    tokens = sum(h["completions/mean_length"] * spec.completions_per_step for h in logs[WARMUP:])
    return {"s_per_step": secs / (len(times) - 1 - WARMUP), "tok_per_s": tokens / secs, "tok_per_cpu_s": tokens / cpu}


def decode_vs_forward(spec: RunSpec, repeats: int = 5) -> dict[str, float]:
    """ms per decoded token position of our engine, and of the model's bare forward of one token per row
    with a KV cache as long as the mean context (what a decode step cannot go below without a faster model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    from backend.data import load_rows, render_prompt
    from backend.rollout.base import PromptInput, SamplingParams
    from backend.rollout.hf import HFEngine
    from bench.common import ROOT

    path = ROOT / spec.model.name_or_path
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = load_rows(spec.data.sources, spec.data, 0, ROOT)[: spec.algorithm.prompts_per_step]
    prompts = [PromptInput(tok(render_prompt(r, spec.data, tok), add_special_tokens=False)["input_ids"]) for r in rows]
    r = spec.rollout
    engine = HFEngine(model, tok)
    sp = SamplingParams(n=r.num_generations, max_tokens=r.max_completion_length, temperature=r.temperature, seed=0)
    engine.generate(prompts, sp)  # warm-up
    per_token = []
    for i in range(repeats):
        t0 = time.perf_counter()
        out = engine.generate(prompts, SamplingParams(**{**sp.__dict__, "seed": i}))
        steps = max(len(c.token_ids) for g in out for c in g)
        per_token.append((time.perf_counter() - t0) / steps)
    B = len(prompts) * r.num_generations
    ctx = max(len(p.token_ids) for p in prompts) + r.max_completion_length // 2
    ids = torch.randint(2, model.config.vocab_size, (B, ctx + 1))
    with torch.no_grad():
        cache = DynamicCache()
        model(input_ids=ids[:, :ctx], past_key_values=cache, use_cache=True, logits_to_keep=1)
        bare = []
        for _ in range(repeats * 4):
            t0 = time.perf_counter()
            model(input_ids=ids[:, ctx:], past_key_values=cache, use_cache=True)
            bare.append(time.perf_counter() - t0)
            cache.crop(-1)  # drop the token just appended
    return {"decode_ms": 1000 * statistics.median(per_token), "forward_ms": 1000 * statistics.median(bare)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--steps", type=int, default=0, help="steps per run (0 = the shape's default)")
    ap.add_argument("--repeats", type=int, default=2, help="alternate ours/TRL this many times; medians are shown")
    ap.add_argument("--async", dest="with_async", action="store_true", help="also time our async-rollout mode")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    summary = []
    with tempfile.TemporaryDirectory(prefix="vs-trl-models-") as tmp:
        for name in args.shapes:
            shape = SHAPES[name]
            if args.steps:
                shape = Shape(shape.name, shape.prompts, shape.generations, shape.max_tokens, args.steps, shape.model)
            model_dir = shape_model(shape, Path(tmp))
            spec = shape_spec(shape, model_dir, args.overrides)
            params = param_count(model_dir) if model_dir else None
            print(f"== {name}: {shape.prompts} x {shape.generations} completions of <= {shape.max_tokens} tokens, "
                  f"{shape.steps} steps, model {'tiny-add' if model_dir is None else f'random {params / 1e6:.1f}M'}",
                  flush=True)
            runners = {"ours": lambda s=spec: ours(s), "trl": lambda s=spec: trl(s)}
            if args.with_async:
                a_spec = spec.model_copy(deep=True)
                a_spec.rollout.async_generation = True
                runners["ours-async"] = lambda s=a_spec: ours(s)
                w_spec = a_spec.model_copy(deep=True)
                w_spec.rollout.placement = "separate"  # the hf engine in its own worker process
                runners["ours-worker"] = lambda s=w_spec: ours(s)
                # the worker mode uses two cores: TRL gets two torch threads too, and its better run counts;
                # and ours with two torch threads, the same two cores spent inside each op instead
                runners["trl-2threads"] = lambda s=spec: trl(s, threads=2)
                t_spec = spec.model_copy(deep=True)
                t_spec.resources.num_threads = 2
                runners["ours-2threads"] = lambda s=t_spec: ours(s)
            results: dict[str, list[dict[str, float]]] = {n: [] for n in runners}
            for i in range(args.repeats):
                for n, fn in runners.items():
                    res = fn()
                    results[n].append(res)
                    print(f"  run {i + 1} {n:10s} {res['s_per_step']:.3f} s/step  {res['tok_per_s']:.0f} tok/s", flush=True)
            med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in results.items()}
            dec = decode_vs_forward(spec)
            ratio = med["ours"]["tok_per_s"] / med["trl"]["tok_per_s"]
            shares = "  ".join(f"{k.split('/')[1].removesuffix('_s')} {100 * med['ours'][k]:.0f}%" for k in PHASES)
            line = (f"{name:7s} ours {med['ours']['s_per_step']:.3f} s/step {med['ours']['tok_per_s']:7.0f} tok/s | "
                    f"TRL {med['trl']['s_per_step']:.3f} s/step {med['trl']['tok_per_s']:7.0f} tok/s | "
                    f"ratio {ratio:.2f}x (per CPU second: {med['ours']['tok_per_cpu_s'] / med['trl']['tok_per_cpu_s']:.2f}x)")
            for mode, label in (("ours-async", "async"), ("ours-worker", "async worker process")):
                if mode in med:
                    line += (f" | {label} {med[mode]['tok_per_s'] / med['trl']['tok_per_s']:.2f}x (per CPU second "
                             f"{med[mode]['tok_per_cpu_s'] / med['trl']['tok_per_cpu_s']:.2f}x)")
            if "trl-2threads" in med:
                best = max(med["trl"]["tok_per_s"], med["trl-2threads"]["tok_per_s"])
                ours_best = max(med[m]["tok_per_s"] for m in ("ours", "ours-async", "ours-worker", "ours-2threads"))
                line += (f" | TRL with 2 threads {med['trl-2threads']['tok_per_s'] / med['trl']['tok_per_s']:.2f}x its "
                         f"1-thread speed, ours with 2 threads {med['ours-2threads']['tok_per_s'] / med['trl-2threads']['tok_per_s']:.2f}x "
                         f"TRL's; on two cores, our best mode vs TRL's best: {ours_best / best:.2f}x")
            detail = (f"        our step: {shares}  other {100 * med['ours']['other']:.0f}% (groups with differing "
                      f"rewards, which train: {100 * med['ours']['groups_trained']:.0f}%) | decode "
                      f"{dec['decode_ms']:.2f} ms/token vs bare forward {dec['forward_ms']:.2f} ms "
                      f"({dec['forward_ms'] / dec['decode_ms']:.2f} of the limit)")
            print(line + "\n" + detail, flush=True)
            summary.append(line + "\n" + detail)
    print("\nsummary (target: ratio >= 2.0x at every shape)")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
