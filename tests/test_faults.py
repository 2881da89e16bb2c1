"""Fault injection (issue 28, items 5-9): non-finite values, hostile run-directory files, corrupt checkpoints, a
full disk, and the processes a run leaves behind. Each test failed before its fix, but for the normal finish
of test_a_plugin_subprocess_ends_with_the_trainer, which procs.kill_group already passed (kept beside kill -9)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from backend.rundir import RunDir, read_jsonl
from backend.spec import load_spec
from backend.train import checkpoint, guard
from backend.train.loop import GRPOTrainer
from tests.procs import gone
from tests.test_trainer import FAST, ROOT, TINY, make_run, train

PLUGIN = ROOT / "tests/plugins/nonfinite_rewards.py"
CHILDREN = ROOT / "tests/plugins/child_rewards.py"


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


def test_rank_files_that_are_not_objects_are_skipped(tmp_path: Path) -> None:
    from backend.train.supervise import failure_summary, read_rank_files

    run = RunDir(tmp_path)
    (tmp_path / "ranks").mkdir()
    for i, content in enumerate([b"null", b"[1]", b"\xff", b'{"rank": "0"}', b'{"rank": 1, "error": "E"}']):
        (tmp_path / "ranks" / f"rank-{i}.json").write_bytes(content)
    ranks = read_rank_files(run)
    assert [r["rank"] for r in ranks] == [1]
    assert failure_summary(ranks, {}) == "rank 1: E"


@pytest.mark.parametrize(("results", "samples", "why"), [
    (b"null", b"", "results.json holds a JSON NoneType"),
    (b'{"metrics": 3}', b"", "metrics that are not an object"),
    (b"{}", b'42\n{"prompt": "1+1=", "completion": "2", "reward": 1.0}\n', "sample 1 has no valid index"),
    (b"{}", b'{"index": 0, "prompt": "1+1=", "completion": "2", "reward": "high"}\n', "no valid reward"),
])
def test_a_broken_evaluation_is_named_not_a_crash(tmp_path: Path, results: bytes, samples: bytes, why: str) -> None:
    from backend.eval.compare import CompareError, load_eval

    (tmp_path / "results.json").write_bytes(results)
    (tmp_path / "samples.jsonl").write_bytes(samples)
    with pytest.raises(CompareError, match=why):
        load_eval(tmp_path)


# ----------------------------------------------------------------------------- 7: corrupt checkpoints


@pytest.mark.parametrize("victim", ["model/model.safetensors", "trainer_state.pt"])
def test_resume_skips_a_truncated_latest_checkpoint(tmp_path: Path, victim: str) -> None:
    run, _ = train(tmp_path, "algorithm.max_steps=4", "output.save_steps=2", stop_at=4)
    manifest = json.loads((run.checkpoints_dir / "step-4" / checkpoint.MANIFEST).read_text())["files"]
    assert victim in manifest and manifest[victim]["size"] > 0
    path = run.checkpoints_dir / "step-4" / victim
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    partial = run.checkpoints_dir / ".step-6.tmp"  # what a save killed midway leaves
    (partial / "model").mkdir(parents=True)
    spec = load_spec(run.spec_path)
    spec = spec.model_copy(update={"algorithm": spec.algorithm.model_copy(update={"max_steps": 5})})
    t = GRPOTrainer(spec, run, ROOT, resume=True).setup()
    assert t.step == 2 and not partial.exists()
    assert len(t.notes) == 1 and "step-4" in t.notes[0] and victim in t.notes[0] and "truncated" in t.notes[0]
    assert t.train() == "finished"
    assert [r["step"] for r in read_jsonl(run.metrics_path)[0]] == [1, 2, 3, 4, 5]
    assert any("step-4 skipped" in w for w in run.read_status()["warnings"])


def test_resume_with_no_checkpoint_that_verifies_says_why(tmp_path: Path) -> None:
    run, _ = train(tmp_path, "algorithm.max_steps=2", "output.save_steps=1")
    for ckpt in run.checkpoints():
        (ckpt / "trainer_state.pt").write_bytes(b"")
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint to resume from verifies: checkpoint step-2"):
        checkpoint.resume_point(run.checkpoints())


def test_the_manifest_lists_every_file(tmp_path: Path) -> None:
    run, _ = train(tmp_path, "algorithm.max_steps=1")
    ckpt = run.checkpoints()[-1]
    files = json.loads((ckpt / checkpoint.MANIFEST).read_text())["files"]
    on_disk = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    assert set(files) == on_disk - {checkpoint.MANIFEST, "COMPLETE"}
    shutil.rmtree(ckpt / "model")
    assert "missing" in checkpoint.verify(ckpt)
    for files in ([], {"../../spec.yaml": {"size": 1, "sha256": "0"}}, {"trainer_state.pt": 3}):
        (ckpt / checkpoint.MANIFEST).write_text(json.dumps({"files": files}))
        assert "not one this version writes" in checkpoint.verify(ckpt)


# ----------------------------------------------------------------------------- 8: a full disk


def _assert_failed_on_a_full_disk(run: RunDir, kept: str, lost: str) -> None:
    st = run.read_status()
    assert st["state"] == "failed", st
    assert "no space left on device" in st["error"] and str(run.checkpoints_dir) in st["error"]
    assert [p.name for p in run.checkpoints()] == [kept]
    assert checkpoint.verify(run.checkpoints_dir / kept) == ""
    assert not (run.checkpoints_dir / f".{lost}.tmp").exists()


def test_a_full_disk_at_a_save_fails_clearly_and_keeps_the_last_checkpoint(tmp_path: Path, monkeypatch) -> None:
    from backend.train import cli

    real = checkpoint.save_trainer_state

    def fills_the_disk(path: Path, **kw) -> None:
        if kw["step"] == 4:
            path.write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, **kw)

    monkeypatch.setattr(checkpoint, "save_trainer_state", fills_the_disk)
    run, _ = make_run(tmp_path, "algorithm.max_steps=6", "output.save_steps=2")
    assert cli.main(["--run-dir", str(run.path)]) == 1
    _assert_failed_on_a_full_disk(run, "step-2", "step-4")


def test_a_status_write_on_a_full_disk_leaves_no_temp_file(tmp_path: Path, monkeypatch) -> None:
    real = Path.write_text

    def fills_the_disk(self: Path, text: str, *args, **kwargs) -> int:
        real(self, text[:3])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", fills_the_disk)
    with pytest.raises(OSError, match="No space left on device: '.*status.json'"):
        RunDir(tmp_path).write_status(state="running")
    assert list(tmp_path.iterdir()) == []


def test_a_resume_on_a_full_disk_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    from backend.train import cli

    run, _ = train(tmp_path, "algorithm.max_steps=1")
    run.log_path.write_text("")  # the log exists, so no tee is opened into it

    def full(self: RunDir, **fields) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(RunDir, "write_status", full)
    monkeypatch.setattr(sys, "stdout", open(run.log_path, "a"))  # noqa: SIM115 - as the launcher's resume
    assert cli.main(["--resume", str(run.path)]) == 1
    sys.stdout.close()
    assert f"No space left on device in {run.path}" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_tmpfs_at_a_save(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    # one 31 MB checkpoint of the tiny model fits, a second does not
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], check=True)
    try:
        r = subprocess.run([sys.executable, "-m", "backend.train", "--config", str(TINY),
                            "--set", f"output.runs_dir={disk}", *sum((["--set", o] for o in FAST), []),
                            "--set", "algorithm.max_steps=6", "--set", "output.save_steps=2"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
        run = RunDir(r.stdout.splitlines()[0])
        _assert_failed_on_a_full_disk(run, "step-2", "step-4")
        assert "no space left on device" in run.log_path.read_text()
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# ----------------------------------------------------------------------------- 9: processes


def test_a_child_watching_its_parent_takes_its_group_along() -> None:
    # parent -> watcher (its own group, as spawn_group makes it) -> grandchild; kill -9 of the parent must
    # end the grandchild too, as it ends a plugin's subprocess when the trainer is killed
    watcher = ("import subprocess, sys, time\nfrom backend.procs import watch_parent\n"
               "watch_parent(int(sys.argv[1]))\n"
               "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
               "print(p.pid, flush=True)\ntime.sleep(60)\n")
    parent = ("import os, sys, time\nfrom backend.procs import spawn_group\n"
              f"w = spawn_group([sys.executable, '-c', {watcher!r}, str(os.getpid())], stdout=None)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=ROOT, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert gone(grandchild), "the watcher's child outlived the watcher"


@pytest.mark.parametrize("end", ["finish", "kill -9"])
def test_a_plugin_subprocess_ends_with_the_trainer(tmp_path: Path, end: str) -> None:
    pid_file = tmp_path / "child.pid"
    cmd = [sys.executable, "-m", "backend.train", "--config", str(TINY), "--set", f"output.runs_dir={tmp_path}",
           *sum((["--set", o] for o in FAST), []), "--set", f"algorithm.max_steps={2 if end == 'finish' else 500}",
           "--set", f"rewards.plugins=[{CHILDREN}]",
           "--set", "rewards.functions=[{name: exact_match}, {name: spawning, weight: 0}]"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "CHILD_PID_FILE": str(pid_file)})
    deadline = time.time() + 120
    while not pid_file.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    time.sleep(0.2)  # the pid is written before the file is closed
    child = int(pid_file.read_text())
    if end == "kill -9":
        os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=120) == (0 if end == "finish" else -signal.SIGKILL)
    assert gone(child), f"the plugin's subprocess outlived the trainer ({end})"


def test_test_rewards_does_not_wait_on_a_detached_grandchild(tmp_path: Path) -> None:
    from app.reward_test import score_rewards

    pid_file = tmp_path / "child.pid"
    spec = load_spec(TINY, [f"rewards.plugins=[{CHILDREN}]", "rewards.functions=[{name: detaching}]"])
    os.environ["CHILD_PID_FILE"] = str(pid_file)
    try:
        t0 = time.time()
        out = score_rewards(spec, ROOT, rows=2, timeout_s=40)
        took = time.time() - t0
    finally:
        del os.environ["CHILD_PID_FILE"]
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # it left the group: ours to end
    assert "error" not in out, out
    assert out["functions"][0]["scored"] == 2
    assert took < 30, f"waited {took:.0f}s for a pipe a detached grandchild held"


def test_weight_files_of_a_killed_trainer_are_removed_at_the_next_start(tmp_path: Path) -> None:
    import fcntl

    from backend.rollout.weight_sync import SharedWeights

    old = time.time() - 3600

    def weight_file(name: str, age: float = old) -> Path:
        p = tmp_path / name
        p.write_bytes(b"\0" * 64)
        os.utime(p, (age, age))
        return p

    orphan = weight_file("grpo-weights-4242-abc123.bin")  # its trainer got kill -9: nobody holds its lock
    live = weight_file("grpo-weights-4343-def456.bin")
    young = weight_file("grpo-weights-4444-ghi789.bin", time.time())  # its owner may not have locked it yet
    older_version = weight_file("grpo-weights-jkl012.bin")  # an older version's: it never locks
    with live.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as its living owner does
        sw = SharedWeights.create([("w", torch.zeros(4))], directory=str(tmp_path))
        try:
            assert not orphan.exists() and live.exists() and young.exists() and older_version.exists()
            assert Path(sw.path).name.startswith(f"grpo-weights-{os.getpid()}-")
            with open(sw.path, "rb") as f, pytest.raises(BlockingIOError):
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while the trainer lives
        finally:
            sw.close()
    assert not Path(sw.path).exists()


def test_kill_9_of_a_trainer_with_rollout_workers_leaves_its_weight_file_to_the_next_start(tmp_path: Path) -> None:
    from backend.rollout.weight_sync import remove_orphaned_files

    run, _ = make_run(tmp_path, "algorithm.max_steps=100000", "rollout.placement=separate")
    proc = subprocess.Popen([sys.executable, "-m", "backend.train", "--run-dir", str(run.path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        shm = Path("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())
        deadline = time.time() + 180
        while not (files := list(shm.glob(f"grpo-weights-{proc.pid}-*.bin"))):
            assert proc.poll() is None and time.time() < deadline, "the run made no weight file"
            time.sleep(0.2)
        for f in files:
            os.utime(f, (time.time() - 3600,) * 2)  # past the freshness window
        remove_orphaned_files(str(shm))
        assert all(f.exists() for f in files)  # its trainer lives and holds the lock
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        remove_orphaned_files(str(shm))  # what the next trainer start does
        assert not any(f.exists() for f in files)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_studio_resume_writes_each_log_line_once(tmp_path: Path) -> None:
    run, _ = train(tmp_path, "algorithm.max_steps=3", stop_at=1)
    run.log_path.write_text("")
    shm = Path("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())
    orphan = shm / f"grpo-weights-{os.getpid()}-faultstest.bin"  # as a trainer killed by -9 leaves it
    orphan.write_bytes(b"\0" * 64)
    os.utime(orphan, (time.time() - 3600,) * 2)
    with run.log_path.open("ab") as log:  # as the launcher starts it: stdout is train.log already
        r = subprocess.run([sys.executable, "-m", "backend.train", "--resume", str(run.path)], cwd=ROOT,
                           stdout=log, stderr=subprocess.STDOUT, timeout=300)
    text = run.log_path.read_text()
    assert r.returncode == 0, text[-3000:]
    assert text.count("training 3 steps") == 1 and text.count("finished 3 steps") == 1, text[-3000:]
    assert not orphan.exists()  # removed at the next start


def test_a_studio_resume_on_a_full_disk_says_so_in_the_page(tmp_path: Path, monkeypatch) -> None:
    """launcher.resume (the studio's Resume) on a full disk: the message reaches the page, not train.log on that
    disk, and nothing is spawned."""
    from backend import launcher

    run, _ = train(tmp_path, "algorithm.max_steps=1")
    run.write_status(state="stopped")
    spawned: list[list[str]] = []
    monkeypatch.setattr(launcher, "_spawn", lambda args, *a: spawned.append(args))

    def full(self: RunDir, **fields) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(RunDir, "write_status", full)
    with pytest.raises(RuntimeError, match=f"cannot resume: no space left on device in {run.path}"):
        launcher.resume(run, ROOT)
    assert spawned == []
