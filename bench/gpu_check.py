"""The GPU check behind bench/gpu_check.sh: memory and step figures at a real model's shape, in minutes.

    python -m bench.gpu_check --floor                      # versions and imports this interpreter must have
    python -m bench.gpu_check [--device cuda|cpu] [--shape 1.5b|small] [--tokens 1024] [--prompts 2]
                              [--generations 8] [--steps 3] [--trainers ours trl]

Why this shape: the lent GPU machine (one H200, no network) has torch 2.11 and transformers 5.17 but no pydantic,
datasets, trl or vLLM; bench/gpu_check.sh installs the carried wheels (bench/gpu_wheels.sh) into a folder of the
work tree first, and `--floor` says what is missing before anything is timed. Nothing here downloads anything.

Parts, each one line `[part] ...` (a part that fails prints its error; the next still runs):
1. `tiny`: the trainer on the shipped tiny preset on the device (bf16 on CUDA): a smoke test of the path.
2. `ours <shape>`: a random-initialised model of Qwen2.5-1.5B's config (vocabulary 151,936, the tiny tokenizer
   widened to it) at `--tokens`-token completions, our trainer in a process of its own: seconds per step, the
   rollout's share, the peak memory of each phase (system/peak_gpu_gb/* on CUDA, system/peak_gb/* on CPU), and
   `backend.footprint`'s estimate of the same run beside it.
3. `trl <shape>`: TRL's GRPOTrainer on the same model and batch where trl imports: seconds per step and peak.
4. `vllm`: where vLLM imports, our trainer with the vLLM engine colocated (sleep mode).
`--shape small` is the same run at a size a CPU finishes in a minute (tests/test_gpu_check.py runs it).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

GB = 2**30
ROOT = Path(__file__).resolve().parent.parent

# The oldest versions the trainer is checked on (the GPU machine's torch and transformers; a venv of them on CPU,
# bench/RESULTS.md "bench.gpu_check"), and the modules a run imports that such a machine may lack.
FLOOR = {"torch": "2.11", "transformers": "5.17", "pydantic": "2.11", "datasets": "4.0", "peft": "0.17",
         "accelerate": "1.0", "safetensors": "0.4", "yaml": "6.0", "psutil": "5.9"}
OPTIONAL = ("trl", "vllm", "math_verify")

QWEN25_15B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
              "num_key_value_heads": 2, "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "tie_word_embeddings": False}
SHAPES = {"1.5b": QWEN25_15B, "small": SMALL}
VOCAB = 151_936


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def floor_problems(versions: dict[str, str | None]) -> list[str]:
    """What keeps this interpreter from running the check: a module missing or older than FLOOR."""
    bad = []
    for name, least in FLOOR.items():
        have = versions.get(name)
        if have is None:
            bad.append(f"{name} is not importable (carry its wheel: bash bench/gpu_wheels.sh)")
        elif _version_tuple(have) < _version_tuple(least):
            bad.append(f"{name} {have} is older than {least}")
    return bad


def installed_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in (*FLOOR, *OPTIONAL):
        try:
            out[name] = str(getattr(importlib.import_module(name), "__version__", "?"))
        except Exception:  # absent, or broken by a missing dependency: either way not usable
            out[name] = None
    return out


def floor() -> int:
    versions = installed_versions()
    bad = floor_problems(versions)
    if not bad:  # the modules a run imports, imported here so a missing dependency shows before any timing
        for mod in ("backend.train.loop", "backend.rollout.hf", "backend.rewards", "backend.footprint"):
            try:
                importlib.import_module(mod)
            except Exception as err:
                bad.append(f"{mod}: {type(err).__name__}: {err}")
    have = " ".join(f"{k} {v}" for k, v in versions.items() if v)
    lacks = " ".join(k for k in OPTIONAL if not versions[k])
    print(f"[floor] python {platform.python_version()} {have}" + (f"; without {lacks}" if lacks else "")
          + (": ok" if not bad else ": NOT OK\n  " + "\n  ".join(bad)), flush=True)
    return 0 if not bad else 2


def make_model(dest: Path, shape: str, device: str) -> Path:
    """A random-initialised Qwen2 of `shape` with a VOCAB-token vocabulary (bench.memory's widened tokenizer)."""
    from bench.memory import make_model as widened

    return widened(dest, VOCAB, SHAPES[shape], device)


def run_overrides(args: argparse.Namespace, model: Path) -> list[str]:
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    return [f"resources.device={args.device}", f"model.dtype={dtype}", f"model.name_or_path={model}",
            f"algorithm.prompts_per_step={args.prompts}", f"rollout.num_generations={args.generations}",
            f"rollout.max_completion_length={args.tokens}", f"algorithm.max_steps={args.steps}",
            "algorithm.replay_solved=false", "algorithm.skip_solved_prompts=0", *args.set]


def child(trainer: str, overrides: list[str], device: str) -> None:
    """One trainer in this process; prints one JSON line of figures."""
    import torch

    from backend.spec import RewardFunction
    from bench.common import StepClock, run_ours, tiny_spec, trl_trainer

    spec = tiny_spec(overrides)
    spec.rewards.functions = [RewardFunction(name="repetition", params={"unit": "char", "ngram_size": 1})]
    ends: list[float] = []
    rows: list[dict[str, Any]] = []
    if trainer == "ours":
        def on_step(_t: Any, row: dict[str, Any]) -> None:
            ends.append(time.time())
            rows.append(row)

        run_ours(spec, on_step=on_step)
    else:
        clock = StepClock()
        trl_trainer(spec, [clock], gpu=device == "cuda").train()
        ends = clock.times[1:]
    prefix = "system/peak_gpu_gb/" if device == "cuda" else "system/peak_gb/"
    phases: dict[str, float] = {}
    for row in rows:
        for k, v in row.items():
            if k.startswith(prefix):
                phases[k[len(prefix):]] = max(v, phases.get(k[len(prefix):], 0.0))
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() / GB
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB
    timed = rows[1:] or rows
    out = {"s_per_step": (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else float("nan"), "peak_gb": peak,
           "phases_gb": phases,
           "rollout_s": statistics.mean(r["timing/rollout_s"] for r in timed) if timed else None}
    print("GPU_CHECK " + json.dumps(out), flush=True)


def in_child(trainer: str, overrides: list[str], device: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.gpu_check", "--child", trainer, "--device", device,
           *(f"--set={o}" for o in overrides)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GPU_CHECK ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1200:]}")
    return json.loads(lines[-1][len("GPU_CHECK "):])


def estimate_gb(overrides: list[str]) -> str:
    from backend.footprint import footprint, spec_shape
    from bench.common import tiny_spec

    spec = tiny_spec(overrides)
    shape = spec_shape(spec, ROOT)
    return f"{footprint(spec, shape).total / GB:.2f} GB" if shape else "n/a"


def line(r: dict[str, Any]) -> str:
    phases = " ".join(f"{k} {v:.2f}" for k, v in r["phases_gb"].items())
    roll = f" (rollout {r['rollout_s']:.2f} s)" if r.get("rollout_s") is not None else ""
    return (f"{r['s_per_step']:.2f} s/step{roll}, peak {r['peak_gb']:.2f} GB"
            + (f", by phase: {phases}" if phases else ""))


def part(name: str, fn: Any) -> bool:
    t0 = time.time()
    try:
        print(f"[{name}] {fn()} ({time.time() - t0:.0f}s)", flush=True)
        return True
    except Exception:
        print(f"[{name}] FAILED ({time.time() - t0:.0f}s)\n{traceback.format_exc()[-1500:]}", flush=True)
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--floor", action="store_true", help="only check versions and imports")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.5b")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per trainer (the first is not timed)")
    ap.add_argument("--trainers", nargs="+", choices=["ours", "trl"], default=["ours", "trl"])
    ap.add_argument("--part-timeout", type=float, default=200.0, help="seconds each trainer's process may take")
    ap.add_argument("--set", action="append", default=[], help="a RunSpec override for every part (repeatable)")
    ap.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.set, args.device)
        return
    code = floor()
    if args.floor or code:
        sys.exit(code)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device visible: use --device cpu for a CPU run of the same check")
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu"
    print(f"[device] {where}, torch {torch.__version__}", flush=True)
    ok = True
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    ok &= part("tiny", lambda: line(in_child("ours", [f"resources.device={args.device}", f"model.dtype={dtype}",
                                                      "algorithm.max_steps=4"], args.device, args.part_timeout)))
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "model", args.shape, args.device)
        over = run_overrides(args, model)
        tag = f"{args.shape} x{args.tokens}"
        print(f"[shape] {args.shape}: vocabulary {VOCAB}, {args.prompts} x {args.generations} completions of "
              f"{args.tokens} tokens, {args.steps} steps; footprint estimate {estimate_gb(over)}", flush=True)
        results: dict[str, dict[str, Any]] = {}

        def run(trainer: str) -> str:
            results[trainer] = in_child(trainer, over, args.device, args.part_timeout)
            return line(results[trainer])

        for trainer in args.trainers:
            if trainer == "trl" and importlib.util.find_spec("trl") is None:
                print("[trl] not importable here: skipped", flush=True)
                continue
            ok &= part(f"{trainer} {tag}", lambda t=trainer: run(t))
        if {"ours", "trl"} <= results.keys():
            o, t = results["ours"], results["trl"]
            print(f"[ratio] ours/TRL peak memory {o['peak_gb'] / t['peak_gb']:.2f}x, TRL/ours s/step "
                  f"{t['s_per_step'] / o['s_per_step']:.2f}x", flush=True)
        if args.device == "cuda" and importlib.util.find_spec("vllm") is not None:
            ok &= part(f"vllm colocate {tag}", lambda: line(in_child(
                "ours", [*over, "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.3"], args.device,
                args.part_timeout)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
