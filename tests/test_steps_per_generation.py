"""rollout.steps_per_generation (one rollout serves N optimizer steps, slice by slice, as TRL) and the reference
sync in the trainer (algorithm.sync_ref_model): the slices, the ranks' shards of them, the sync schedule inside
a run, and exact resume with both on (a stop in the middle of a rollout, after a sync)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from backend.checks import check_spec
from backend.rundir import RunDir, create_run, read_jsonl
from backend.spec import load_spec, spec_from_dict
from backend.train import checkpoint
from backend.train.batch import Rollout, rollout_slice
from backend.train.dist import join_rollouts, rank_rows, shard_rollout
from backend.train.loop import GRPOTrainer
from backend.train.ref_sync import REFERENCE_DIR

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets/tiny-cpu.yaml"
PPS, G, N, MU, ALPHA, EVERY = 4, 4, 2, 2, 0.6, 2
OPTIONS = [f"algorithm.prompts_per_step={PPS}", f"rollout.num_generations={G}", "output.eval_steps=0",
           "output.save_steps=0", "rewards.functions=[{name: exact_match}, {name: digit_match}]",
           "algorithm.lr_scheduler=constant", "algorithm.learning_rate=1e-3", "algorithm.max_steps=6",
           f"rollout.steps_per_generation={N}", f"algorithm.num_iterations={MU}", "algorithm.beta=0.1",
           "algorithm.sync_ref_model=true", f"algorithm.ref_model_mixup_alpha={ALPHA}",
           f"algorithm.ref_model_sync_steps={EVERY}"]


def _rollout(B: int) -> Rollout:
    return Rollout(1, 0, torch.arange(B * 3).view(B, 3), torch.ones(B, 3), torch.arange(B * 2).view(B, 2),
                   torch.ones(B, 2), torch.ones(B, 2), None, torch.arange(B, dtype=torch.float), {"reward": 1.0},
                   [{"i": i} for i in range(B)], old_logps=torch.randn(B, 2), media=[{"row": i} for i in range(B)])


def test_slices_are_disjoint_and_in_trl_order() -> None:
    ro = _rollout(16)
    seen = [rollout_slice(ro, u, 2).advantages.tolist() for u in range(4)]
    assert seen == [list(range(8)), list(range(8, 16))] * 2  # TRL's _buffered_inputs[step % steps_per_generation]
    assert rollout_slice(ro, 1, 2).media == [{"row": i} for i in range(8, 16)]
    assert rollout_slice(ro, 0, 1) is ro


def test_ranks_shard_each_slice() -> None:
    """Two slices over two ranks: at each step, the ranks' shards of that step's slice are the one-rank slice."""
    B = 16
    assert rank_rows(B, 1, 2, 2).tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    ro = _rollout(B)
    shards = [shard_rollout(ro, r, 2, keep_samples=r == 0, slices=2) for r in range(2)]
    for u in range(2):
        together = torch.cat([rollout_slice(s, u, 2).advantages for s in shards])
        assert torch.equal(together, rollout_slice(ro, u, 2).advantages)
    joined = join_rollouts(shards, slices=2)
    for name in ("prompt_ids", "completion_ids", "advantages", "old_logps"):
        assert torch.equal(getattr(joined, name), getattr(ro, name))
    assert joined.media == ro.media and joined.samples == ro.samples


def test_checks_and_derived_sizes() -> None:
    spec = spec_from_dict({"algorithm": {"prompts_per_step": 4, "num_iterations": 3}, "rollout": {"steps_per_generation": 5}})
    assert (spec.prompts_per_rollout, spec.updates_per_rollout, spec.completions_per_step) == (20, 15, 32)
    bad = spec_from_dict({"algorithm": {"prompts_per_step": 3}, "resources": {"nproc_per_node": 2},
                          "rollout": {"steps_per_generation": 2}})
    assert any(i.field == "algorithm.prompts_per_step" for i in check_spec(bad, ROOT))  # each slice splits whole


class Recorder:
    """What a run did, step by step: the rollouts made, the batch each step trained on, and the reference and
    policy after each step."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.rollouts: list[Rollout] = []
        self.batches: list[Rollout] = []
        self.refs: list[dict[str, torch.Tensor]] = []
        self.policies: list[dict[str, torch.Tensor]] = []
        make, step = trainer.queue.make_rollout, trainer.optimizer_step

        def made(index: int, version: int) -> Rollout:
            self.rollouts.append(make(index, version))
            return self.rollouts[-1]

        def stepped(batch: Rollout, clock=None) -> dict[str, float]:
            self.batches.append(batch)
            return step(batch, clock)

        trainer.queue.make_rollout, trainer.optimizer_step = made, stepped
        trainer.on_step = self.after_step

    def after_step(self, trainer: GRPOTrainer, row: dict) -> None:
        self.refs.append({n: p.detach().clone() for n, p in trainer.reference.named_parameters()})
        self.policies.append({n: p.detach().clone() for n, p in trainer.policy.named_parameters()})


def _run(tmp: Path, stop_at: int | None = None) -> tuple[RunDir, GRPOTrainer, Recorder]:
    spec = load_spec(TINY, [f"output.runs_dir={tmp / 'runs'}", *OPTIONS])
    run = create_run(spec, ROOT)
    t = GRPOTrainer(spec, run, ROOT).setup()
    rec = Recorder(t)
    t.stop_at_step = stop_at
    t.train()
    return run, t, rec


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[RunDir, GRPOTrainer, Recorder]:
    return _run(tmp_path_factory.mktemp("straight"))


def test_one_rollout_serves_n_steps_slice_by_slice(straight) -> None:
    run, _, rec = straight
    assert [ro.index for ro in rec.rollouts] == [1, 2]  # 6 steps, N x mu = 4 per rollout: sampled twice
    rows = read_jsonl(run.metrics_path)[0]
    assert [r["rollout"] for r in rows] == [1, 1, 1, 1, 2, 2]
    per_step = PPS * G
    for ro in rec.rollouts:
        assert ro.completion_ids.shape[0] == N * per_step
    for u, batch in enumerate(rec.batches):
        ro = rec.rollouts[u // (N * MU)]
        rows_ = slice((u % N) * per_step, (u % N + 1) * per_step)  # slices 0, 1, 0, 1: TRL's order
        assert batch.completion_ids.shape[0] == per_step
        assert torch.equal(batch.completion_ids, ro.completion_ids[rows_])
        assert torch.equal(batch.advantages, ro.advantages[rows_])
    first = rec.rollouts[0]
    together = torch.cat([rec.batches[0].prompt_ids, rec.batches[1].prompt_ids])
    assert torch.equal(together, first.prompt_ids)  # the two slices are disjoint and cover the rollout
    samples = read_jsonl(run.samples_path)[0]
    assert sorted({s["step"] for s in samples}) == [1, 5]  # a rollout's samples once, at its first step
    assert sum(s["step"] == 1 for s in samples) == N * per_step
    assert all("kl" in r for r in rows)


def test_reference_syncs_every_n_steps_inside_the_run(straight) -> None:
    _, t, rec = straight
    assert t.ref_sync is not None and t.ref_sync.syncs == 3
    initial = {n: p.detach() for n, p in
               AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-add", dtype=torch.float32).named_parameters()}
    for i, ref in enumerate(rec.refs):
        step = i + 1
        before = rec.refs[i - 1] if i else initial  # before the first sync: the base model
        if step % EVERY:
            assert all(torch.equal(ref[n], before[n]) for n in ref), step
            continue
        for n in ref:  # ref = alpha x policy + (1 - alpha) x ref, with the policy after this step's update
            want = before[n].clone().mul_(1 - ALPHA).add_(rec.policies[i][n], alpha=ALPHA)
            assert torch.equal(ref[n], want), (step, n)


def test_exact_resume_mid_rollout_after_a_sync(straight, tmp_path: Path) -> None:
    """Stopped after step 3 (the first rollout has one update left; the reference was synced at step 2): the
    checkpoint holds the synced reference and the half-used rollout, and the resumed run ends as the straight one."""
    s_run, _, s_rec = straight
    part, _, _ = _run(tmp_path, stop_at=3)
    assert part.read_status()["state"] == "stopped"
    assert (part.checkpoints_dir / "step-3" / REFERENCE_DIR).is_dir()
    resumed = GRPOTrainer(load_spec(part.spec_path), part, ROOT, resume=True).setup()
    assert resumed.step == 3 and resumed.pending is not None and resumed.pending.iterations_done == 3
    for n, p in resumed.reference.named_parameters():
        assert torch.equal(p, s_rec.refs[2][n]), n  # the reference as synced at step 2, not the base model
    rec = Recorder(resumed)
    resumed.train()
    assert [ro.index for ro in rec.rollouts] == [2]
    for n, p in resumed.reference.named_parameters():
        torch.testing.assert_close(p, s_rec.refs[-1][n], rtol=1e-4, atol=1e-5)
    for n, p in resumed.policy.named_parameters():
        torch.testing.assert_close(p.detach(), s_rec.policies[-1][n], rtol=1e-4, atol=1e-5)
    ra, rb = read_jsonl(s_run.metrics_path)[0], read_jsonl(part.metrics_path)[0]
    assert [r["step"] for r in rb] == list(range(1, 7))
    assert [r["reward"] for r in ra] == pytest.approx([r["reward"] for r in rb], abs=1e-6)
    assert [r["kl"] for r in ra] == pytest.approx([r["kl"] for r in rb], rel=1e-4, abs=1e-7)


def test_async_with_steps_per_generation_resumes_exactly(tmp_path: Path) -> None:
    """Async generation counts a rollout's N x mu updates against max_staleness; a stop mid-rollout resumes
    to the straight run's weights."""
    extra = [f"output.runs_dir={tmp_path / 'runs'}", *OPTIONS[:8], "algorithm.max_steps=5", "rollout.steps_per_generation=2",
             "rollout.async_generation=true", "rollout.max_staleness=2"]
    spec = load_spec(TINY, extra)
    straight = GRPOTrainer(spec, create_run(spec, ROOT), ROOT).setup()
    straight.train()
    part_run = create_run(spec, ROOT)
    part = GRPOTrainer(spec, part_run, ROOT).setup()
    part.stop_at_step = 3
    part.train()
    resumed = GRPOTrainer(load_spec(part_run.spec_path), part_run, ROOT, resume=True).setup()
    resumed.train()
    for (n, a), (_, b) in zip(straight.policy.named_parameters(), resumed.policy.named_parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-4, atol=1e-5, msg=n)
    rows = read_jsonl(part_run.metrics_path)[0]
    assert [r["rollout"] for r in rows] == [1, 1, 2, 2, 3]


@pytest.mark.slow
def test_two_ranks_train_each_slice_as_one_rank(tmp_path: Path) -> None:
    """Two gloo ranks, N = 2: each step the ranks' shards make up that step's slice, so losses, KL and weights
    (the synced reference's too) follow the one-rank run; the half-used rollout a checkpoint keeps (step 1) is the
    one-rank one, joined back in order."""
    opts = [*OPTIONS[:8], "algorithm.max_steps=4", "output.save_steps=1", "rollout.steps_per_generation=2",
            "resources.device=cpu", "algorithm.beta=0.1", "algorithm.sync_ref_model=true",
            "algorithm.ref_model_sync_steps=2"]  # each rank syncs its own whole copy of the reference
    spec = load_spec(TINY, [f"output.runs_dir={tmp_path / 'one'}", *opts])
    one = create_run(spec, ROOT)
    GRPOTrainer(spec, one, ROOT).setup().train()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    sets = sum((["--set", o] for o in [f"output.runs_dir={tmp_path / 'two'}", *opts, "resources.nproc_per_node=2"]), [])
    proc = subprocess.run([sys.executable, "-m", "backend.train", "--config", str(TINY), *sets], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    two = RunDir(proc.stdout.splitlines()[0].strip())
    a, b = read_jsonl(one.metrics_path)[0], read_jsonl(two.metrics_path)[0]
    assert [r["rollout"] for r in b] == [1, 1, 2, 2]
    # the first rollout's two steps; after them the weights agree to rounding (all-reduce order), enough for a
    # sampled token of the next rollout to flip (as in tests/test_dist.py)
    for key in ("loss", "grad_norm", "kl"):
        assert [r[key] for r in b][:2] == pytest.approx([r[key] for r in a][:2], rel=1e-4, abs=1e-6), key
    wa = load_file(one.checkpoints_dir / "step-4" / "model" / "model.safetensors")
    wb = load_file(two.checkpoints_dir / "step-4" / "model" / "model.safetensors")
    init = load_file(ROOT / "assets/tiny-add/model.safetensors")
    diff = sum(float(((wa[k] - wb[k]) ** 2).sum()) for k in wa) ** 0.5
    moved = sum(float(((wb[k] - init[k]) ** 2).sum()) for k in wb) ** 0.5
    assert moved > 0.1 and diff < 0.01 * moved, (diff, moved)
    ra = load_file(one.checkpoints_dir / "step-4" / REFERENCE_DIR / "model.safetensors")
    rb = load_file(two.checkpoints_dir / "step-4" / REFERENCE_DIR / "model.safetensors")
    assert sum(float(((ra[k] - rb[k]) ** 2).sum()) for k in ra) ** 0.5 < 0.01 * moved
    pa = checkpoint.load_trainer_state(one.checkpoints_dir / "step-1" / "trainer_state.pt").pending
    pb = checkpoint.load_trainer_state(two.checkpoints_dir / "step-1" / "trainer_state.pt").pending
    assert pa is not None and pb is not None and pa.iterations_done == pb.iterations_done == 1
    for name in ("completion_ids", "advantages", "ref_logps"):
        torch.testing.assert_close(getattr(pb.rollout, name), getattr(pa.rollout, name), msg=name)
