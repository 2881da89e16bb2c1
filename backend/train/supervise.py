"""Start the training ranks under torchrun and answer for them as one run.

`python -m backend.train --run-dir DIR` with resources.world_size > 1 becomes this supervisor: it runs

    python -m torch.distributed.run --nnodes N --node_rank R --nproc_per_node P --master_addr A --master_port X
        -m backend.train --run-dir DIR [--resumed]

(torchrun; `rank_command` builds it, the launcher and the studio's Preview show it) and stays the run's
process: the launcher's pid, stop and kill act on it. Why a supervisor rather than torchrun alone:
- torchrun starts each rank in its own session, so killing the launcher's process group would leave
  the ranks running. Each rank records its pid in DIR/ranks/rank-N.json; the supervisor (and a forced
  stop in the launcher) ends whatever is left of them: no orphans.
- a stop must reach every rank as SIGTERM so that they agree on the step, checkpoint and exit; torchrun
  itself would SIGKILL them 30 s after forwarding it. The supervisor signals the ranks directly.
- when a rank dies, the run fails with that rank's error. A rank that raises writes its error to its
  rank file; a rank killed by a signal writes nothing, and is named as the cause. Errors that only say a
  peer went away (torch.distributed's DistError) are consequences, not causes.
Only node 0's supervisor writes the run's status; the others run their node's ranks.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from backend.project import child_env
from backend.rundir import ACTIVE_STATES, RunDir, atomic_write_text, process_alive, read_json_object
from backend.spec import RunSpec

WORKER_ENV = "GRPO_STUDIO_RANK"  # set for the ranks: they train instead of supervising again


def is_rank_worker() -> bool:
    return os.environ.get(WORKER_ENV) == "1" and "RANK" in os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_command(spec: RunSpec, entry_args: list[str], python: str = sys.executable, port: int | None = None
                 ) -> list[str]:
    """The torchrun command line that starts this node's ranks of `spec` (python -m torch.distributed.run
    is torchrun, from the same interpreter)."""
    res = spec.resources
    port = port if port is not None else (res.master_port or free_port())
    return [python, "-m", "torch.distributed.run", "--nnodes", str(res.nnodes), "--node_rank", str(res.node_rank),
            "--nproc_per_node", str(res.ranks_per_node), "--master_addr", res.master_addr, "--master_port", str(port),
            "--max_restarts", "0", "--monitor_interval", "0.5", "-m", "backend.train", *entry_args]


def rank_env(spec: RunSpec) -> dict[str, str]:
    extra = {WORKER_ENV: "1"}
    if spec.resources.train_gpus:  # rank r trains on cuda:r of these
        extra["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.resources.train_gpus)
    if spec.resources.num_threads:
        extra["OMP_NUM_THREADS"] = str(spec.resources.num_threads)
    return child_env(extra)


# ----------------------------------------------------------------------------- rank files


def ranks_dir(run: RunDir) -> Path:
    return run.path / "ranks"


def write_rank_file(run: RunDir, rank: int, **fields: Any) -> None:
    path = ranks_dir(run) / f"rank-{rank}.json"
    path.parent.mkdir(exist_ok=True)
    data = read_json_object(path)[0]
    data.update(fields, rank=rank)
    atomic_write_text(path, json.dumps(data))


def register_rank(run: RunDir, rank: int) -> None:
    """Called by each rank as it starts: where to find (and, if need be, end) it."""
    write_rank_file(run, rank, pid=os.getpid(), create_time=psutil.Process().create_time(), host=socket.gethostname(),
                    error="", dist_error=False, error_time=None, exited=False)


def read_rank_files(run: RunDir) -> list[dict[str, Any]]:
    out = []
    for p in sorted(ranks_dir(run).glob("rank-*.json")):
        data = read_json_object(p)[0]
        if isinstance(data.get("rank"), int):  # the field every reader keys on
            out.append(data)
    return out


def live_ranks(run: RunDir) -> list[dict[str, Any]]:
    host = socket.gethostname()
    return [r for r in read_rank_files(run)
            if r.get("host") == host and process_alive(r.get("pid"), r.get("create_time"))]


def signal_ranks(run: RunDir, sig: int) -> int:
    """Send `sig` to this host's live ranks; SIGKILL takes each rank's whole session (reward workers too)."""
    n = 0
    for r in live_ranks(run):
        try:
            if sig == signal.SIGKILL:
                os.killpg(r["pid"], sig)  # a torchrun worker leads its own session
            else:
                os.kill(r["pid"], sig)
            n += 1
        except (ProcessLookupError, PermissionError):
            continue
    return n


def _error_time(rank_file: dict[str, Any]) -> float:
    t = rank_file.get("error_time")
    return float(t) if isinstance(t, (int, float)) else 0.0


def failure_summary(ranks: list[dict[str, Any]], vanished: dict[int, float]) -> str:
    """The sentence a failed multi-rank run reports: the rank that caused it, and its error."""
    causes = sorted((r for r in ranks if r.get("error") and not r.get("dist_error")), key=_error_time)
    if causes:
        return f"rank {causes[0]['rank']}: {causes[0]['error']}"
    if vanished:
        rank = min(vanished, key=vanished.__getitem__)
        return (f"rank {rank} died without an error (killed by a signal, or out of memory); "
                "the other ranks were stopped")
    consequences = sorted((r for r in ranks if r.get("error")), key=_error_time)
    if consequences:
        return f"rank {consequences[0]['rank']}: {consequences[0]['error']}"
    return "the training ranks exited without a final status (see train.log)"


# ----------------------------------------------------------------------------- the supervisor


def supervise(spec: RunSpec, run: RunDir, entry_args: list[str]) -> int:
    """Run this node's ranks to the end; on node 0 leave the run's final status right. Returns an exit code."""
    res = spec.resources
    main_node = res.node_rank == 0
    first = res.node_rank * res.ranks_per_node
    for r in range(first, first + res.ranks_per_node):  # a previous attempt's files
        (ranks_dir(run) / f"rank-{r}.json").unlink(missing_ok=True)
    cmd = rank_command(spec, entry_args)
    print("starting ranks: " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, env=rank_env(spec), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    stop = threading.Event()

    def request_stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    def copy_output() -> None:  # the ranks' output into this process's stdout (train.log)
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, b""):
            sys.stdout.write(line.decode(errors="replace"))
            sys.stdout.flush()

    pump = threading.Thread(target=copy_output, daemon=True)
    pump.start()
    seen: dict[int, dict[str, Any]] = {}
    vanished: dict[int, float] = {}  # ranks gone without a word: rank -> when it was noticed
    signalled: set[int] = set()
    while proc.poll() is None:
        for r in read_rank_files(run):
            if r.get("host") == socket.gethostname():
                seen[r["rank"]] = r
        for rank, r in seen.items():
            alive = process_alive(r.get("pid"), r.get("create_time"))
            if not alive and rank not in vanished:
                vanished[rank] = time.time()
            if stop.is_set() and alive and rank not in signalled:
                try:
                    os.kill(r["pid"], signal.SIGTERM)  # each rank checkpoints and exits; they agree on the step
                    signalled.add(rank)
                except ProcessLookupError:
                    pass
        time.sleep(0.3)
    pump.join(timeout=5)
    rc = proc.returncode
    leftovers = signal_ranks(run, signal.SIGKILL)  # torchrun is gone: nothing of this run may outlive it
    if leftovers:
        print(f"killed {leftovers} leftover rank process(es)", flush=True)
    if not main_node:
        return 0 if rc == 0 else 1
    ranks = read_rank_files(run)
    clean = {r["rank"] for r in ranks if r.get("exited") or r.get("error")}
    vanished = {k: v for k, v in vanished.items() if k not in clean}
    state = run.read_status().get("state")
    if rc != 0 or state in ACTIVE_STATES:
        error = failure_summary(ranks, vanished)
        print(f"run failed: {error}", flush=True)
        run.write_status(state="failed", error=error)
        return 1
    return 0


def stop_ranks(run: RunDir, force: bool) -> int:
    """The launcher's stop for the ranks themselves (they are not in the supervisor's process group)."""
    return signal_ranks(run, signal.SIGKILL if force else signal.SIGTERM)


def ranks_alive(run: RunDir) -> bool:
    return bool(live_ranks(run))


__all__ = ["is_rank_worker", "rank_command", "supervise", "register_rank", "write_rank_file", "stop_ranks",
           "failure_summary", "ranks_alive"]
