"""A reward that starts a child in a session of its own (out of the worker's process group) that holds the
worker's stderr, for tests/test_faults.py. Its pid goes to $DETACHED_PID_FILE."""

import os
import subprocess
import sys

_started = []


def detaching(completions, **kwargs):
    if not _started:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        with open(os.environ["DETACHED_PID_FILE"], "w") as f:
            f.write(str(p.pid))
        _started.append(p)
    return [0.0 for _ in completions]
