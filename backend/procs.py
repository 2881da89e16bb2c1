"""Child processes in their own process group: starting them, ending them, and dying with the parent.

The one home of these three (the rollout worker, the reward worker, the launcher and the studio's evaluation
all start children this way):
- `spawn_group(cmd, ...)` starts `cmd` as the leader of a new session, with the project's environment
  (`project.child_env`) and an empty stdin. A group of its own means a kill reaches whatever the child forks
  (engine helpers, a plugin's subprocesses) and a terminal's Ctrl-C or the studio's exit does not reach it.
- `kill_group(proc)` ends the whole group: SIGTERM, a grace period, then SIGKILL. It signals the group even when
  its leader has already exited, since the leader's pid stays the group's id while any member lives.
- `watch_parent(pid)` makes a child exit once its parent is gone, which a child in its own session otherwise
  never notices (no terminal signal reaches it, and a loop in user code never reads a closed pipe). It leaves
  by `exit_with_group`, which a child that sees its parent's pipe close calls too: a group leader takes its
  group with it, since after a kill -9 of the trainer nobody else is left to end what a plugin started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from backend.project import child_env

Output = int | IO[bytes] | None  # what Popen takes for stdout and stderr


def spawn_group(cmd: list[str], *, stdout: Output = None, stderr: Output = subprocess.STDOUT, cwd: str | Path | None = None,
                env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    """Start `cmd` leading a new session (its pid is its group's id), with `project.child_env(env)` and stdin
    empty (so an input() in the child cannot hang). stderr goes to stdout unless given."""
    return subprocess.Popen(cmd, cwd=None if cwd is None else str(cwd), stdout=stdout, stderr=stderr,
                            stdin=subprocess.DEVNULL, env=child_env(env), pass_fds=pass_fds, start_new_session=True)


def _signal_group(pgid: int, sig: int, leader: subprocess.Popen[bytes] | None) -> bool:
    """Send `sig` to the group; False when there is nothing left to signal."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:  # no such group: a leader that never got one of its own (not from spawn_group)
        pass
    except PermissionError:
        return False
    if leader is not None and leader.returncode is not None:
        return False  # reaped: its pid may belong to someone else by now
    try:
        os.kill(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def kill_group(proc: subprocess.Popen[bytes] | int | None, grace_s: float = 5.0, wait_s: float = 10.0) -> int | None:
    """End the process group that `proc` (a Popen from spawn_group, or the pid of a group leader) leads: SIGTERM,
    up to `grace_s` for the leader to exit (0: straight to SIGKILL), then SIGKILL to the whole group, also to
    members the leader left behind. Returns the leader's exit code when it is our child and exited within
    `wait_s`, else None."""
    if proc is None:
        return None
    leader = None if isinstance(proc, int) else proc
    pgid = proc if isinstance(proc, int) else proc.pid
    if grace_s > 0 and (leader is None or leader.poll() is None) and _signal_group(pgid, signal.SIGTERM, leader):
        if leader is not None:
            try:
                leader.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
    _signal_group(pgid, signal.SIGKILL, leader)
    if leader is None:
        return None
    try:
        return leader.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return None


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Exit this process (code 1, at once) when `parent_pid` is no longer its parent, i.e. the parent died and the
    process was re-parented (`exit_with_group`). Checked now, then every `interval_s` by a daemon thread. Not
    PR_SET_PDEATHSIG: that fires when the parent *thread* that spawned us ends, and pools spawn workers from
    short-lived threads."""
    if os.getppid() != parent_pid:
        exit_with_group()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent_pid:
                exit_with_group()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def exit_with_group(code: int = 1) -> None:
    """Exit at once; a process that leads its group (spawn_group's children) kills the whole group, itself
    included, so nothing it or user code started outlives it."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(code)
