"""Weight sync to rollout workers: the shared-memory file against the collective channel (gloo here, NCCL on GPUs).

    python -m bench.weight_sync [--workers 2] [--repeats 5] [--bucket-mb 256]

For the tiny model (2.6M parameters) and a random Qwen2 of about 20M parameters, two pools of hf workers
on the same weights, one per mode, take the same update in turns (round-robin, so load from other
processes falls on both alike). Printed: median wall seconds of one update (the trainer waits for all
workers), the trainer process's CPU seconds (time.process_time), and collective / file. What
rollout.weight_sync=auto picks on CPU follows from these figures (RunSpec.weight_sync_mode).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from backend.project import PROJECT_ROOT  # noqa: E402
from backend.rollout.pool import start_workers  # noqa: E402
from backend.rollout.worker import WorkerConfig  # noqa: E402

TINY = PROJECT_ROOT / "assets/tiny-add"


def random_model(dest: Path, hidden: int = 384, layers: int = 8, intermediate: int = 1536) -> Path:
    """A random-initialised Qwen2 of about 20M parameters with the tiny model's tokenizer, saved to `dest`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(TINY)
    cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size = hidden, layers, intermediate
    cfg.num_attention_heads = cfg.num_key_value_heads = hidden // 64
    cfg.layer_types = ["full_attention"] * layers
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(dest)
    for f in TINY.iterdir():
        if "token" in f.name or f.name == "vocab.json":
            shutil.copy(f, dest / f.name)
    return dest


def bench_model(path: Path, workers: int, repeats: int, bucket_mb: int,
                log_dir: Path) -> tuple[int, dict[str, tuple[float, float]]]:
    """(parameter count, mode -> (median wall s, median trainer CPU s)) of one update."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = sum(t.numel() for t in weights.values())
    cfg = WorkerConfig(engine="hf", model=str(path))
    pools = {mode: start_workers(cfg, workers, log_dir / mode, weight_sync=mode, bucket_mb=bucket_mb)
             for mode in ("file", "collective")}
    wall: dict[str, list[float]] = {m: [] for m in pools}
    cpu: dict[str, list[float]] = {m: [] for m in pools}
    try:
        for p in pools.values():  # warm-up (the collective forms its group here)
            p.update_weights(weights.items())
        for _ in range(repeats):
            for mode, p in pools.items():
                t0, c0 = time.perf_counter(), time.process_time()
                p.update_weights(weights.items())
                wall[mode].append(time.perf_counter() - t0)
                cpu[mode].append(time.process_time() - c0)
    finally:
        for p in pools.values():
            p.close()
    return params, {m: (statistics.median(wall[m]), statistics.median(cpu[m])) for m in pools}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bucket-mb", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        models = {"tiny-add (2.6M)": TINY, "random Qwen2 (~20M)": random_model(Path(tmp) / "rand20m")}
        print(f"{args.workers} hf workers, bucket {args.bucket_mb} MB, median of {args.repeats} updates")
        print(f"{'model':22s} {'params':>8s} {'file s':>8s} {'coll. s':>8s} {'coll./file':>10s} "
              f"{'file cpu s':>10s} {'coll. cpu s':>11s}")
        for name, path in models.items():
            params, r = bench_model(path, args.workers, args.repeats, args.bucket_mb, Path(tmp) / name.split()[0])
            (fw, fc), (cw, cc) = r["file"], r["collective"]
            print(f"{name:22s} {params / 1e6:7.1f}M {fw:8.3f} {cw:8.3f} {cw / fw:10.2f} {fc:10.3f} {cc:11.3f}")


if __name__ == "__main__":
    main()
