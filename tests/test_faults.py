"""Fault injection (issue 28, items 5-9): non-finite values, hostile run-directory files, corrupt checkpoints, a
full disk, and the processes a run leaves behind. Each test failed before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from backend.rundir import RunDir
from backend.train import guard
from backend.train.loop import GRPOTrainer
from tests.test_trainer import ROOT, TINY, make_run, train

PLUGIN = ROOT / "tests/plugins/nonfinite_rewards.py"


def strict_rows(path: Path) -> list[dict]:
    """Every line as strict JSON (Python's json accepts NaN and Infinity, which JSON does not have)."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines() if line.strip()]


def weights_of(run: RunDir, step: int) -> dict[str, torch.Tensor]:
    return load_file(run.checkpoints_dir / f"step-{step}" / "model" / "model.safetensors")


# ----------------------------------------------------------------------------- 5: non-finite values


def test_huge_rewards_skip_every_update_and_fail_the_run_after_three(tmp_path: Path) -> None:
    run, spec = make_run(tmp_path, "algorithm.max_steps=6", f"rewards.plugins=[{PLUGIN}]",
                         "rewards.functions=[{name: huge}]")
    t = GRPOTrainer(spec, run, ROOT).setup()
    before = {n: p.detach().clone() for n, p in t.policy.named_parameters()}
    with pytest.raises(guard.NonFiniteError, match=f"{guard.LIMIT} updates in a row skipped"):
        t.train()
    assert all(torch.equal(p, before[n]) for n, p in t.policy.named_parameters())  # no update was applied
    rows = strict_rows(run.metrics_path)  # valid JSON: null where the value is not finite
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r[guard.SKIPPED] == 1.0 and r["loss"] is None and r["reward"] is None for r in rows)
    warnings = run.read_status()["warnings"]
    assert any("skipped for non-finite values" in w for w in warnings)
    assert run.checkpoints() == []  # the failure saved nothing
    strict_rows(run.samples_path)


def test_one_overflowing_batch_is_skipped_and_training_goes_on(tmp_path: Path) -> None:
    run, t = train(tmp_path, "algorithm.max_steps=3", f"rewards.plugins=[{PLUGIN}]",
                   "rewards.functions=[{name: exact_match}, {name: huge_once}]")
    rows = strict_rows(run.metrics_path)
    assert [r[guard.SKIPPED] for r in rows] == [1.0, 0.0, 0.0]
    assert rows[1]["grad_norm"] > 0
    assert run.read_status()["state"] == "finished"
    assert all(torch.isfinite(w).all() for w in weights_of(run, 3).values())


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_a_reward_beyond_float32_is_a_reward_error(tmp_path: Path, on_error: str) -> None:
    from backend.rewards.scorer import RewardError

    overrides = ("algorithm.max_steps=1", f"rewards.plugins=[{PLUGIN}]", f"rewards.on_error={on_error}",
                 "rewards.functions=[{name: exact_match}, {name: astronomic}]")
    if on_error == "fail":
        with pytest.raises(RewardError, match="1e\\+308 is too large"):
            train(tmp_path, *overrides)
        return
    run, _ = train(tmp_path, *overrides)  # left unscored, counted as an error: nothing overflows
    (row,) = strict_rows(run.metrics_path)
    assert row["rewards/astronomic/errors"] == 1.0 and row[guard.SKIPPED] == 0.0


def test_a_non_finite_gradient_is_never_applied() -> None:
    from backend.train.dist import clipped_step

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([w], lr=0.1)
    w.grad = torch.tensor([1.0, float("nan"), 1.0])
    norm = clipped_step([w], opt, 1.0)
    assert norm != norm and torch.equal(w.detach(), torch.ones(3)) and not opt.state


def test_non_finite_weights_are_never_checkpointed(tmp_path: Path) -> None:
    run, t = train(tmp_path, "algorithm.max_steps=2", "output.save_steps=1")
    with torch.no_grad():
        next(t.policy.parameters())[0] = float("nan")
    t.step = 3
    with pytest.raises(guard.NonFiniteError, match="not finite at step 3"):
        t.save_checkpoint()
    assert [p.name for p in run.checkpoints()] == ["step-1", "step-2"]
    assert not list(run.checkpoints_dir.glob(".*"))


# --------------------------------------------------------------------- 6: run-directory files, written strictly, read warily


def test_metrics_are_written_as_strict_json(tmp_path: Path) -> None:
    import numpy as np

    run = RunDir(tmp_path)
    run.append_jsonl(run.metrics_path, [{"step": 1, "loss": float("nan"), "kl": float("-inf"),
                                         "n": np.float32("inf"), "t": torch.tensor([1.0, float("nan")])}])
    run.write_status(state="running", reward=float("nan"))
    assert strict_rows(run.metrics_path) == [{"step": 1, "loss": None, "kl": None, "n": None, "t": [1.0, None]}]
    assert json.loads(run.status_path.read_text(), parse_constant=lambda c: 1 / 0)["reward"] is None


def _run_with_status(root: Path, name: str, content: bytes) -> RunDir:
    (root / name).mkdir(parents=True)
    (root / name / "spec.yaml").write_text(TINY.read_text())
    (root / name / "status.json").write_bytes(content)
    return RunDir(root / name)


@pytest.mark.parametrize("content", [b"\xff\xfe{\x00", b"null", b"[1, 2]", b'"running"', b"{not json"])
def test_a_broken_status_shows_as_broken_and_the_others_still_list(tmp_path: Path, content: bytes) -> None:
    from app.runlist import runs_table
    from app.runs_tab import progress_html

    good = _run_with_status(tmp_path, "20260101-000000-good", b'{"state": "finished", "step": 3, "total_steps": 3}')
    bad = _run_with_status(tmp_path, "20260102-000000-bad", content)
    infos, rows = runs_table(tmp_path)
    by_id = {i.run_id: i for i in infos}
    assert by_id[good.run_id].state == "finished" and by_id[good.run_id].step == 3
    assert by_id[bad.run_id].state == "broken" and "status.json" in by_id[bad.run_id].error
    assert bad.state() == "broken"
    assert "status.json" in progress_html(by_id[bad.run_id], None, "en")
    bad.write_status(state="stopped")  # a writer replaces a broken file
    assert bad.read_status()["state"] == "stopped"


def test_status_fields_of_the_wrong_type_are_dropped(tmp_path: Path) -> None:
    from app.runlist import run_info

    run = _run_with_status(tmp_path, "r", json.dumps({"state": "running", "pid": "1", "pid_create_time": [],
                                                      "step": "x", "warnings": 7, "reward": {}}).encode())
    info = run_info(run)
    assert info.state == "failed"  # running, with no process to show for it
    assert info.step == 0 and info.warnings == [] and info.reward is None


def test_bare_and_foreign_metric_lines_are_skipped(tmp_path: Path) -> None:
    from app.store import RunCache

    run = RunDir(tmp_path)
    run.metrics_path.write_bytes(b'{"step": 1, "reward": 0.5}\n42\n"text"\n[1]\n\xff\xfe\n{"step": "two"}\n'
                                 b'{"step": 2, "reward": 0.7}\n')
    rows, _ = run.read_metrics()
    assert [r["step"] for r in rows] == [1, "two", 2]
    table = RunCache(tmp_path).refresh_metrics()
    assert len(table) == 3
    run.truncate_after_step(1)  # what a resume does: it must not trip over the bad lines
    assert [r["step"] for r in run.read_metrics()[0]] == [1]
