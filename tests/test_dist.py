"""Training ranks on CPU: torchrun with gloo, DeepSpeed ZeRO-2/3, the run directory written once,
resuming under another rank count, stop and a dead rank. The same global batch and seed under 1 and
2 ranks must give the same losses and weights (rank 0 samples the same rollouts; gradients are summed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from backend import launcher
from backend.checks import check_spec
from backend.rundir import RunDir, create_run, process_alive, read_jsonl
from backend.spec import load_spec
from backend.train.batch import Rollout
from backend.train.dist import deepspeed_config, join_rollouts, join_rows, rank_rows, shard_rollout
from backend.train.loop import GRPOTrainer
from backend.train.supervise import failure_summary, free_port, read_rank_files

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets/tiny-cpu.yaml"
FAST = ["algorithm.prompts_per_step=4", "rollout.num_generations=4", "output.eval_steps=0", "output.save_steps=2",
        "algorithm.max_steps=4", "resources.device=cpu", "algorithm.learning_rate=3e-3",
        # the dense reward and constant lr these tests were calibrated with
        "rewards.functions=[{name: exact_match}, {name: digit_match}]", "algorithm.lr_scheduler=constant"]
TWO = ["resources.nproc_per_node=2"]


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "backend.train", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def run_dir_of(proc: subprocess.CompletedProcess) -> RunDir:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return RunDir(proc.stdout.splitlines()[0].strip())


def losses(run: RunDir) -> list[float]:
    return [r["loss"] for r in read_jsonl(run.metrics_path)[0]]


def weights(run: RunDir, step: int) -> dict[str, torch.Tensor]:
    return load_file(run.checkpoints_dir / f"step-{step}" / "model" / "model.safetensors")


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Same weights up to summation order: the two runs' updates (from the initial weights) differ by < 1 %
    of their size. Adam's first steps move each weight by about lr x sign(gradient), so gradients that are
    ~0 up to float noise flip a few weights by ~lr; one rank with 2 micro-batches differs from 1 as much."""
    assert a.keys() == b.keys()
    init = load_file(ROOT / "assets/tiny-add/model.safetensors")
    diff = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a) ** 0.5
    moved = sum(float(((b[k] - init[k]) ** 2).sum()) for k in b) ** 0.5
    assert moved > 0.1 and diff < 0.01 * moved, (diff, moved)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> RunDir:
    """The reference: the tiny run on one process, 4 steps, checkpoints at 2 and 4."""
    tmp = tmp_path_factory.mktemp("one")
    spec = load_spec(TINY, [f"output.runs_dir={tmp}", *FAST])
    run = create_run(spec, ROOT)
    GRPOTrainer(spec, run, ROOT).setup().train()
    return run


# ----------------------------------------------------------------------------- pure parts


def test_rollout_shards_are_whole_groups_and_join_back() -> None:
    B, G = 8, 4
    ro = Rollout(1, 0, torch.arange(B * 3).view(B, 3), torch.ones(B, 3), torch.arange(B * 2).view(B, 2), torch.ones(B, 2),
                 torch.ones(B, 2), None, torch.arange(B, dtype=torch.float), {"reward": 1.0}, [{"i": i} for i in range(B)],
                 old_logps=torch.randn(B, 2))
    shards = [shard_rollout(ro, r, 2, keep_samples=r == 0) for r in range(2)]
    assert shards[1].advantages.tolist() == [4.0, 5.0, 6.0, 7.0]  # rank 1: the second group, whole
    assert shards[0].samples == ro.samples and shards[1].samples == []
    assert shards[1].metrics == ro.metrics
    joined = join_rollouts(shards)
    for name in ("prompt_ids", "completion_ids", "advantages", "old_logps"):
        assert torch.equal(getattr(joined, name), getattr(ro, name))
    assert len(shards[0].advantages) % G == 0


@pytest.mark.parametrize("slices", [1, 2])
def test_rows_of_the_ranks_join_into_the_whole_batch(slices: int) -> None:
    """join_rows (what Ranks.whole_batch applies to the all-gathered shards: kl_in_reward's KL and rewards) inverts
    rank_rows, with rollout.steps_per_generation slices too."""
    B, world = 16, 2
    whole = torch.arange(B * 3, dtype=torch.float).view(B, 3)
    parts = [whole[rank_rows(B, r, world, slices)] for r in range(world)]
    if slices > 1:  # each rank's shard of each slice: the shards interleave
        assert not torch.equal(torch.cat(parts), whole)
    assert torch.equal(join_rows(parts, slices), whole)
    assert torch.equal(join_rows([whole]), whole)


def test_lora_merged_from_gathered_copies_equals_peft_merge() -> None:
    """ZeRO-3 cannot merge LoRA in place (its parameters are partitioned): the gathered peft state is merged on
    CPU into the base model's names. The result must equal peft's own merge, names and values."""
    from backend.train.builders import build_policy, engine_weights, lora_scalings, merge_lora_state

    spec = load_spec(TINY, ["model.finetune=lora", "model.lora_rank=4", "model.lora_alpha=12"])
    policy = build_policy(spec, ROOT, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # lora_B starts at zero, where any merge is the identity
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    peft_state = {n: p.detach().clone() for n, p in policy.named_parameters()}
    assert set(lora_scalings(policy).values()) == {3.0}  # alpha / r
    mine = merge_lora_state(peft_state, lora_scalings(policy))
    ref = engine_weights(policy, peft_names=False)
    assert mine.keys() == ref.keys() == load_file(ROOT / "assets/tiny-add/model.safetensors").keys() - {"lm_head.weight"}
    for k in ref:
        torch.testing.assert_close(mine[k], ref[k], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(mine[k], peft_state[f"base_model.model.{k}".replace(".weight", ".base_layer.weight")])
               for k in mine if "proj" in k)  # the adapter did move the merged weights
    with pytest.raises(ValueError, match="lora_magnitude"):
        merge_lora_state({**peft_state, "base_model.model.x.lora_magnitude_vector.default.weight": torch.zeros(1)},
                         lora_scalings(policy))


def test_deepspeed_config_from_spec_and_user_override(tmp_path: Path) -> None:
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"zero_optimization": {"reduce_bucket_size": 123}, "train_batch_size": 999}))
    spec = load_spec(TINY, [*FAST, "resources.deepspeed_stage=3", "resources.offload=true",
                            "resources.offload_params=true", f"resources.deepspeed_config={user}", *TWO])
    assert check_spec(spec, ROOT) == []
    cfg = deepspeed_config(spec, micro_batch=8, world=2, on_cuda=False)
    z = cfg["zero_optimization"]
    assert z["stage"] == 3 and z["offload_optimizer"]["device"] == "cpu" and z["offload_param"]["device"] == "cpu"
    assert z["reduce_bucket_size"] == 123  # the user's key, merged into the section
    assert cfg["train_batch_size"] == 16 and cfg["gradient_clipping"] == spec.algorithm.max_grad_norm  # the spec's


def test_rank_rules_name_their_field() -> None:
    def fields(*o: str) -> set[str]:
        return {i.field for i in check_spec(load_spec(TINY, [*FAST, *o]), ROOT)}

    assert "algorithm.prompts_per_step" in fields("resources.nproc_per_node=3")
    assert "resources.offload_params" in fields("resources.offload_params=true", "resources.deepspeed_stage=2")
    assert "resources.node_rank" in fields("resources.nnodes=2", "resources.node_rank=2")
    assert "resources.master_port" in fields("resources.nnodes=2", "resources.master_addr=10.0.0.1")
    assert "resources.deepspeed_config" in fields("resources.deepspeed_stage=2", "resources.deepspeed_config=nope.json")
    assert fields("resources.deepspeed_stage=2", *TWO) == set()  # DeepSpeed on cpu is allowed


def test_failure_names_the_rank_that_caused_it() -> None:
    ranks = [{"rank": 0, "error": "DistBackendError: connection closed by peer", "dist_error": True, "error_time": 2.0},
             {"rank": 1, "error": "ValueError: bad reward", "dist_error": False, "error_time": 3.0}]
    assert failure_summary(ranks, {}) == "rank 1: ValueError: bad reward"
    assert failure_summary(ranks[:1], {1: 1.0}).startswith("rank 1 died without an error")


def test_preview_shows_the_torchrun_command() -> None:
    from app.commands import train_command

    spec = load_spec(TINY, [*FAST, *TWO, "resources.deepspeed_stage=2"])
    text = train_command(spec, "tiny-cpu", ROOT / "presets")
    assert "torchrun --nnodes 1 --node_rank 0 --nproc_per_node 2" in text and "ZeRO-2" in text
    assert launcher.training_command(load_spec(TINY))[:3] == ["python", "-m", "backend.train"]


# ----------------------------------------------------------------------------- ranks for real


@pytest.mark.slow
def test_two_ranks_on_two_nodes_match_one_rank_and_write_once(one_rank: RunDir, tmp_path: Path) -> None:
    """Two nodes of one gloo rank each (both on this machine): node 0 starts the run, node 1 joins it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    sets = sum((["--set", o] for o in [f"output.runs_dir={tmp_path}", *FAST, "resources.nnodes=2",
                                       "resources.nproc_per_node=1", "resources.master_addr=127.0.0.2",
                                       f"resources.master_port={free_port()}"]), [])
    node0 = subprocess.Popen([sys.executable, "-m", "backend.train", "--config", str(TINY), *sets], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert node0.stdout is not None
    run = RunDir(node0.stdout.readline().strip())
    node1 = cli("--join", str(run.path), "--node-rank", "1")
    out0, _ = node0.communicate(timeout=240)
    assert node0.returncode == 0 and node1.returncode == 0, out0[-3000:] + node1.stdout[-2000:] + node1.stderr[-2000:]
    assert run.read_status()["state"] == "finished"
    rows = read_jsonl(run.metrics_path)[0]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # one line per step, not one per rank
    ref = read_jsonl(one_rank.metrics_path)[0]
    # rank 0 sampled the same rollouts while the weights agree to rounding; all-reduce order moves them ~1e-4
    # relative within a few steps, enough for a sampled token to flip in a later batch (seen at step 4)
    assert [r["reward"] for r in rows][:3] == [r["reward"] for r in ref][:3]
    assert losses(run) == pytest.approx(losses(one_rank), abs=1e-6)
    assert [r["grad_norm"] for r in rows][:3] == pytest.approx([r["grad_norm"] for r in ref][:3], rel=1e-3)
    assert len(read_jsonl(run.samples_path)[0]) == 4 * 16  # every completion once
    assert_same_weights(weights(run, 4), weights(one_rank, 4))
    assert sorted(r["rank"] for r in read_rank_files(run)) == [0, 1]
    assert all(r["exited"] and not r["error"] for r in read_rank_files(run))


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_two_ranks_resume_one_rank_checkpoint_and_match(one_rank: RunDir, tmp_path: Path, stage: int) -> None:
    """A 1-rank checkpoint resumed under 2 DeepSpeed ranks: the steps after it, the final weights and the
    optimizer states it saves equal the 1-rank run's (so saving gathers exactly, and loading shards exactly)."""
    pytest.importorskip("deepspeed")
    run = RunDir(tmp_path / "run")
    shutil.copytree(one_rank.path, run.path)
    shutil.rmtree(run.checkpoints_dir / "step-4")
    spec = yaml.safe_load(run.spec_path.read_text())
    spec["resources"].update(nproc_per_node=2, deepspeed_stage=stage)
    run.spec_path.write_text(yaml.safe_dump(spec))
    run.write_status(state="stopped")
    # the copied run's spec names the reference run's runs folder, outside the working directory: allowed by name
    proc = cli("--resume", str(run.path), "--allow-path", str(one_rank.path.parent))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run.read_status()["state"] == "finished"
    assert [r["step"] for r in read_jsonl(run.metrics_path)[0]] == [1, 2, 3, 4]
    assert losses(run) == pytest.approx(losses(one_rank), abs=1e-6)
    norms = [r["grad_norm"] for r in read_jsonl(run.metrics_path)[0]]
    assert norms[2:] == pytest.approx([r["grad_norm"] for r in read_jsonl(one_rank.metrics_path)[0]][2:], rel=1e-3)
    assert_same_weights(weights(run, 4), weights(one_rank, 4))
    mine = torch.load(run.checkpoints_dir / "step-4" / "trainer_state.pt", weights_only=True)["optimizer"]
    ref = torch.load(one_rank.checkpoints_dir / "step-4" / "trainer_state.pt", weights_only=True)["optimizer"]
    assert mine["state"].keys() == ref["state"].keys()
    for i in ref["state"]:
        for key in ("exp_avg", "exp_avg_sq"):
            # atol: a handful of near-zero moments differ by float noise (~3e-7 seen, data-dependent)
            torch.testing.assert_close(mine["state"][i][key], ref["state"][i][key], rtol=1e-3, atol=1e-6)
        assert float(mine["state"][i]["step"]) == float(ref["state"][i]["step"]) == 4


@pytest.mark.slow
def test_lora_under_zero3_pushes_merged_engine_names_to_workers(tmp_path: Path) -> None:
    """LoRA + ZeRO-3 + a rollout worker: the worker gets the merged base weights under the engine's names
    (not peft's), so the run samples as the one-process LoRA run with the in-process engine does."""
    pytest.importorskip("deepspeed")
    lora = ["model.finetune=lora", "model.lora_rank=4", "algorithm.learning_rate=5e-3", "algorithm.max_steps=3",
            "output.save_steps=0"]
    ref_spec = load_spec(TINY, [f"output.runs_dir={tmp_path / 'one'}", *FAST, *lora])
    ref = create_run(ref_spec, ROOT)
    assert GRPOTrainer(ref_spec, ref, ROOT).setup().train() == "finished"
    proc = cli("--config", str(TINY), *sum((["--set", o] for o in [
        f"output.runs_dir={tmp_path / 'z3'}", *FAST, *lora, *TWO, "resources.deepspeed_stage=3",
        "rollout.placement=separate"]), []), timeout=600)
    run = run_dir_of(proc)
    assert run.read_status()["state"] == "finished"
    rows, ref_rows = read_jsonl(run.metrics_path)[0], read_jsonl(ref.metrics_path)[0]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # step 1 samples with the base weights; steps 2-3 with weights the worker received after each update
    assert [r["reward"] for r in rows] == pytest.approx([r["reward"] for r in ref_rows], abs=1e-5)


def _wait(cond, timeout: float = 120.0) -> None:
    end = time.time() + timeout
    while not cond():
        assert time.time() < end, "timed out"
        time.sleep(0.3)


@pytest.mark.slow
def test_stop_stops_every_rank_and_a_dead_rank_fails_the_run(tmp_path: Path) -> None:
    spec = load_spec(TINY, [f"output.runs_dir={tmp_path}", *FAST, *TWO, "algorithm.max_steps=100000",
                            "output.save_steps=0", "output.log_samples_steps=0"])
    run = launcher.launch(spec, ROOT)
    _wait(lambda: run.metrics_path.exists() and len(read_jsonl(run.metrics_path)[0]) >= 1)
    assert launcher.stop(run) == "stopping"
    _wait(lambda: run.read_status().get("state") == "stopped" and not process_alive(run.read_status()["pid"], None))
    ranks = read_rank_files(run)
    assert len(ranks) == 2 and not any(process_alive(r["pid"], r["create_time"]) for r in ranks)
    assert run.latest_checkpoint() is not None  # every rank agreed on the step and checkpointed it

    launcher.resume(run, ROOT)
    _wait(lambda: len(read_rank_files(run)) == 2 and all(r.get("pid") for r in read_rank_files(run))
          and len(read_jsonl(run.metrics_path)[0]) > run.read_status().get("step", 0) - 1
          and run.read_status().get("state") == "running")
    victim = next(r for r in read_rank_files(run) if r["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    _wait(lambda: run.read_status().get("state") == "failed")
    st = run.read_status()
    assert st["error"].startswith("rank 1 died without an error"), st["error"]
    _wait(lambda: not process_alive(st["pid"], st.get("pid_create_time")), 30)
    assert not any(process_alive(r["pid"], r["create_time"]) for r in read_rank_files(run))  # no orphans
