"""Rewards inside a real run of the tiny model: a failing plugin stops the run with a clear error
(on_error=fail) or scores None and counts rewards/<fn>/errors (on_error=skip)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.rewards.scorer import RewardError
from backend.rundir import RunDir, create_run, read_jsonl
from backend.spec import load_spec
from backend.train.loop import GRPOTrainer

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets/tiny-cpu.yaml"
BAD = Path(__file__).parent / "plugins" / "bad_rewards.py"
FAST = ["algorithm.prompts_per_step=2", "rollout.num_generations=2", "output.eval_steps=0", "output.save_steps=0",
        "algorithm.max_steps=2", f"rewards.plugins=[{BAD}]",
        "rewards.functions=[{name: exact_match}, {name: not_a_list}]"]


def make_run(tmp_path: Path, *overrides: str) -> RunDir:
    spec = load_spec(TINY, [f"output.runs_dir={tmp_path / 'runs'}", *FAST, *overrides])
    return create_run(spec, ROOT)


def test_skip_mode_counts_errors_and_trains_on(tmp_path: Path) -> None:
    run = make_run(tmp_path, "rewards.on_error=skip")
    GRPOTrainer(load_spec(run.path / "spec.yaml"), run, ROOT).setup().train()
    rows = read_jsonl(run.metrics_path)[0]
    assert [r["rewards/not_a_list/errors"] for r in rows] == [1, 2]
    assert all(r["rewards/exact_match/errors"] == 0 for r in rows)
    assert run.read_status()["state"] == "finished"


def test_fail_mode_stops_the_run_with_the_message(tmp_path: Path) -> None:
    # backend.train turns this exception into status "failed" with the message (tests/test_trainer.py covers that)
    run = make_run(tmp_path)
    trainer = GRPOTrainer(load_spec(run.path / "spec.yaml"), run, ROOT).setup()
    worker = trainer.scorer._worker
    assert worker is not None and worker.proc is not None
    proc = worker.proc
    with pytest.raises(RewardError, match=r"reward 'not_a_list' returned float, expected a list of 4 floats"):
        trainer.train()
    assert proc.poll() is not None  # the trainer closed the scorer: no worker left behind
