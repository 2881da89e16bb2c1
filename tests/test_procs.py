"""backend.procs: a spawned group is ended whole (also once its leader has exited), and a child watching its
parent exits when the parent dies."""

from __future__ import annotations

import subprocess
import sys
import time

from backend.procs import kill_group, spawn_group
from tests.procs import gone

# a leader that starts a grandchild in its group, prints the grandchild's pid, then lingers or exits
LEADER = ("import subprocess, sys, time\n"
          "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
          "print(p.pid, flush=True)\n"
          "time.sleep(60 if sys.argv[1] == 'stay' else 0)\n")


def _spawn(mode: str) -> tuple[subprocess.Popen[bytes], int]:
    proc = spawn_group([sys.executable, "-c", LEADER, mode], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_kill_group_ends_the_leader_and_what_it_forked() -> None:
    proc, grandchild = _spawn("stay")
    code = kill_group(proc, grace_s=2.0)
    assert code is not None and proc.poll() is not None
    assert gone(grandchild)


def test_kill_group_reaches_the_group_after_its_leader_exited() -> None:
    proc, grandchild = _spawn("leave")
    assert proc.wait(timeout=15) == 0
    assert not gone(grandchild, within=0.5)  # the leader is gone, its group lives on
    assert kill_group(proc, grace_s=0.0) == 0
    assert gone(grandchild)


def test_kill_group_of_nothing() -> None:
    assert kill_group(None) is None


def test_watch_parent_exits_when_the_parent_dies() -> None:
    # the middle process starts a watcher of itself, reports its pid, then dies: the watcher must follow
    watcher = ("import os, sys, time\nfrom backend.procs import watch_parent\n"
               "watch_parent(int(sys.argv[1]))\ntime.sleep(60)\n")
    middle = ("import os, subprocess, sys\nfrom backend.procs import spawn_group\n"
              f"p = spawn_group([sys.executable, '-c', {watcher!r}, str(os.getpid())])\n"
              "print(p.pid, flush=True)\n")
    proc = spawn_group([sys.executable, "-c", middle], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    proc.wait(timeout=15)
    t0 = time.time()
    assert gone(child), "the watcher outlived its parent"
    assert time.time() - t0 < 10
