"""Rollout pool and worker supervision: data-parallel workers sample what one would; a worker that dies,
hangs or cannot start gives an error naming it and its log; nothing is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from procs import gone
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.project import PROJECT_ROOT, child_env
from backend.rollout.base import PromptInput, SamplingParams
from backend.rollout.hf import HFEngine
from backend.rollout.pool import split_groups, start_workers
from backend.rollout.worker import RolloutWorkerError, WorkerConfig, spawn_worker

TINY = PROJECT_ROOT / "assets/tiny-add"
CFG = WorkerConfig(engine="hf", model=str(TINY), dtype="float32")


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TINY)


@pytest.fixture(scope="module")
def pool2(tmp_path_factory):
    pool = start_workers(CFG, 2, tmp_path_factory.mktemp("pool"), start_timeout_s=300)
    yield pool
    pids = [h.proc.pid for h in pool.instances]
    pool.close()
    assert all(gone(p) for p in pids)


def test_split_groups() -> None:
    assert split_groups(5, 2) == [range(0, 3), range(3, 5)]
    assert split_groups(4, 4) == [range(i, i + 1) for i in range(4)]
    assert split_groups(1, 3) == [range(0, 1)]  # fewer groups than instances: idle instances get nothing


def test_two_workers_sample_what_one_engine_samples(pool2, tok) -> None:
    texts = ["12+34=", "9+9=", "10+20=", "71+18=", "5+5="]
    prompts = [PromptInput(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    sp = SamplingParams(n=4, max_tokens=6, temperature=1.2, seed=42)
    one = HFEngine(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32), tok).generate(prompts, sp)
    two = pool2.generate(prompts, sp)
    assert [[c.token_ids for c in g] for g in two] == [[c.token_ids for c in g] for g in one]
    for ga, gb in zip(two, one):
        for a, b in zip(ga, gb):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    t = pool2.last_timings()
    assert [x.groups for x in t] == [3, 2] and all(x.seconds > 0 and x.completion_tokens > 0 for x in t)


def test_pool_pushes_weights_to_every_worker(pool2, tok) -> None:
    prompts = [PromptInput(tok(t, add_special_tokens=False)["input_ids"]) for t in ["12+34=", "9+9="]]
    sp = SamplingParams(n=4, max_tokens=6, seed=5)
    before = pool2.generate(prompts, sp)
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    pool2.update_weights(model.named_parameters(), version=7)
    assert [h.health()["version"] for h in pool2.instances] == [7, 7]
    local = HFEngine(model, tok).generate(prompts, sp)
    after = pool2.generate(prompts, sp)
    assert [[c.token_ids for c in g] for g in after] == [[c.token_ids for c in g] for g in local]
    assert [[c.token_ids for c in g] for g in after] != [[c.token_ids for c in g] for g in before]
    path = pool2.shared.path  # both workers read one mapped file, rewritten in place by the next update
    pool2.update_weights(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).named_parameters())
    assert pool2.shared.path == path and os.path.exists(path)
    assert [[c.token_ids for c in g] for g in pool2.generate(prompts, sp)] == [[c.token_ids for c in g] for g in before]


def test_hung_then_killed_workers_give_clear_errors_and_leave_nothing(pool2, tok) -> None:
    """Runs last on the shared pool: one worker stops answering, the other dies; both are named, nothing is left."""
    h0, h1 = pool2.instances
    pids = [h0.proc.pid, h1.proc.pid]
    prompts = [PromptInput(tok(t, add_special_tokens=False)["input_ids"]) for t in ["12+34=", "9+9="]]
    os.kill(pids[0], signal.SIGSTOP)
    h0.timeout_s = 2.0
    with pytest.raises(RolloutWorkerError, match=r"rollout worker rollout-0 \(CPU.*did not answer generate within 2s \(killed\)"):
        h0.generate(prompts, SamplingParams(n=1, max_tokens=2))
    assert gone(pids[0])
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(RolloutWorkerError) as err:
        h1.generate(prompts, SamplingParams(n=2, max_tokens=4, seed=0))
    msg = str(err.value)
    assert "rollout worker rollout-1 (CPU" in msg and f"pid {pids[1]}" in msg
    assert "rollout-worker-1.log" in msg and "GRPO-WORKER-READY" in msg  # the log's last lines
    pool2.close()
    assert all(gone(p) for p in pids)


def test_worker_that_cannot_start_names_the_cause(tmp_path) -> None:
    bad = WorkerConfig(engine="hf", model=str(tmp_path / "no-such-model"))
    with pytest.raises(RolloutWorkerError, match=r"(?s)rollout worker bad .*exited with code 1 while starting.*no-such-model"):
        spawn_worker(bad, "bad", tmp_path / "bad.log", start_timeout_s=300)


@pytest.mark.slow
def test_worker_dies_with_its_parent(tmp_path) -> None:
    """A trainer killed with -9 cannot close its workers: they must notice and exit by themselves."""
    code = ("import sys, time; from pathlib import Path; from backend.rollout.worker import WorkerConfig, spawn_worker; "
            f"h = spawn_worker(WorkerConfig(model={str(TINY)!r}), 'orphan', Path({str(tmp_path / 'o.log')!r})); "
            "print(h.proc.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        worker_pid = int(parent.stdout.readline())
        assert psutil.pid_exists(worker_pid)
        parent.kill()
        parent.wait()
        assert gone(worker_pid, within=15.0)
    finally:
        parent.kill()


def test_worker_started_by_hand_is_reached_by_url(tmp_path, tok, monkeypatch) -> None:
    """The documented command on 'another node' (here: loopback), then rollout.worker_urls' path: connect by URL."""
    import socket

    from backend.rollout.pool import RolloutPool
    from backend.rollout.worker import connect_worker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "w.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "backend.rollout.worker", "--engine", "hf", "--model", str(TINY),
                             "--listen", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            env=child_env({"GRPO_WORKER_AUTHKEY": "s3cret"}), start_new_session=True)
    try:
        t0 = time.time()
        while "GRPO-WORKER-READY" not in (tmp_path / "w.log").read_text():
            assert proc.poll() is None and time.time() - t0 < 120
            time.sleep(0.2)
        monkeypatch.setenv("GRPO_WORKER_AUTHKEY", "wrong")
        with pytest.raises(RolloutWorkerError, match="refused the connection"):
            connect_worker(f"127.0.0.1:{port}", "remote")
        monkeypatch.setenv("GRPO_WORKER_AUTHKEY", "s3cret")
        h = connect_worker(f"tcp://127.0.0.1:{port}", "remote")
        assert h.health()["engine"] == "hf"
        prompts = [PromptInput(tok("12+34=", add_special_tokens=False)["input_ids"])]
        sp = SamplingParams(n=3, max_tokens=4, seed=1)
        local = HFEngine(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32), tok).generate(prompts, sp)
        assert [c.token_ids for c in RolloutPool([h]).generate(prompts, sp)[0]] == [c.token_ids for c in local[0]]
        h.update_weights(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).named_parameters(), version=3)
        assert h.health()["version"] == 3  # weights travel inline (no shared file) to a worker reached by URL
        h.close()
        assert proc.wait(timeout=30) == 0  # close() ends a hand-started worker too
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
