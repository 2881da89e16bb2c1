"""Memory and speed at a real vocabulary: ours and TRL's trainer, each in a process of its own.

    python -m bench.memory [--vocab 151936] [--tokens 128 1024] [--trainers ours trl] [--steps 3] [--cap-gb 16]
                           [--set model.gradient_checkpointing=true ...]

The model is a random-initialised Qwen2 of the shipped tiny model's size (hidden 256, 4 layers, untied head, as
Qwen2.5 >= 1.5B) with a `--vocab`-token vocabulary: the tiny tokenizer's characters plus synthetic tokens
("<123>"), so completions decode to distinct text and a character repetition reward tells them apart (every
group trains in both trainers). 4 prompts x 8 completions of `--tokens` tokens, float32, one thread. `--set`
applies RunSpec overrides to both trainers (TRL's through the same translation, bench.common.trl_trainer).

For each run it prints the peak RSS, the floor every trainer shares (the process after its imports, plus
weights, gradients and AdamW's two moments: 4 x 4 bytes per parameter), the peak above that floor, and the
seconds per step after the first. A run whose RSS passes `--cap-gb` is stopped and reported as such (TRL at
long completions would otherwise take the machine down).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.common import ROOT

GB = 2**30


def make_model(dest: Path, vocab: int, config: dict | None = None, device: str = "cpu") -> Path:
    """The random Qwen2 with a `vocab`-token tokenizer (the tiny one's, widened), saved in `dest`: the tiny model's
    size with an untied head, or `config`'s sizes over it (bench.gpu_check's 1.5B shape), float32 on CPU and bf16 on
    CUDA."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    src = ROOT / "assets/tiny-add"
    tok_json = json.loads((src / "tokenizer.json").read_text())
    words = tok_json["model"]["vocab"]
    for i in range(len(words), vocab):
        words[f"<{i}>"] = i
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_text(json.dumps(tok_json))
    base = AutoTokenizer.from_pretrained(src)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(dest / "tokenizer.json"), eos_token=base.eos_token,
                                  pad_token=base.pad_token, chat_template=base.chat_template)
    tok.save_pretrained(dest)
    cfg = AutoConfig.from_pretrained(src)
    cfg.vocab_size, cfg.tie_word_embeddings, cfg.max_position_embeddings = vocab, False, 4096
    for k, v in (config or {}).items():
        setattr(cfg, k, v)
    if config:
        cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    model.save_pretrained(dest)
    return dest


def spec_for(model: Path, tokens: int, steps: int, overrides: list[str] = ()):
    from backend.spec import RewardFunction
    from bench.common import tiny_spec

    spec = tiny_spec([f"model.name_or_path={model}", f"algorithm.max_steps={steps}", "algorithm.prompts_per_step=4",
                      "rollout.num_generations=8", f"rollout.max_completion_length={tokens}", "algorithm.replay_solved=false",
                      "algorithm.skip_solved_prompts=0", "resources.num_threads=1", *overrides])
    spec.rewards.functions = [RewardFunction(name="repetition", params={"unit": "char", "ngram_size": 1})]
    return spec


def child(trainer: str, model: Path, tokens: int, steps: int, overrides: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    spec = spec_for(model, tokens, steps, overrides)
    import transformers  # noqa: F401 - imports count in the floor, as they would in any trainer process

    if trainer == "trl":
        import trl  # noqa: F401
    from bench.common import param_count

    floor = psutil.Process().memory_info().rss + 16 * param_count(model)
    ends: list[float] = []
    cpu: list[float] = []  # this process's CPU seconds at each step's end (one thread: steadier on a busy host)
    phases: dict[str, float] = {}  # our trainer's per-phase peaks (backend.train.telemetry), GB
    if trainer == "ours":
        from bench.common import run_ours

        def on_step(t, row: dict) -> None:
            ends.append(time.time())
            cpu.append(time.process_time())
            for k, v in row.items():
                if k.startswith("system/peak_gb/"):
                    phases[k.rsplit("/", 1)[1]] = max(v, phases.get(k.rsplit("/", 1)[1], 0.0))

        run_ours(spec, on_step=on_step)
    else:
        from bench.common import StepClock, trl_trainer

        clock = StepClock()
        trl_trainer(spec, [clock]).train()
        ends, cpu = clock.times[1:], clock.cpu[1:]
    # our trainer resets the high-water mark at each phase (which getrusage reads too): the peak is the largest
    # phase's, and the parent's polling of the RSS checks it from outside (measure)
    peak = max([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, *(gb * GB for gb in phases.values())])
    per_step = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else float("nan")
    cpu_per_step = (cpu[-1] - cpu[0]) / (len(cpu) - 1) if len(cpu) > 1 else float("nan")
    print(json.dumps({"peak": peak, "floor": floor, "s_per_step": per_step, "cpu_s_per_step": cpu_per_step,
                      "phases_gb": phases}), flush=True)


def measure(trainer: str, model: Path, tokens: int, steps: int, cap: float, overrides: list[str]
            ) -> dict[str, float | str]:
    cmd = [sys.executable, "-m", "bench.memory", "--child", trainer, "--model", str(model), "--tokens", str(tokens),
           "--steps", str(steps), *(f"--set={o}" for o in overrides)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    seen = 0
    while proc.poll() is None:
        try:
            seen = max(seen, psutil.Process(proc.pid).memory_info().rss)
        except psutil.Error:
            break
        if seen > cap:
            proc.kill()
            proc.wait()
            return {"status": f"stopped above {cap / GB:.0f} GB"}
        time.sleep(0.2)
    out = proc.stdout.read().strip().splitlines() if proc.stdout else []
    if proc.returncode != 0 or not out:
        return {"status": f"failed (exit {proc.returncode})"}
    res = json.loads(out[-1])
    return {"status": "ok", **res, "peak": max(res["peak"], seen)}  # polled every 0.2 s: a lower bound


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--trainers", nargs="+", choices=["ours", "trl"], default=["ours", "trl"])
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first is not timed)")
    ap.add_argument("--cap-gb", type=float, default=16.0)
    ap.add_argument("--set", action="append", default=[], help="a RunSpec override for both trainers (repeatable)")
    ap.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.model, args.tokens[0], args.steps, args.set)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "model", args.vocab)
        print(f"vocabulary {args.vocab}, 4 x 8 completions, {args.steps} steps per run, cap {args.cap_gb:.0f} GB"
              + (f", {' '.join(args.set)}" if args.set else ""))
        print(f"{'tokens':>6} {'trainer':>7} {'peak GB':>8} {'floor GB':>8} {'above GB':>8} {'s/step':>7} "
              f"{'CPU s/step':>10}  status")
        results: dict[tuple[int, str], dict] = {}
        for tokens in args.tokens:
            for trainer in args.trainers:
                r = measure(trainer, model, tokens, args.steps, args.cap_gb * GB, args.set)
                results[tokens, trainer] = r
                if r["status"] == "ok":
                    phases = " ".join(f"{k} {v:.2f}" for k, v in r.get("phases_gb", {}).items())
                    print(f"{tokens:>6} {trainer:>7} {r['peak'] / GB:>8.2f} {r['floor'] / GB:>8.2f} "
                          f"{(r['peak'] - r['floor']) / GB:>8.2f} {r['s_per_step']:>7.2f} {r['cpu_s_per_step']:>10.2f}  ok"
                          + (f" (peak GB by phase: {phases})" if phases else ""), flush=True)
                else:
                    print(f"{tokens:>6} {trainer:>7} {'':>8} {'':>8} {'':>8} {'':>7}  {r['status']}", flush=True)
            ours, trl = results.get((tokens, "ours")), results.get((tokens, "trl"))
            if ours and trl and ours["status"] == trl["status"] == "ok":
                print(f"{tokens:>6}   ours/TRL memory above floor {(ours['peak'] - ours['floor']) / (trl['peak'] - trl['floor']):.2f}x,"
                      f" speed {trl['s_per_step'] / ours['s_per_step']:.2f}x (per CPU second "
                      f"{trl['cpu_s_per_step'] / ours['cpu_s_per_step']:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
