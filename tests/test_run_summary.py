"""The "what happened" summary: a pure function of the run directory, checked against hand-worked numbers."""

from __future__ import annotations

import json
from pathlib import Path

from app.run_summary import change, completion_tokens, summarize, summary_markdown
from backend.rundir import RunDir


def make_run(root: Path, steps: int = 20, iterations: int = 1) -> RunDir:
    run = RunDir(root / "20261204-010000-demo-ab12")
    run.path.mkdir(parents=True)
    rows = []
    for s in range(1, steps + 1):
        rows.append({"step": s, "rollout": (s - 1) // iterations, "reward": s / 10,
                     "throughput/completion_tokens_per_s": 100.0, "timing/step_s": 2.0})
    run.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run.eval_dir).mkdir()
    (run.eval_dir / "during_training.jsonl").write_text(
        "".join(json.dumps({"step": s, "eval/reward": r}) + "\n" for s, r in ((5, 0.40), (10, 0.80), (20, 0.70))))
    for s in (10, 20):
        (run.checkpoints_dir / f"step-{s}").mkdir(parents=True)
        (run.checkpoints_dir / f"step-{s}" / "COMPLETE").write_text("")
    run.write_status(state="finished", step=steps, total_steps=steps, elapsed_s=148.0,
                     warnings=["reward exact_match returned None for a whole batch at step 3"])
    return run


def test_change_averages_the_first_and_last_tenth() -> None:
    pts = [(s, float(s)) for s in range(1, 41)]  # 40 points: k = 4
    c = change(pts)
    assert (c.first, c.last) == (2.5, 38.5) and c.first_steps == (1, 4) and c.last_steps == (37, 40)
    assert change([(1, 0.5)]).delta == 0.0 and change([]) is None
    assert change(pts, window=1).first == 1.0


def test_completion_tokens_count_each_rollout_once() -> None:
    rows = [{"step": s, "rollout": (s - 1) // 2, "throughput/completion_tokens_per_s": 50.0, "timing/step_s": 2.0}
            for s in range(1, 7)]  # 3 rollouts x 2 updates: 3 x 100 tokens
    assert completion_tokens(rows) == 300
    assert completion_tokens([{"step": 1, "reward": 1.0}]) is None
    # the logged count wins over rate x time (which a run logged before `completions/tokens` needs)
    logged = [{**r, "completions/tokens": 70.0} for r in rows]
    assert completion_tokens(logged) == 210


def test_summary_of_a_run_directory(tmp_path: Path) -> None:
    s = summarize(make_run(tmp_path))
    assert s.state == "finished" and (s.step, s.total_steps) == (20, 20)
    assert s.reward is not None and (round(s.reward.first, 3), round(s.reward.last, 3)) == (0.15, 1.95)  # k = 2
    assert s.heldout is not None and (s.heldout.first, s.heldout.last) == (0.40, 0.70)
    assert s.best is not None and s.best.step == 10 and s.best.value == 0.80  # step 5 was not saved
    assert s.completion_tokens == 20 * 200 and s.trained_s == 148.0
    md = summary_markdown(s)
    assert "**reward**: 0.150 → 1.950 (+1.800; steps 1-2 → steps 19-20)" in md
    assert "**held-out reward**: 0.400 → 0.700 (+0.300; step 5 → step 20)" in md
    assert "`checkpoints/step-10` (eval/reward 0.800)" in md
    assert "2m 28s" in md and "4,000" in md and "Warnings (1)" in md and "at step 3" in md
    zh = summary_markdown(s, "zh")
    assert "奖励" in zh and "最佳检查点" in zh and "警告（1 条）" in zh


def test_summary_of_a_bare_run_says_only_what_is_known(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "20261204-010000-bare-0000")
    run.path.mkdir()
    run.write_status(state="failed", step=0, error="CUDA out of memory\ntraceback...")
    s = summarize(run)
    assert s.reward is None and s.heldout is None and s.best is None and s.completion_tokens is None
    md = summary_markdown(s)
    assert "reward" not in md.lower().replace("warnings", "") and "Error**: CUDA out of memory" in md
    assert "traceback" not in md and "Warnings (0)**: –" in md
