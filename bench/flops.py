"""What a step costs in arithmetic, ours vs TRL's, and what that leaves for the wall-clock ratio.

    python -m bench.flops [--shapes long 20m] [--steps 2]

At the compute-bound shapes of bench.vs_trl both trainers spend their step in float32 matrix products and
attention, so the ratio of their step times is (TRL's FLOPs / ours) x (our FLOP rate / TRL's). The first factor
is what our design saves (a group's prompt is prefilled and trained once instead of once per completion); the
second is how close each runs to the core.
This counts the first exactly: every matrix product and attention call of a few real steps of each trainer,
under torch's FlopCounterMode (formulas added for the CPU flash-attention ops it does not know). It then measures
the best float32 rate of this core on the shape's largest product (torch's, in cache: the rate no step can beat)
and prints, per shape: GFLOP per step each, their ratio, and the rate our step would have to sustain, over
everything it does, for 2x TRL's throughput at TRL's measured step time (`--trl-seconds`, e.g. from
bench.vs_trl) as a share of that best rate. Pin OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count
from transformers import AutoConfig

from bench.common import ROOT, best_time, run_ours, tiny_spec, trl_trainer
from bench.vs_trl import SHAPES, Shape, shape_model, shape_spec

_aten = torch.ops.aten


@register_flop_formula(_aten._scaled_dot_product_flash_attention_for_cpu, get_raw=True)
def _cpu_sdpa(query, key, value, *args, **kwargs) -> int:  # noqa: ANN001
    return sdpa_flop_count(query.shape, key.shape, value.shape)


@register_flop_formula(_aten._scaled_dot_product_flash_attention_for_cpu_backward, get_raw=True)
def _cpu_sdpa_backward(grad_out, query, key, value, *args, **kwargs) -> int:  # noqa: ANN001
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


def counted(fn: Callable[[], Any]) -> int:
    """Matrix-product and attention FLOPs of fn()."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@dataclass(frozen=True)
class StepFlops:
    ours: float  # FLOPs per step
    trl: float


def step_flops(shape: Shape, model_dir: Path | None, steps: int) -> StepFlops:
    """FLOPs per optimizer step of each trainer on the shape, counted over `steps` real steps."""
    spec = shape_spec(replace(shape, steps=steps), model_dir, [])
    ours = counted(lambda: run_ours(spec))
    trainer = trl_trainer(spec)
    trl = counted(trainer.train)
    return StepFlops(ours / steps, trl / steps)


def best_rate(model_dir: Path | None, rows: int) -> float:
    """FLOP/s of torch's float32 product on this core at the shape's sizes: `rows` tokens through the model's
    largest weight, operands in cache."""
    cfg = AutoConfig.from_pretrained(model_dir or ROOT / tiny_spec().model.name_or_path)
    k, n = cfg.hidden_size, cfg.intermediate_size
    a, w = torch.randn(rows, k), torch.randn(n, k)
    seconds = best_time(lambda: torch.nn.functional.linear(a, w))
    return 2 * rows * k * n / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["long", "20m"])
    ap.add_argument("--steps", type=int, default=2, help="steps counted per trainer")
    ap.add_argument("--trl-seconds", nargs="*", type=float, default=[],
                    help="TRL's measured seconds per step, one per shape in order (bench.vs_trl), for the 2x line")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-flops-") as tmp:
        for i, name in enumerate(args.shapes):
            shape = SHAPES[name]
            model_dir = shape_model(shape, Path(tmp))
            f = step_flops(shape, model_dir, args.steps)
            rows = shape.prompts * shape.generations * shape.max_tokens
            peak = best_rate(model_dir, rows)
            print(f"{name:7s} GFLOP per step: ours {f.ours / 1e9:.1f}, TRL {f.trl / 1e9:.1f} -> TRL / ours "
                  f"{f.trl / f.ours:.2f} (the speed ratio at equal FLOP rates) | this core's best product rate "
                  f"{peak / 1e9:.0f} GFLOP/s: ours at that rate {f.ours / peak:.2f} s/step, TRL {f.trl / peak:.2f}",
                  flush=True)
            if i < len(args.trl_seconds):
                trl_s = args.trl_seconds[i]
                need = 2 * f.ours / trl_s
                print(f"        TRL at {trl_s:.2f} s/step runs {f.trl / trl_s / 1e9:.0f} GFLOP/s; 2x its throughput "
                      f"needs ours at {need / 1e9:.0f} GFLOP/s sustained over the whole step = "
                      f"{100 * need / peak:.0f}% of the best product rate", flush=True)


if __name__ == "__main__":
    main()
