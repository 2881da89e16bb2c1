"""Start, stop and resume trainer processes. The studio and the CLI use this; neither imports the trainer.

A run is launched as `python -m backend.train --run-dir DIR` in its own process session, with
stdout and stderr going to DIR/train.log, so it survives the browser closing and the studio
restarting. Everything about it is then read from the run directory.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil

from backend.checks import validate_or_raise
from backend.procs import kill_group, spawn_group
from backend.rundir import ACTIVE_STATES, RunDir, create_run, process_alive
from backend.spec import RunSpec
from backend.train.supervise import rank_command, ranks_alive, stop_ranks


def _spawn(args: list[str], run: RunDir, base_dir: str | Path) -> int:
    with run.log_path.open("ab") as log:  # own process group: outlives the UI, and is killed as a group
        proc = spawn_group([sys.executable, "-m", "backend.train", *args], cwd=base_dir, stdout=log)
    run.write_status(pid=proc.pid, pid_create_time=psutil.Process(proc.pid).create_time())
    return proc.pid


def training_command(spec: RunSpec, run_dir: str = "RUN_DIR") -> list[str]:
    """What a launch runs for `spec`: the trainer, or with several ranks the torchrun line its supervisor
    starts (`python -m backend.train --run-dir DIR` stays the process the launcher spawns and stops)."""
    if spec.resources.world_size <= 1:
        return ["python", "-m", "backend.train", "--run-dir", run_dir]
    port = spec.resources.master_port or 29500  # 0 picks a free port at launch
    return ["torchrun", *rank_command(spec, ["--run-dir", run_dir], python="", port=port)[3:]]


def launch(spec: RunSpec, base_dir: str | Path = ".", preset: str = "") -> RunDir:
    run = create_run(validate_or_raise(spec, base_dir), base_dir, preset)
    _spawn(["--run-dir", str(run.path.resolve())], run, base_dir)
    return run


def resume(run: RunDir, base_dir: str | Path = ".") -> RunDir:
    st = run.read_status()
    if st.get("state") in ACTIVE_STATES and process_alive(st.get("pid"), st.get("pid_create_time")):
        raise RuntimeError(f"run {run.run_id} is still {st['state']}")
    run.write_status(state="starting", error="")
    _spawn(["--resume", str(run.path.resolve())], run, base_dir)
    return run


def stop(run: RunDir, force: bool = False) -> str:
    """Graceful (SIGTERM: checkpoint, then exit) or forced (SIGKILL to the whole process group)."""
    st = run.read_status()
    pid = st.get("pid")
    if not process_alive(pid, st.get("pid_create_time")):
        if ranks_alive(run):  # the supervisor is gone but ranks are not: end them
            stop_ranks(run, force=True)
        if st.get("state") in ACTIVE_STATES:
            run.write_status(state="stopped" if force else "failed", error=st.get("error") or "process not running")
        return "not running"
    try:
        if force:
            kill_group(pid, grace_s=0.0)
            stop_ranks(run, force=True)  # torchrun's ranks lead their own sessions: not in that group
            run.write_status(state="stopped", error="killed")
            return "killed"
        os.kill(pid, signal.SIGTERM)  # a supervisor passes it on to every rank
        run.write_status(state="stopping")
        return "stopping"
    except ProcessLookupError:
        return "not running"
