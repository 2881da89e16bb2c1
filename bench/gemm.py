"""oneDNN vs torch's own float32 products on this CPU, and what backend.gemm's choice does to our step time.

    python -m bench.gemm [--shapes long 20m] [--repeats 2] [--products-only]

First a table of single-thread products, torch (MKL) vs oneDNN, at the shapes our trainer runs: decode rows
(16-64), the packed training pass's x W^T and dY W (thousands of rows) and its weight gradient dY^T X, with the
path backend.gemm picks for each. Then our trainer alone on bench.vs_trl's shapes with backend.gemm on and off,
alternating, seconds per step (median over the repeats) and the ratio. Pin OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from backend import gemm
from bench.common import best_time
from bench.vs_trl import SHAPES, Shape, on_off_steps, shape_model, shape_spec

# (label, rows, reduction, columns) of a @ b with a (rows, reduction), b (reduction, columns)
PRODUCTS = [
    ("decode 16 rows, tiny", 16, 256, 512),
    ("decode 64 rows, tiny", 64, 256, 512),
    ("decode 32 rows, 20m", 32, 512, 1536),
    ("train x W^T, long", 8512, 256, 512),
    ("train dY W, long", 8512, 512, 256),
    ("train dY^T X, long", 256, 8512, 512),
    ("train x W^T, 20m", 1112, 512, 1536),
    ("train dY W, 20m", 1112, 1536, 512),
    ("train dY^T X, 20m", 512, 1112, 1536),
]


def products() -> None:
    print(f"oneDNN available: {gemm.available()}")
    print(f"{'product':24s} {'shape':>20s} {'torch ms':>9s} {'oneDNN ms':>9s} {'speed-up':>8s}  backend.gemm picks")
    for label, r, k, n in PRODUCTS:
        a, b = torch.randn(r, k), torch.randn(k, n)
        t_torch = best_time(lambda a=a, b=b: a @ b)
        t_dnn = best_time(lambda a=a, b=b: gemm._onednn_linear(a, b.t(), None)) if gemm.available() else float("nan")
        pick = "oneDNN" if gemm.uses_onednn(r, k, n, a, b) else "torch"
        print(f"{label:24s} {f'{r}x{k}x{n}':>20s} {1e3 * t_torch:9.3f} {1e3 * t_dnn:9.3f} {t_torch / t_dnn:7.2f}x  {pick}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["long", "20m"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--products-only", action="store_true")
    args = ap.parse_args()
    products()
    if args.products_only:
        return
    with tempfile.TemporaryDirectory(prefix="bench-gemm-") as tmp:
        for name in args.shapes:
            shape: Shape = SHAPES[name]
            spec = shape_spec(shape, shape_model(shape, Path(tmp)), [])
            runs = on_off_steps(spec, gemm.set_enabled, args.repeats)
            times = {k: [r.seconds for r in v] for k, v in runs.items()}
            on, off = statistics.median(times[True]), statistics.median(times[False])
            print(f"{name:7s} our step with oneDNN {on:.3f} s, without {off:.3f} s: {off / on:.2f}x "
                  f"(runs: on {[round(t, 3) for t in times[True]]}, off {[round(t, 3) for t in times[False]]})",
                  flush=True)


if __name__ == "__main__":
    main()
