"""'Test rewards' on the Build page: score a few dataset rows with the form's rewards in a separate process
(`python -m backend.rewards check --json`), so user reward code never runs in the studio process.

The checker's output goes to files, not pipes, and the wait is for the process itself: a pipe stays open as
long as anything a plugin started (even outside the checker's process group) holds it, and waiting for its
end once waited the whole timeout. Whatever is left in the checker's group is killed when it exits."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from backend.procs import kill_group, spawn_group
from backend.spec import RunSpec


def score_rewards(spec: RunSpec, base: Path, rows: int = 8, completions: str = "solution",
                 timeout_s: float = 180.0) -> dict[str, Any]:
    """Score a few dataset rows with the spec's rewards through `python -m backend.rewards check --json`, in a
    separate process (user reward code never runs in the studio process).

    Returns {'functions': [...], 'samples': [...]} (partial failures included), or {'error': str}, or
    {'unavailable': str} when the rewards layer has no checker."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "spec.yaml"
        cfg.write_text(spec.to_yaml())
        cmd = [sys.executable, "-m", "backend.rewards", "check", "--spec", str(cfg), "--rows", str(rows),
               "--completions", completions, "--base-dir", str(base), "--json"]
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with out_path.open("wb") as out, err_path.open("wb") as err_file:
            proc = spawn_group(cmd, cwd=base, stdout=out, stderr=err_file)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_group(proc, grace_s=0.0)
                return {"error": f"timed out after {timeout_s:.0f}s"}
            kill_group(proc, grace_s=0.0)  # what a plugin left behind in the checker's group
        stdout = out_path.read_text(errors="replace")
        stderr = err_path.read_text(errors="replace")
    if code in (0, 1) and stdout.strip():
        try:
            return json.loads(stdout)  # NaN is accepted by Python's json
        except json.JSONDecodeError:
            pass
    err = stderr.strip().splitlines()
    return {"error": "\n".join(err[-6:]) if err else f"exit status {code}"}
