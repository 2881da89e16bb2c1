"""system/* metrics: process memory and CPU, per-GPU utilisation and memory where present, and the peak memory
of each phase of a step.

`phase(name)` brackets a phase (rollout, reference: the old and reference logprob passes, train: the optimizer
step); `sample()` returns `system/peak_gb/<name>` for the phases that ran since the last sample: the process's
peak resident memory while the phase ran (Linux: the high-water mark is reset at the phase's start through
/proc/self/clear_refs and read from /proc/self/status), and on GPU the device's peak allocated memory
(`system/peak_gpu_gb/<name>`). Where the high-water mark cannot be reset (no /proc, or a kernel that takes the
write and keeps the mark: `reset_peak_rss` checks the mark came down) the CPU figure is left out rather than
reported as the process's lifetime peak. A phase's figure includes what the process already held when it began
(the weights, and freed memory the allocator keeps), so it is the process's peak during the phase, not the
phase's own allocations; an async rollout runs beside training, so its figures are those of both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import psutil
import torch

GB = 2**30


# After a reset the high-water mark equals the resident size, give or take what another thread allocated or
# freed in between; a larger gap means the kernel took the write but did not reset (seen on CI's kernel).
RESET_SLACK = 32 << 20


def _vm(key: str) -> int | None:
    """A byte figure from /proc/self/status (VmHWM, VmRSS), or None where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's resident-memory high-water mark (Linux); False where it cannot, or where the write
    was taken but the mark did not come down to the resident size."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    hwm, rss = _vm("VmHWM"), _vm("VmRSS")
    return hwm is not None and rss is not None and hwm - rss <= RESET_SLACK


def peak_rss() -> int | None:
    """This process's resident-memory high-water mark in bytes (VmHWM), or None where unknown."""
    return _vm("VmHWM")


class Telemetry:
    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)  # first call primes the counter
        self.peaks: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the peak memory while the body runs as the phase `name` (the module docstring)."""
        cpu = reset_peak_rss()
        gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            rss = peak_rss() if cpu else None
            if rss is not None:
                self._keep(f"system/peak_gb/{name}", rss / GB)
            if gpu:
                self._keep(f"system/peak_gpu_gb/{name}", torch.cuda.max_memory_allocated() / GB)

    def _keep(self, key: str, gb: float) -> None:
        # a phase that runs twice before a sample (the old-policy and the reference pass) keeps its larger peak
        self.peaks[key] = max(gb, self.peaks.get(key, 0.0))

    def sample(self) -> dict[str, float]:
        out = {
            "system/ram_gb": self.proc.memory_info().rss / GB,
            "system/cpu_percent": self.proc.cpu_percent(None),
            "system/host_ram_used_percent": psutil.virtual_memory().percent,
        }
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                free, total = torch.cuda.mem_get_info(i)
                out[f"system/gpu{i}_mem_gb"] = (total - free) / GB
                out[f"system/gpu{i}_mem_percent"] = 100 * (total - free) / total
                try:
                    out[f"system/gpu{i}_util"] = float(torch.cuda.utilization(i))
                except Exception:  # needs pynvml; memory figures still stand
                    pass
        out.update(self.peaks)
        self.peaks = {}
        return out
