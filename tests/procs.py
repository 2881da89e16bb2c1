"""Process helpers shared by the tests that start rollout workers and trainers."""

from __future__ import annotations

import time

import psutil


def gone(pid: int, within: float = 15.0) -> bool:
    """Whether process `pid` has exited (or is a zombie waiting for its parent) within `within` seconds."""
    t0 = time.time()
    while time.time() - t0 < within:
        try:
            if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:  # exited between the two calls
            return True
        time.sleep(0.1)
    return False
