"""Rewards that start a subprocess (its pid goes to $CHILD_PID_FILE), for tests/test_faults.py: `spawning`
leaves it in the reward worker's process group, `detaching` starts it in a session of its own (out of the
group), holding the worker's stderr."""

import os
import subprocess
import sys

_started = []


def _start(new_session: bool) -> None:
    if not _started:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=new_session)
        with open(os.environ["CHILD_PID_FILE"], "w") as f:
            f.write(str(p.pid))
        _started.append(p)


def spawning(completions, **kwargs):
    _start(new_session=False)
    return [0.0 for _ in completions]


def detaching(completions, **kwargs):
    _start(new_session=True)
    return [0.0 for _ in completions]
