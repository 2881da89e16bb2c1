"""The trainer end to end on the shipped tiny model: run directory, resume, options that change the loop."""

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
from safetensors.torch import load_file

from backend.rundir import RunDir, create_run, read_jsonl
from backend.spec import load_spec
from backend.train import checkpoint
from backend.train.loop import GRPOTrainer

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets/tiny-cpu.yaml"
# the preset as a quick config, with the dense reward and constant learning rate these tests were calibrated with
FAST = ["algorithm.prompts_per_step=4", "rollout.num_generations=4", "output.eval_steps=0", "output.save_steps=0",
        "rewards.functions=[{name: exact_match}, {name: digit_match}]", "algorithm.lr_scheduler=constant",
        "algorithm.learning_rate=1e-4"]


def make_run(tmp_path: Path, *overrides: str) -> tuple[RunDir, object]:
    spec = load_spec(TINY, [f"output.runs_dir={tmp_path / 'runs'}", *FAST, *overrides])
    return create_run(spec, ROOT), spec


def train(tmp_path: Path, *overrides: str, stop_at: int | None = None) -> tuple[RunDir, GRPOTrainer]:
    run, spec = make_run(tmp_path, *overrides)
    t = GRPOTrainer(spec, run, ROOT).setup()
    t.stop_at_step = stop_at
    t.train()
    return run, t


def metrics(run: RunDir) -> list[dict]:
    return read_jsonl(run.metrics_path)[0]


REQUIRED = ["reward", "reward_std", "rewards/exact_match/mean", "rewards/exact_match/std", "rewards/digit_match/mean",
            "frac_reward_zero_std", "completions/mean_length", "completions/min_length", "completions/max_length",
            "completions/clipped_ratio", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
            "clip_ratio/region_mean", "loss", "grad_norm", "learning_rate", "timing/rollout_s", "timing/reward_s",
            "timing/train_s", "timing/forward_backward_s", "timing/optimizer_s", "timing/weight_sync_s", "timing/step_s",
            "throughput/completion_tokens_per_s", "completions/tokens",
            "staleness", "system/ram_gb", "system/cpu_percent"]


def test_run_directory_contents(tmp_path: Path) -> None:
    run, _ = train(tmp_path, "algorithm.max_steps=4", "output.report_to=[tensorboard]", "algorithm.beta=0.02",
                   "output.eval_steps=2", "output.log_samples_steps=2")
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in [*REQUIRED, "kl"]:
        assert all(key in r for r in rows), key
    assert "eval/rewards/exact_match/mean" in rows[1] and "eval/reward" not in rows[0]
    samples = read_jsonl(run.samples_path)[0]
    step1 = [s for s in samples if s["step"] == 1]
    assert rows[0]["completions/tokens"] == sum(s["length"] for s in step1)
    assert {s["step"] for s in samples} == {1, 3}  # every 2nd step, all 16 completions of it
    assert len(samples) == 32
    s = samples[0]
    assert set(s) >= {"step", "group", "prompt", "completion", "rewards", "reward", "advantage", "length", "truncated"}
    assert s["reward"] == pytest.approx(sum(v for v in s["rewards"].values() if v is not None))
    st = run.read_status()
    assert st["state"] == "finished" and st["step"] == 4 and st["total_steps"] == 4
    assert (run.checkpoints_dir / "step-4" / "COMPLETE").exists()
    assert list((run.path / "tensorboard").glob("events.out.tfevents.*"))
    assert load_spec(run.spec_path).algorithm.max_steps == 4


def test_group_advantages_in_samples_sum_to_zero(tmp_path: Path) -> None:
    run, _ = train(tmp_path, "algorithm.max_steps=1")
    samples = read_jsonl(run.samples_path)[0]
    for g in {s["group"] for s in samples}:
        adv = [s["advantage"] for s in samples if s["group"] == g]
        assert sum(adv) == pytest.approx(0, abs=1e-4)


@pytest.mark.parametrize("options", [["algorithm.advantage_estimator=rloo", "algorithm.scale_rewards=none"],
                                     ["algorithm.multi_objective_aggregation=normalize_then_sum"]],
                         ids=["rloo", "normalize_then_sum"])
def test_advantage_options_reach_the_samples(tmp_path: Path, options: list[str]) -> None:
    """The logged advantages are the options' formulas on the logged rewards: rloo's leave-one-out baseline, or
    normalize_then_sum's per-reward group normalisation (grpo.decoupled_advantages) over the step's batch."""
    from backend.spec import AlgorithmSection
    from backend.train import grpo

    run, _ = train(tmp_path, "algorithm.max_steps=1", *options)
    samples = read_jsonl(run.samples_path)[0]
    assert len(samples) == 16
    names = list(samples[0]["rewards"])
    per_fn = torch.tensor([[float("nan") if s["rewards"][n] is None else s["rewards"][n] for n in names]
                           for s in samples], dtype=torch.float64)
    a = AlgorithmSection(**dict(o.removeprefix("algorithm.").split("=") for o in options))
    want = grpo.advantages(a, per_fn, torch.ones(len(names), dtype=torch.float64), 4).advantages
    assert [s["advantage"] for s in samples] == pytest.approx(want.tolist(), rel=1e-4, abs=1e-5)
    if a.advantage_estimator == "rloo":
        for g in range(4):
            r = [s["reward"] for s in samples[4 * g:4 * g + 4]]
            assert [s["advantage"] for s in samples[4 * g:4 * g + 4]] == pytest.approx(
                [r[i] - (sum(r) - r[i]) / 3 for i in range(4)], abs=1e-5)


def test_kl_in_reward_is_charged_to_the_rewards_not_the_loss(tmp_path: Path) -> None:
    """algorithm.kl_in_reward: each logged advantage is grpo.advantages of the logged rewards less beta x the logged
    summed KL of the sampling policy to the reference (nonzero once the policy has moved), and the loss has no KL
    term: on-policy, with ratio 1, the grpo loss is minus the mean advantage, 0 for group-centred advantages (with
    the KL in the loss it would be beta x the k3 KL)."""
    from backend.spec import AlgorithmSection
    from backend.train import grpo

    beta = 2.0
    run, _ = train(tmp_path, "algorithm.max_steps=3", f"algorithm.beta={beta}", "algorithm.kl_in_reward=true",
                   "algorithm.learning_rate=2e-3")
    rows, samples = metrics(run), read_jsonl(run.samples_path)[0]
    assert all("kl" in r and "kl_in_reward/reward" in r for r in rows)
    assert abs(rows[0]["kl"]) < 1e-4 < abs(rows[-1]["kl"])  # the reference is the first policy
    assert all(abs(r["loss"]) < 1e-6 for r in rows)
    last = [s for s in samples if s["step"] == 3]
    names = list(last[0]["rewards"])
    per_fn = torch.tensor([[float("nan") if s["rewards"][n] is None else s["rewards"][n] for n in names]
                           for s in last], dtype=torch.float64)
    kl = torch.tensor([s["kl"] for s in last], dtype=torch.float64)
    a, ones = AlgorithmSection(beta=beta, kl_in_reward=True), torch.ones(len(names), dtype=torch.float64)
    charged = grpo.advantages(a, per_fn, ones, 4, kl).advantages.tolist()
    assert [s["advantage"] for s in last] == pytest.approx(charged, rel=1e-4, abs=1e-5)
    assert charged != pytest.approx(grpo.advantages(a, per_fn, ones, 4).advantages.tolist(), rel=1e-4, abs=1e-5)
    assert rows[-1]["kl_in_reward/reward"] == pytest.approx(
        sum(s["reward"] for s in last) / len(last) - beta * float(kl.mean()), abs=1e-5)


def test_advantage_calibration_gives_failed_groups_negative_advantages(tmp_path: Path) -> None:
    """algorithm.advantage_calibration: in the logged samples, a group with no solved completion has every
    advantage negative and equal (plain GRPO: all zero), a group all solved has zero, and no group sums to zero
    unless it is all solved."""
    run, _ = train(tmp_path, "algorithm.max_steps=2", "algorithm.advantage_calibration=true",
                   "algorithm.solved_reward=1.0", "rewards.functions=[{name: exact_match}]",
                   "algorithm.prompts_per_step=8")
    samples = read_jsonl(run.samples_path)[0]
    groups = {(s["step"], s["group"]) for s in samples}
    failed = 0
    for key in groups:
        rows = [s for s in samples if (s["step"], s["group"]) == key]
        adv, rew = [s["advantage"] for s in rows], [s["reward"] for s in rows]
        if max(rew) < 1.0 and min(rew) == max(rew):
            failed += 1
            assert max(adv) < 0 and max(adv) == pytest.approx(min(adv))
        elif min(rew) >= 1.0:
            assert adv == [0.0] * len(adv)
        else:
            assert sum(adv) < 0
    assert failed  # the tiny model fails some groups outright at the start


def _final_weights(run: RunDir) -> dict[str, torch.Tensor]:
    ckpt = run.latest_checkpoint()
    return load_file(next((ckpt / "model").glob("*.safetensors")))


@pytest.mark.parametrize("extra", [
    ["algorithm.num_iterations=2", "algorithm.beta=0.04", "algorithm.lr_scheduler=cosine", "algorithm.warmup_steps=2"],
    ["model.finetune=lora", "model.lora_rank=4", "algorithm.beta=0.04", "algorithm.learning_rate=1e-3"],
    ["rollout.async_generation=true"],
    ["algorithm.num_iterations=2", "algorithm.beta=0.5", "algorithm.kl_in_reward=true",
     "algorithm.advantage_estimator=rloo", "algorithm.scale_rewards=none", "algorithm.learning_rate=1e-3"],
], ids=["full-mu2-kl-cosine", "lora-kl", "async", "mu2-kl-in-reward-rloo"])
def test_exact_resume_matches_a_straight_run(tmp_path: Path, extra: list[str]) -> None:
    straight, _ = train(tmp_path / "a", "algorithm.max_steps=7", *extra)
    # stop after step 3: with mu=2 that is mid-rollout, so the pending batch must come back too
    part, _ = train(tmp_path / "b", "algorithm.max_steps=7", *extra, stop_at=3)
    assert part.read_status()["state"] == "stopped"
    spec = load_spec(part.spec_path)
    resumed = GRPOTrainer(spec, part, ROOT, resume=True).setup()
    assert resumed.step == 3
    resumed.train()
    a, b = _final_weights(straight), _final_weights(part)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    ra, rb = metrics(straight), metrics(part)
    assert [r["step"] for r in rb] == list(range(1, 8))
    assert [r["reward"] for r in ra] == pytest.approx([r["reward"] for r in rb], abs=1e-6)


def test_skipping_solved_prompts_skips_and_resumes_exactly(tmp_path: Path) -> None:
    """algorithm.skip_solved_prompts on 8 rows (an epoch every 2 steps): solved prompts are passed over (counted
    in sampler/skipped_solved) and a stopped run resumes to the straight run's weights, solved set included."""
    extra = ["algorithm.max_steps=8", "data.limit=8", "algorithm.skip_solved_prompts=0.9", "algorithm.solved_reward=1.0"]
    straight, _ = train(tmp_path / "a", *extra)
    skipped = [r["sampler/skipped_solved"] for r in metrics(straight)]
    assert sum(skipped) > 0
    part, _ = train(tmp_path / "b", *extra, stop_at=4)
    resumed = GRPOTrainer(load_spec(part.spec_path), part, ROOT, resume=True).setup()
    assert resumed.rollouts.sampler.solved  # the solved set came back with the checkpoint
    resumed.train()
    a, b = _final_weights(straight), _final_weights(part)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    assert [r["sampler/skipped_solved"] for r in metrics(part)] == skipped


def test_replaying_solved_completions_replays_and_resumes_exactly(tmp_path: Path) -> None:
    """algorithm.replay_solved on 8 rows at temperature 1.5 (prompts fail again after being solved): replayed
    completions carry the solved reward and the group's top advantage, are counted in replay/replayed and marked
    in samples.jsonl, and a stopped run resumes to the straight run's weights, the replay store included."""
    extra = ["algorithm.max_steps=8", "data.limit=8", "algorithm.replay_solved=true", "rollout.temperature=1.5",
             "rewards.functions=[{name: exact_match}]"]
    straight, _ = train(tmp_path / "a", *extra)
    replayed = [r["replay/replayed"] for r in metrics(straight)]
    assert sum(replayed) > 0
    samples = read_jsonl(straight.samples_path)[0]
    marked = [s for s in samples if s.get("replayed")]
    assert len(marked) == sum(replayed)
    for s in marked:
        group = [o for o in samples if o["step"] == s["step"] and o["group"] == s["group"]]
        assert s["reward"] == 1.0 and s["advantage"] > 0
        assert all(o["reward"] == 0.0 and o["advantage"] < 0 for o in group if o is not s)
    part, _ = train(tmp_path / "b", *extra, stop_at=4)
    resumed = GRPOTrainer(load_spec(part.spec_path), part, ROOT, resume=True).setup()
    assert resumed.rollouts.replay.store  # the store came back with the checkpoint
    resumed.train()
    a, b = _final_weights(straight), _final_weights(part)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    assert [r["replay/replayed"] for r in metrics(part)] == replayed


def test_kill_9_then_resume_has_each_step_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "backend.train", "--config", str(TINY), "--set", f"output.runs_dir={runs}",
           *sum((["--set", o] for o in FAST), []), "--set", "algorithm.max_steps=30", "--set", "output.save_steps=4"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    run = RunDir(proc.stdout.readline().strip())
    deadline = time.time() + 120
    while time.time() < deadline:
        steps = [r["step"] for r in read_jsonl(run.metrics_path)[0]]
        if len(steps) >= 10:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = max(r["step"] for r in read_jsonl(run.metrics_path)[0])
    assert 10 <= killed_at < 30
    assert run.state() == "failed"  # status says running, but the process is gone
    last = run.latest_checkpoint()
    assert last is not None and int(last.name.split("-")[1]) <= killed_at
    r = subprocess.run([sys.executable, "-m", "backend.train", "--resume", str(run.path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    steps = [row["step"] for row in read_jsonl(run.metrics_path)[0]]
    assert steps == list(range(1, 31))
    assert run.read_status()["state"] == "finished"
    assert json.loads(run.status_path.read_text())["step"] == 30


def test_sigterm_stops_gracefully_with_a_checkpoint(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "backend.train", "--config", str(TINY), "--set", f"output.runs_dir={runs}",
           *sum((["--set", o] for o in FAST), []), "--set", "algorithm.max_steps=500"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = RunDir(proc.stdout.readline().strip())
    deadline = time.time() + 120
    while time.time() < deadline and len(read_jsonl(run.metrics_path)[0]) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    st = run.read_status()
    assert st["state"] == "stopped"
    assert run.latest_checkpoint().name == f"step-{st['step']}"
    assert "train.log" and "stopped at step" in run.log_path.read_text()


def test_async_generation_is_one_step_stale(tmp_path: Path) -> None:
    run, _ = train(tmp_path, "algorithm.max_steps=5", "rollout.async_generation=true")
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0]["staleness"] == 0
    assert all(r["staleness"] == 1 for r in rows[1:])
    # ratios to the sampling policy are not identically 1 any more: the clip can act
    assert all(r["loss"] == r["loss"] for r in rows)


def test_dynamic_sampling_keeps_the_batch_full(tmp_path: Path) -> None:
    run, _ = train(tmp_path, "algorithm.max_steps=3", "algorithm.dynamic_sampling=true")
    rows = metrics(run)
    assert all("dynamic_sampling/dropped_groups" in r for r in rows)
    samples = read_jsonl(run.samples_path)[0]
    assert len([s for s in samples if s["step"] == 1]) == 16


def test_mask_truncated_completions_removes_them_from_the_loss(tmp_path: Path) -> None:
    # max 1 new token: every completion is truncated, so nothing is left to learn from
    run, _ = train(tmp_path, "algorithm.max_steps=2", "rollout.max_completion_length=1",
                   "algorithm.mask_truncated_completions=true")
    rows = metrics(run)
    assert all(r["completions/clipped_ratio"] == 1.0 for r in rows)
    assert all(r["grad_norm"] == 0.0 and r["loss"] == 0.0 for r in rows)


def test_failed_run_records_the_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "solution": "2"}\n')
    run, spec = make_run(tmp_path, f"data.sources=[{bad}]")
    bad.write_text("this is not json\n")  # broken after validation, as a file edited mid-launch would be
    r = subprocess.run([sys.executable, "-m", "backend.train", "--run-dir", str(run.path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    st = run.read_status()
    assert st["state"] == "failed" and "cannot read" in st["error"]


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_gradient_checkpointing_trains(tmp_path: Path, finetune: str) -> None:
    run, t = train(tmp_path, "algorithm.max_steps=2", "model.gradient_checkpointing=true", f"model.finetune={finetune}")
    rows = metrics(run)
    assert len(rows) == 2 and all(r["grad_norm"] > 0 for r in rows)


def test_bf16_full_finetune_keeps_fp32_master_weights(tmp_path: Path) -> None:
    import safetensors.torch

    run, t = train(tmp_path, "algorithm.max_steps=2", "model.dtype=bfloat16", "algorithm.learning_rate=1e-6")
    assert all(p.dtype == torch.float32 for p in t.policy.parameters())
    base = safetensors.torch.load_file(ROOT / "assets/tiny-add/model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    changed = (t.policy.state_dict()[name] != base[name]).float().mean().item()
    assert changed > 0.9  # a 1e-6 Adam step moves (almost) every fp32 weight; bf16 weights would mostly not move


def test_launcher_stop_then_resume_completes(tmp_path: Path) -> None:
    from backend import launcher

    spec = load_spec(TINY, [f"output.runs_dir={tmp_path / 'runs'}", *FAST, "algorithm.max_steps=400"])
    run = launcher.launch(spec, ROOT)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_jsonl(run.metrics_path)[0]) < 3:
        time.sleep(0.1)
    assert launcher.stop(run) == "stopping"
    while time.time() < deadline and run.read_status().get("state") != "stopped":
        time.sleep(0.1)
    stopped_at = run.read_status()["step"]
    assert run.latest_checkpoint().name == f"step-{stopped_at}"
    launcher.resume(run, ROOT)
    while time.time() < deadline + 60 and len(read_jsonl(run.metrics_path)[0]) < stopped_at + 2:
        time.sleep(0.1)
    assert run.state() == "running", run.log_tail()
    launcher.stop(run, force=True)
    steps = [r["step"] for r in read_jsonl(run.metrics_path)[0]]
    assert steps == list(range(1, len(steps) + 1))  # continued from the checkpoint, no gap or repeat


def test_trainer_state_is_safe_to_load_and_old_pickles_are_refused(tmp_path: Path) -> None:
    run, _ = train(tmp_path, "algorithm.max_steps=2", "algorithm.num_iterations=2", "rollout.async_generation=true")
    state_path = run.checkpoints()[-1] / "trainer_state.pt"
    raw = torch.load(state_path, weights_only=True)  # tensors and plain data only: no code can run
    assert raw["format"] == 2 and raw["step"] == 2
    # a checkpoint of the first version pickled whole objects: resuming it must refuse, not execute
    torch.save({"step": 2, "pending": object.__new__(torch.nn.Identity)}, state_path)
    checkpoint.write_manifest(state_path.parent)  # a crafted copy comes with a manifest that matches
    run.write_status(state="stopped")
    proc = subprocess.run([sys.executable, "-m", "backend.train", "--resume", str(run.path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    status = run.read_status()
    assert status["state"] == "failed" and "pickled objects" in status["error"] and "refused" in status["error"]


def test_logprob_chunk_tokens_reaches_the_pass_and_changes_no_number(tmp_path: Path) -> None:
    """algorithm.logprob_chunk_tokens slices the LM head (3 tokens a slice here, one slice by default at the tiny
    vocabulary): the same run to float rounding."""
    whole, t0 = train(tmp_path / "a", "algorithm.max_steps=2")
    sliced, t1 = train(tmp_path / "b", "algorithm.max_steps=2", "algorithm.logprob_chunk_tokens=3")
    assert (t0.logps.chunk_tokens, t1.logps.chunk_tokens) == (0, 3)
    for a, b in zip(metrics(whole), metrics(sliced), strict=True):
        assert a["reward"] == b["reward"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6) and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_gradient_checkpointing_trains_the_same_run(tmp_path: Path, finetune: str) -> None:
    """model.gradient_checkpointing on the lean pass (full) and the transformers forward (LoRA): the same rewards,
    loss and gradient norm as without, to float rounding."""
    extra = ["algorithm.max_steps=2", f"model.finetune={finetune}"]
    plain, _ = train(tmp_path / "a", *extra)
    ckpt, _ = train(tmp_path / "b", *extra, "model.gradient_checkpointing=true")
    for a, b in zip(metrics(plain), metrics(ckpt), strict=True):
        assert a["reward"] == b["reward"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6) and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
