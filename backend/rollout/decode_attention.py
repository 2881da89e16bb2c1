"""One decode step's attention over the preallocated key/value cache (fast_decode.KVDecoder), on a CPU in one pass.

Each row feeds one query per step, so its attention is a batch of matrix-vector products: B x H dot products
of the query with every cached key, a softmax, a weighted sum of the cached values. torch's CPU scaled
dot-product attention runs them through its blockwise flash kernel, whose per-block setup dominates at one
query: 4-5 GB/s over the cache on this project's hosts, about half of a decode step at 128 tokens of the tiny
model. The C kernel (backend/csrc/decode_attention.c, built by backend.native) reads each cached key and value
once per step and keeps the scores in the CPU's cache: 1.3-6x faster per call, 1.25x per decoded token at the
long shape, after which the attention is bound by reading the cache from memory (`python -m bench.decode_attention`
times it beside SDPA).

It computes what `F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end], attn_mask=attend[:,
None, None, :end], scale=scale, enable_gqa=...)` computes, in another summation order (float32 rounding:
tests/test_decode_attention.py). It takes float32 CPU tensors outside autograd whose cache buffers are
contiguous; everything else, and any host where the kernel cannot be built (backend.native), runs that SDPA call.
`set_enabled(False)` turns it off process-wide (tests, benches). The choice depends on dtypes, devices and
layouts only, so a run and its resumption decode the same numbers.
"""
from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F

from backend import native

_enabled = True


def set_enabled(on: bool) -> bool:
    """Turn the C kernel on or off process-wide; returns the previous setting."""
    global _enabled
    before, _enabled = _enabled, on
    return before


@functools.cache
def _kernel() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    lib = native.load("decode_attention")
    if lib is None:
        return None
    fn = lib.decode_attention
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 7 + [ctypes.c_float, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def available() -> bool:
    """Whether the C kernel is built and loaded on this host."""
    return _kernel() is not None


def uses_kernel(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, attend: torch.Tensor) -> bool:
    """Whether `attention` runs these operands through the C kernel."""
    if not _enabled or torch.is_grad_enabled() and any(t.requires_grad for t in (q, keys, values)):
        return False
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in (q, keys, values)):
        return False
    if attend.dtype != torch.bool or attend.device.type != "cpu" or attend.stride(-1) != 1:
        return False
    if not (keys.is_contiguous() and values.is_contiguous() and keys.shape == values.shape):
        return False
    # shapes the kernel indexes by (a mismatch would read out of bounds there; SDPA raises a clear error instead)
    if q.dim() != 4 or keys.dim() != 4 or attend.dim() != 2 or not q.shape[0] == keys.shape[0] == attend.shape[0]:
        return False
    return q.shape[3] == keys.shape[3] and q.shape[1] % keys.shape[1] == 0 and q.shape[2] == 1 and available()


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, attend: torch.Tensor, end: int,
              scale: float) -> torch.Tensor:
    """(B, 1, H * D): attention of q (B, H, 1, D) over positions 0 .. end-1 of the cache buffers keys, values
    (B, G, W, D), H a multiple of G, where attend (B, >= end) allows it; every row must allow one position."""
    B, H, _, D = q.shape
    if not 0 < end <= min(keys.shape[2], attend.shape[1]):
        raise ValueError(f"decode attention over {end} positions of a {keys.shape[2]}-position cache")
    if not uses_kernel(q, keys, values, attend):
        o = F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end], attn_mask=attend[:, None, None, :end],
                                           scale=scale, enable_gqa=H != keys.shape[1])
        return o.transpose(1, 2).reshape(B, 1, H * D)
    q = q.contiguous()
    out = q.new_empty((B, 1, H * D))
    failed = _kernel()(q.data_ptr(), keys.data_ptr(), values.data_ptr(), attend.data_ptr(), out.data_ptr(), B, H,
                       keys.shape[1], D, keys.shape[2], end, attend.stride(0), scale, torch.get_num_threads())
    if failed:
        raise MemoryError("decode attention: no memory for the scores")
    return out
