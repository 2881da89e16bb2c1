"""Headless GRPO training.

    python -m backend.train --config presets/tiny-cpu.yaml [--set section.field=value ...]
    python -m backend.train --resume runs/<run_id> [--allow-path DIR ...]
    python -m backend.train --list-options          # every option with its default, bounds and help
    python -m backend.train --join runs/<run_id> --node-rank 1   # another node's ranks of a multi-node run

The first line of stdout is the run directory. A bad config exits 2 with messages naming the
fields, and creates no run directory. The studio launches `--run-dir DIR` (spec.yaml already there,
stdout already going to train.log).

A resume runs the check a start runs, confined to the working directory, the run's runs folder and any
--allow-path: a run directory may have been copied from anywhere, and its spec.yaml must not make this
process load a plugin, an interpreter or a model from elsewhere (exit 2 naming the field).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TextIO

from backend.rundir import ACTIVE_STATES, RunDir, create_run, process_alive
from backend.spec import SpecError, iter_fields, load_spec


class _Tee:
    """Mirror a stream into train.log when the trainer runs from a terminal."""

    def __init__(self, stream: TextIO, log: TextIO):
        self.stream, self.log = stream, log

    def write(self, data: str) -> int:
        self.log.write(data)
        self.log.flush()
        return self.stream.write(data)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def options_table() -> str:
    lines = []
    for f in iter_fields():
        bounds = ""
        if f.minimum is not None or f.maximum is not None:
            lo = "(" if f.exclusive_min else "["
            hi = ")" if f.exclusive_max else "]"
            bounds = f" {lo}{'' if f.minimum is None else f.minimum}, {'' if f.maximum is None else f.maximum}{hi}"
        choices = f" one of {list(f.choices)}" if f.choices else ""
        lines.append(f"{f.path} = {f.default!r}{bounds}{choices}\n    {f.help}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m backend.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--config", help="RunSpec YAML (e.g. presets/tiny-cpu.yaml)")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped or killed run from its last checkpoint")
    g.add_argument("--run-dir", help=argparse.SUPPRESS)  # the launcher's entry: spec.yaml is already in place
    g.add_argument("--list-options", action="store_true", help="print every option and exit")
    g.add_argument("--join", metavar="RUN_DIR", help="start this node's ranks of a multi-node run that node 0 "
                                                     "started (RUN_DIR on a filesystem both nodes see)")
    ap.add_argument("--node-rank", type=int, default=1, help="with --join: this node's index (1 .. nnodes-1)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="override one option (repeatable)")
    ap.add_argument("--allow-path", action="append", default=[], metavar="DIR",
                    help="with --resume: a folder outside the working directory the run's paths may lead to")
    ap.add_argument("--preset", default="", help=argparse.SUPPRESS)
    ap.add_argument("--resumed", action="store_true", help=argparse.SUPPRESS)  # the launcher checked it, or a rank
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_options:
        print(options_table())
        return 0
    base_dir = Path.cwd()

    if args.join:
        return _join(args.join, args.node_rank)
    tee = True
    status: dict[str, str] = {}  # fields the "starting" status write adds (a CLI resume: our base_dir)
    if args.config:
        from backend.checks import validate_or_raise

        try:
            spec = load_spec(args.config, args.overrides)
            # checked before anything is created: a bad config leaves no run directory
            run = create_run(validate_or_raise(spec, base_dir), base_dir, preset=args.preset or Path(args.config).stem)
        except SpecError as err:
            print(err, file=sys.stderr)
            return 2
        resume = False
    else:
        run = RunDir(args.resume or args.run_dir)
        if not run.spec_path.is_file():
            print(f"{run.path} is not a run directory (no spec.yaml)", file=sys.stderr)
            return 2
        if args.overrides:
            print("--set cannot change a run's frozen spec; start a new run with --config", file=sys.stderr)
            return 2
        st = run.read_status()
        # the launcher records the pid of the process it spawns, i.e. this one, before we get here
        if (args.resume and st.get("state") in ACTIVE_STATES and st.get("pid") != os.getpid()
                and process_alive(st.get("pid"), st.get("pid_create_time"))):
            print(f"{run.path} is still {st['state']} (pid {st['pid']}); stop it before resuming", file=sys.stderr)
            return 2
        try:
            if args.resume:  # a run directory is untrusted: Start's check, confined; base_dir is ours, not its
                from backend.checks import check_resume, resume_workspace

                spec = check_resume(run, resume_workspace(run, base_dir, args.allow_path))
                status["base_dir"] = str(base_dir.resolve())  # written with "starting" below, on one guarded write
            else:  # the launcher's entry: it checked the spec and wrote base_dir
                spec = load_spec(run.spec_path)
        except SpecError as err:
            print(err, file=sys.stderr)
            return 2
        resume = bool(args.resume) or args.resumed
        tee = not args.run_dir
        base_dir = Path(status.get("base_dir") or run.read_status().get("base_dir") or base_dir)

    from backend.train import signals, supervise

    worker = supervise.is_rank_worker()
    rank = int(os.environ.get("RANK", "0")) if worker else 0
    if worker:
        return _rank_main(spec, run, base_dir, resume, rank)
    signals.install()  # before the heavy imports below: an early SIGTERM still ends in 'stopped'
    print(run.path, flush=True)
    from backend.rollout.weight_sync import remove_orphaned_files

    remove_orphaned_files()  # weight files of trainers killed by -9, as large as their models
    if tee and not _writes_to(sys.stdout, run.log_path):  # the studio's resume sends stdout there already
        log = run.log_path.open("a")
        sys.stdout = _Tee(sys.stdout, log)  # type: ignore[assignment]
        sys.stderr = _Tee(sys.stderr, log)  # type: ignore[assignment]

    import psutil

    try:
        run.write_status(state="starting", pid=os.getpid(), pid_create_time=psutil.Process().create_time(), error="",
                         **status)
    except OSError as err:  # a full disk, say: nothing of the run can be written, so this is all it can say
        with contextlib.suppress(OSError):  # stderr may be train.log, on that disk
            print(f"cannot start: {err.strerror or err} in {run.path}", file=sys.stderr, flush=True)
        return 1
    if spec.resources.world_size > 1:  # this process supervises the ranks torchrun starts
        return supervise.supervise(spec, run, ["--run-dir", str(run.path.resolve())] + (["--resumed"] if resume else []))
    from backend.train.loop import GRPOTrainer

    trainer = GRPOTrainer(spec, run, base_dir, resume=resume)
    try:
        trainer.setup().train()
        return 0
    except Exception as err:
        import traceback

        traceback.print_exc()
        run.write_status(state="failed", error=error_summary(err))
        return 1
    finally:
        trainer.cleanup()  # a failed setup may have started workers already
        if trainer.ranks is not None:
            trainer.ranks.close()  # DeepSpeed on one process still holds a process group


def _writes_to(stream: TextIO, path: Path) -> bool:
    """Whether `stream` is the file at `path` (a tee into it would write every line twice)."""
    try:
        mine, theirs = os.fstat(stream.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):  # no file descriptor, or no such file yet
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def _rank_main(spec, run: RunDir, base_dir: Path, resume: bool, rank: int) -> int:
    """One training rank under torchrun: rank 0 writes the run directory, the others only their rank file."""
    from backend.train import signals, supervise

    signals.install()
    supervise.register_rank(run, rank)
    if rank != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - one copy of the progress lines; stderr stays
    from backend.train.loop import GRPOTrainer

    try:
        trainer = GRPOTrainer(spec, run, base_dir, resume=resume).setup()
        trainer.train()
        trainer.ranks.close()
        supervise.write_rank_file(run, rank, exited=True)
        return 0
    except Exception as err:
        import time
        import traceback

        import torch.distributed as tdist

        traceback.print_exc()
        supervise.write_rank_file(run, rank, error=error_summary(err), error_time=time.time(),
                                  dist_error=isinstance(err, tdist.DistError) or _peer_gone(err))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no clean-up: it could wait forever on peers that are gone; torchrun ends the rest


def error_summary(err: BaseException) -> str:
    """One line for status.json: the exception and where it was raised."""
    import traceback

    tb = traceback.extract_tb(err.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(err).__name__}: {err}{where}"


def _peer_gone(err: BaseException) -> bool:
    """A communication error that only says another rank went away (gloo raises plain RuntimeErrors)."""
    text = str(err).lower()
    return any(m in text for m in ("connection closed by peer", "connection reset by peer", "broken pipe",
                                   "remote worker crashing", "socket timeout"))


def _join(run_dir: str, node_rank: int) -> int:
    """Node N > 0 of a multi-node run: supervise this node's ranks; node 0 alone writes the run's status.
    Its ranks resume when the run has a checkpoint (node 0's resume), as torchrun's rendezvous waits for
    every node before the first step, no checkpoint can appear in between."""
    run = RunDir(run_dir)
    try:
        spec = load_spec(run.spec_path)
    except SpecError as err:
        print(err, file=sys.stderr)
        return 2
    if not 0 < node_rank < spec.resources.nnodes:
        print(f"--node-rank {node_rank}: this run has resources.nnodes = {spec.resources.nnodes}; "
              f"other nodes are 1 .. {spec.resources.nnodes - 1}", file=sys.stderr)
        return 2
    from backend.train import signals, supervise

    signals.install()
    spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"node_rank": node_rank})})
    resumed = run.latest_checkpoint() is not None
    return supervise.supervise(spec, run, ["--run-dir", str(run.path.resolve())] + (["--resumed"] if resumed else []))
