"""system/* metrics: process memory and CPU, and per-GPU utilisation and memory where present."""

from __future__ import annotations

import psutil
import torch


class Telemetry:
    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)  # first call primes the counter

    def sample(self) -> dict[str, float]:
        out = {
            "system/ram_gb": self.proc.memory_info().rss / 2**30,
            "system/cpu_percent": self.proc.cpu_percent(None),
            "system/host_ram_used_percent": psutil.virtual_memory().percent,
        }
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                free, total = torch.cuda.mem_get_info(i)
                out[f"system/gpu{i}_mem_gb"] = (total - free) / 2**30
                out[f"system/gpu{i}_mem_percent"] = 100 * (total - free) / total
                try:
                    out[f"system/gpu{i}_util"] = float(torch.cuda.utilization(i))
                except Exception:  # needs pynvml; memory figures still stand
                    pass
        return out
