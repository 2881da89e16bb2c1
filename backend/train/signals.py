"""Stop requests. Installed first thing in the trainer process (before the heavy imports), so a
SIGTERM that arrives while torch loads still ends in a checkpoint and 'stopped', not a dead process.
The handler only sets a flag: the training loop writes status and saves, never a signal handler."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

STOP = threading.Event()


def install() -> None:
    def request_stop(signum: int, _frame: Any) -> None:
        STOP.set()
        print(f"received signal {signum}: stopping after this step", file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
