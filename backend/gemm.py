"""Large float32 matrix products on a CPU through oneDNN instead of torch's default BLAS.

torch runs a float32 `F.linear` or `a @ b` on a CPU through its BLAS (MKL in the PyPI wheels). On AMD CPUs MKL
takes a generic code path, while the oneDNN library in the same torch build picks its kernels by the CPU's
instruction set (AVX-512 where present). Measured on this project's AMD EPYC hosts, single thread
(`python -m bench.gemm` prints the table for the host it runs on):
- products with many rows and a short reduction (the training pass's `x W^T` and its input gradient `dY W`,
  thousands of rows): oneDNN 1.2-1.6x faster on one host, up to 2.2x on another;
- decode products of a larger model (32 rows x 512 x 1536, 25 M multiply-adds): oneDNN about 1.1x;
- small decode products (16-64 rows of the tiny model) and weight gradients `dY^T X` summed over thousands of
  rows: even, or torch faster.
So `linear` and `mm` take oneDNN for products of at least MIN_ROWS output rows or MIN_MACS multiply-adds whose
reduction is at most MAX_REDUCTION long, and torch's own product for everything else. The choice is a function
of the shapes alone, never of timing, so a run and its resumption compute the same numbers. oneDNN's results are
float32 in another summation order: they differ from torch's by float32 rounding (relative 1e-6), as two BLAS
libraries do.

Falls back to torch, bit for bit, off the CPU, for other dtypes, under autocast, where the build has no oneDNN
linear (probed once) and after `set_enabled(False)`. Imports torch only: the lean passes (rollout.fast_decode)
and the activation tape's backward (rollout.tape) use it.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

MIN_ROWS = 512  # output rows from which oneDNN's product was faster (bench.gemm)
MIN_MACS = 1 << 24  # or multiply-adds (16.8 M): below both, small decode products, the two are even or torch wins
MAX_REDUCTION = 4096  # longer reductions (a weight gradient over the batch's tokens) stay with torch

_enabled = True


def set_enabled(on: bool) -> bool:
    """Turn the oneDNN path on or off process-wide (tests compare both); returns the previous setting."""
    global _enabled
    before, _enabled = _enabled, on
    return before


@functools.cache
def available() -> bool:
    """Whether this torch build runs a oneDNN float32 linear (probed once, on a tiny product)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        x = torch.ones(2, 3)
        return bool(torch.allclose(_onednn_linear(x, torch.ones(4, 3), None), torch.full((2, 4), 3.0)))
    except (RuntimeError, AttributeError):
        return False


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (R, K) @ weight (N, K)^T + bias through oneDNN; strided operands are read in place (no copies)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def uses_onednn(rows: int, reduction: int, columns: int, *tensors: torch.Tensor | None) -> bool:
    """Whether a (rows x reduction) @ (reduction x columns) product of these operands runs through oneDNN."""
    if not _enabled or reduction > MAX_REDUCTION or (rows < MIN_ROWS and rows * reduction * columns < MIN_MACS):
        return False
    ts = [t for t in tensors if t is not None]
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in ts):
        return False
    return not torch.is_autocast_enabled("cpu") and available()


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (R, K) @ b (K, N), not differentiable (for backward passes)."""
    if uses_onednn(a.shape[0], a.shape[1], b.shape[1], a, b):
        return _onednn_linear(a, b.t(), None)
    return a @ b


def linear_into(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """out (R, N) = x (R, K) @ weight^T + bias, not differentiable, the same numbers as `linear` (the activation
    tape's recorder writes each product into its buffer)."""
    if uses_onednn(x.shape[0], x.shape[1], weight.shape[0], x, weight, bias):
        out.copy_(_onednn_linear(x, weight, bias))  # oneDNN has no out= form: one small copy
    elif bias is not None:
        torch.addmm(bias, x, weight.t(), out=out)  # F.linear's own product (addmm / mm), in place
    else:
        torch.mm(x, weight.t(), out=out)


class _Linear(torch.autograd.Function):
    """F.linear through oneDNN, and its backward's products through `mm` (which picks per product: a weight
    gradient summed over thousands of rows stays with torch)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        flat = x.reshape(-1, x.shape[-1])
        return _onednn_linear(flat, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        x, weight = ctx.saved_tensors
        return linear_backward(grad, x, weight, ctx.has_bias, ctx.needs_input_grad[:3])


def linear_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, has_bias: bool,
                    needs: tuple[bool, ...]) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The gradients of y = x W^T + b for x, W and b (None where not needed): grad_x = dY W, grad_W = dY^T x,
    grad_b = the column sums of dY."""
    g = grad.reshape(-1, grad.shape[-1])
    gx = mm(g, weight).view(*grad.shape[:-1], weight.shape[1]) if needs[0] else None
    gw = mm(g.t(), x.reshape(-1, x.shape[-1])) if needs[1] else None
    gb = g.sum(0) if has_bias and needs[2] else None
    return gx, gw, gb


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), differentiable; through oneDNN where `uses_onednn` says so."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not uses_onednn(rows, x.shape[-1], weight.shape[0], x, weight, bias):
        return F.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias)
