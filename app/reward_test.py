"""'Test rewards' on the Build page: score a few dataset rows with the form's rewards in a separate process
(`python -m backend.rewards check --json`), so user reward code never runs in the studio process."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from backend.project import child_env
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
        try:
            proc = subprocess.run(cmd, cwd=str(base), capture_output=True, text=True, timeout=timeout_s, env=child_env())
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f}s"}
    if proc.returncode in (0, 1) and proc.stdout.strip():
        try:
            return json.loads(proc.stdout)  # NaN is accepted by Python's json
        except json.JSONDecodeError:
            pass
    err = proc.stderr.strip().splitlines()
    return {"error": "\n".join(err[-6:]) if err else f"exit status {proc.returncode}"}
