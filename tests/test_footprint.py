"""The memory estimate (backend.footprint): parts worked by hand for a small shape, the options that move them, and
the check's refusal before launch on a machine too small for the run."""

from __future__ import annotations

from pathlib import Path

from backend.checks import check
from backend.footprint import GIB, ModelShape, auto_chunk, footprint, memory_issues, spec_shape
from backend.machine import Machine
from backend.plan import plan
from backend.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets/tiny-cpu.yaml"
SHAPE = ModelShape(vocab=1000, hidden=8, layers=2, intermediate=16, heads=2, kv_heads=1, head_dim=4, tied=False)


def spec(*overrides: str):
    return load_spec(TINY, ["algorithm.prompts_per_step=2", "rollout.num_generations=4",
                            "rollout.max_completion_length=10", "algorithm.gradient_accumulation_steps=1",
                            "algorithm.beta=0", *overrides])


def test_parts_by_hand() -> None:
    # params: per layer q,o 8x8 x2 = 128, k,v 8x4 x2 = 64, mlp 3x8x16 = 384, norms 16 -> 592; x2 layers = 1184;
    # embeddings and an untied head 2 x 1000 x 8 = 16000; the final norm 8
    assert SHAPE.params == 1184 + 16000 + 8
    fp = footprint(spec(), SHAPE, prompt_tokens=8)
    n = SHAPE.params
    assert (fp.weights, fp.gradients, fp.optimizer, fp.reference) == (4 * n, 4 * n, 8 * n, 0)
    rows, tokens = 8, 8 * (10 + 8 // 4)  # one micro-batch of 8 completions; a group's prompt once
    assert fp.logits == 3 * 4 * 1000 * min(tokens, auto_chunk(1000)) + 1000 * 8 * 4  # + the head's gradient buffer
    per_token_layer = (6 * 8 + 3 * 16) * 4
    attention = rows * 2 * 18 * 18 * 4
    assert fp.activations == tokens * per_token_layer * 2 + attention * 2
    assert fp.engine == 8 * 18 * 2 * 2 * 1 * 4 * 4 + 3 * 8 * 1000 * 4  # KV cache + decode logits
    assert fp.total == sum(fp.parts().values())


def test_options_move_the_parts_they_name() -> None:
    base = footprint(spec(), SHAPE, 8)
    assert footprint(spec("algorithm.beta=0.04"), SHAPE, 8).reference == base.weights
    assert footprint(spec("model.gradient_checkpointing=true"), SHAPE, 8).activations < base.activations
    assert footprint(spec("algorithm.logprob_chunk_tokens=4"), SHAPE, 8).logits == 3 * 4 * 1000 * 4 + 1000 * 8 * 4
    # one rollout for 3 steps: the engine samples 3 steps' completions at once; a training micro-batch is the same
    spg = footprint(spec("rollout.steps_per_generation=3"), SHAPE, 8)
    assert (spg.engine, spg.activations, spg.logits) == (3 * base.engine, base.activations, base.logits)
    assert footprint(spec("algorithm.gradient_accumulation_steps=2"), SHAPE, 8).activations < base.activations
    lora = footprint(spec("model.finetune=lora"), SHAPE, 8)
    assert lora.optimizer < base.optimizer and lora.reference == 0


def test_a_run_too_large_for_the_machine_is_refused_before_launch_naming_what_lowers_it() -> None:
    s = load_spec(TINY)
    assert memory_issues(s, ROOT, Machine(ram_gib=64)) == []
    assert memory_issues(s, ROOT, Machine(ram_gib=0)) == []  # unknown memory: nothing refused
    issues = check(s, ROOT, Machine(ram_gib=0.05))
    msg = next(i.message for i in issues if "GiB of RAM on this machine" in i.message)
    assert "the run needs about" in msg and "model.gradient_checkpointing" in msg, msg
    assert not plan(s, Machine(ram_gib=0.05), ROOT).ok  # the planner says so too: it is the check's verdict
    shape = spec_shape(s, ROOT)
    assert shape is not None and shape.params == 2_649_600  # the shipped tiny model's count (safetensors agrees)
    assert any(line.startswith("memory ≈") for line in plan(s, Machine(ram_gib=64), ROOT).lines)


def test_the_estimate_is_near_what_bench_memory_measured() -> None:
    """bench.memory's 152k-vocabulary shape (4 x 8 x 128, hidden 256, 4 layers): measured 1.23 GB above the floor
    of weights, gradients and AdamW (bench/RESULTS.md, 2026-12-03); the estimate of the same parts stays within 2x."""
    from bench.memory import spec_for

    shape = ModelShape(151_936, 256, 4, 512, 4, 4, 64, tied=False)
    fp = footprint(spec_for(Path("unused"), 128, 3), shape, prompt_tokens=12)
    above = fp.logits + fp.activations + fp.engine + fp.reference
    measured = 1.23e9
    assert measured / 2 < above < measured * 2, above / GIB


def test_a_colocated_engine_reserve_counts_against_the_training_gpu() -> None:
    from backend.footprint import colocated_need
    from backend.machine import GPU

    s = load_spec(TINY, ["resources.device=cuda", "rollout.engine=vllm", "rollout.placement=colocate",
                         "rollout.gpu_memory_utilization=0.5", "rollout.sleep=false"])
    fp = footprint(s, spec_shape(s, ROOT))
    gpu = 4 * fp.total  # training alone takes a quarter of this GPU
    machine = Machine(gpus=(GPU(0, "test GPU", gpu / GIB),))
    assert colocated_need(s, fp, gpu) == fp.total + gpu // 2
    assert memory_issues(s, ROOT, machine) == []  # 1/4 + 1/2 of the GPU fits
    greedy = s.model_copy(deep=True)
    greedy.rollout.gpu_memory_utilization = 0.9  # 1/4 + 0.9 does not
    (issue,) = memory_issues(greedy, ROOT, machine)
    assert issue.field == "rollout.gpu_memory_utilization"
    assert "turn on rollout.sleep" in issue.message and "placement separate" in issue.message, issue.message
    asleep = greedy.model_copy(deep=True)
    asleep.rollout.sleep = True  # it wakes beside weights + AdamW's moments (3/4 of training's peak): still too much
    assert colocated_need(asleep, fp, gpu) == fp.weights + fp.optimizer + fp.reference + int(0.9 * gpu)
    asleep.rollout.gpu_memory_utilization = 0.3
    assert memory_issues(asleep, ROOT, machine) == []
    hf = s.model_copy(deep=True)
    hf.rollout.engine = "hf"  # shares the policy's weights: no reserve
    assert colocated_need(hf, fp, gpu) == 0
