"""Process memory settings for a CPU trainer: let glibc's malloc keep freed memory for reuse.

Why its own module: it is a process-wide allocator setting, not part of building the model or optimizer.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep freed memory for reuse instead of returning it to the OS, process-wide.

    A CPU training step frees and reallocates the same few megabytes every step (gradients after
    zero_grad(set_to_none=True), activations): by default each block over 128 KiB is a fresh mmap whose pages
    fault in zero-filled, hundreds to thousands of page faults per step for the 2.6 M-parameter model
    (`bench.malloc`). Blocks up to 32 MiB now come from the heap, which keeps up to 1 GiB of freed memory.
    Returns False (nothing changed) where there is no glibc (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        return False
    if mallopt is None:
        return False
    return all(mallopt(param, value) == 1 for param, value in
               ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 64 << 20)))
