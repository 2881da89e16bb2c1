"""bench/gpu_check.sh, the one prepared GPU check: its floor says what an interpreter lacks before anything is
timed, and the whole check runs end to end (on CPU, at the small shape) so it works the day a GPU is lent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.gpu_check import FLOOR, floor_problems, installed_versions

ROOT = Path(__file__).resolve().parent.parent


def test_the_floor_names_what_is_missing_or_too_old() -> None:
    have = {name: "99.0" for name in FLOOR}
    assert floor_problems(have) == []
    have["pydantic"] = None  # the GPU machine's python3 has no pydantic
    have["transformers"] = "5.16.2"
    have["torch"] = "2.11.0+cu130"  # a local build tag is not a lower version
    bad = floor_problems(have)
    assert len(bad) == 2, bad
    assert "transformers 5.16.2 is older than 5.17" in bad
    assert any("pydantic is not importable" in b and "gpu_wheels.sh" in b for b in bad)


def test_this_venv_meets_the_floor() -> None:
    assert floor_problems(installed_versions()) == []


def test_the_check_runs_end_to_end_on_cpu() -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", "bench/gpu_check.sh", "--device", "cpu", "--shape", "small", "--tokens", "16",
                           "--prompts", "2", "--generations", "2", "--steps", "2", "--trainers", "ours"],
                          cwd=ROOT, capture_output=True, text=True, timeout=400, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-2000:]
    assert "FAILED" not in out, out
    lines = {ln.split("]")[0] + "]": ln for ln in out.splitlines() if ln.startswith("[")}
    assert lines["[floor]"].endswith(": ok")
    assert "vocabulary 151936" in lines["[shape]"] and "footprint estimate" in lines["[shape]"]
    ours = lines["[ours small x16]"]
    assert " s/step" in ours and "peak" in ours, ours  # by phase too where the kernel resets VmHWM (telemetry)
