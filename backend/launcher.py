"""Start, stop and resume trainer processes. The studio and the CLI use this; neither imports the trainer.

A run is launched as `python -m backend.train --run-dir DIR` in its own process session, with
stdout and stderr going to DIR/train.log, so it survives the browser closing and the studio
restarting. Everything about it is then read from the run directory.

Start and Resume run the same full check with the same confinement: a run directory may have been copied
in by anyone, so its spec.yaml is no more trusted than a form, and a resume is refused, with the field
named, when it names a plugin, an interpreter or a model outside the workspace. The resumed trainer is
spawned with `--run-dir DIR --resumed`: this check is the one it gets, against this workspace, and its
base_dir (status.json) is this workspace's root, not the copied run's.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil

from backend.checks import check_resume, resume_workspace, validate_or_raise
from backend.procs import kill_group, spawn_group
from backend.rundir import ACTIVE_STATES, RunDir, create_run, process_alive
from backend.spec import RunSpec
from backend.train.supervise import rank_command, ranks_alive, stop_ranks
from backend.workspace import Workspace


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


def launch(spec: RunSpec, base_dir: str | Path = ".", preset: str = "", workspace: Workspace | None = None) -> RunDir:
    """Check `spec` (confined to `workspace` when given: the studio's), freeze it into a new run, start it."""
    run = create_run(validate_or_raise(spec, base_dir, workspace=workspace), base_dir, preset)
    _spawn(["--run-dir", str(run.path.resolve())], run, base_dir)
    return run


def resume(run: RunDir, base_dir: str | Path = ".", workspace: Workspace | None = None) -> RunDir:
    """Continue a stopped run after the check Start runs (SpecError names what is refused); `workspace`
    defaults to `checks.resume_workspace(run, base_dir)`, and its root is the run's base_dir from now on."""
    st = run.read_status()
    if st.get("state") in ACTIVE_STATES and process_alive(st.get("pid"), st.get("pid_create_time")):
        raise RuntimeError(f"run {run.run_id} is still {st['state']}")
    ws = workspace or resume_workspace(run, base_dir)
    check_resume(run, ws)
    try:  # the trainer's own message about a full disk would go to train.log, on that disk: say it here
        run.write_status(state="starting", error="", base_dir=str(ws.root))  # where its relative paths were checked
    except OSError as err:
        raise RuntimeError(f"cannot resume: {(err.strerror or str(err)).lower()} in {run.path}") from None
    _spawn(["--run-dir", str(run.path.resolve()), "--resumed"], run, ws.root)
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
