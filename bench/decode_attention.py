"""The C decode-attention kernel vs torch's SDPA, per call, per decoded token, and in our step.

    python -m bench.decode_attention [--shapes long 20m] [--repeats 2] [--calls-only]

First single calls at bench.vs_trl's decode shapes (rows x heads x head_dim) over several cache lengths, four
layers' caches in turn as in a decode step (so the cache is read from memory, not the CPU's caches), with the
bytes of keys and values read per second; then our trainer alone on the shapes with the kernel on and off,
alternating: seconds per step (median over the repeats), the ratio, and the rollout's share. Pin OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from backend.rollout import decode_attention as da
from bench.common import best_time
from bench.vs_trl import SHAPES, on_off_steps, shape_model, shape_spec

# (label, rows, heads, head_dim, cache capacity): long's tiny copy at 8 x 8, 20m at 4 x 8
CALLS = [("long", 64, 4, 64, 140), ("20m", 32, 8, 64, 44)]
LAYERS = 4


def calls() -> None:
    print(f"kernel available: {da.available()}")
    print(f"{'shape':6s} {'positions':>9s} {'SDPA ms':>8s} {'kernel ms':>9s} {'speed-up':>8s} {'kernel GB/s':>11s}")
    for label, rows, heads, dim, cap in CALLS:
        caches = [(torch.randn(rows, heads, cap, dim), torch.randn(rows, heads, cap, dim)) for _ in range(LAYERS)]
        q = torch.randn(rows, heads, 1, dim)
        attend = torch.ones(rows, cap, dtype=torch.bool)
        attend[::3, :4] = False  # some left padding
        for end in sorted({cap // 4, cap // 2, cap}):
            t_sdpa, t_kernel = _pair(caches, q, attend, end, dim ** -0.5)
            gbs = 2 * rows * heads * end * dim * 4 / t_kernel / 1e9
            print(f"{label:6s} {end:9d} {1e3 * t_sdpa:8.3f} {1e3 * t_kernel:9.3f} {t_sdpa / t_kernel:7.2f}x {gbs:11.1f}",
                  flush=True)


def _pair(caches: list[tuple[torch.Tensor, torch.Tensor]], q: torch.Tensor, attend: torch.Tensor, end: int,
          scale: float) -> tuple[float, float]:
    """Seconds per layer's call over `end` positions: SDPA's, the kernel's."""
    def sdpa() -> None:
        for k, v in caches:
            F.scaled_dot_product_attention(q, k[:, :, :end], v[:, :, :end], attn_mask=attend[:, None, None, :end],
                                           scale=scale)

    def kernel() -> None:
        for k, v in caches:
            da.attention(q, k, v, attend, end, scale)
    return best_time(sdpa, 20) / len(caches), best_time(kernel, 20) / len(caches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["long", "20m"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--calls-only", action="store_true")
    args = ap.parse_args()
    calls()
    if args.calls_only:
        return
    with tempfile.TemporaryDirectory(prefix="bench-attn-") as tmp:
        for name in args.shapes:
            shape = SHAPES[name]
            spec = shape_spec(shape, shape_model(shape, Path(tmp)), [])
            runs = on_off_steps(spec, da.set_enabled, args.repeats)
            on, off = (statistics.median(r.seconds for r in runs[k]) for k in (True, False))
            share = {k: statistics.median(r.rollout for r in runs[k]) for k in (True, False)}
            print(f"{name:7s} our step with the kernel {on:.3f} s (rollout {share[True]:.0%}), with SDPA {off:.3f} s "
                  f"(rollout {share[False]:.0%}): {off / on:.2f}x", flush=True)


if __name__ == "__main__":
    main()
