"""Placement rules as a table: good and bad splits, the expected message, and the CLI (validate_or_raise, then
create_run, as the launcher and `python -m backend.train` do), the studio's form and the planner all agreeing on every row."""

from __future__ import annotations

from pathlib import Path

import pytest

import backend.machine
from app.form import spec_to_values, validate_values
from backend import checks
from backend.machine import GPU, Machine
from backend.plan import plan
from backend.rundir import create_run
from backend.spec import SpecError, load_spec

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets/tiny-cpu.yaml"
CPU = Machine()
GPU4 = Machine(tuple(GPU(i, "H100", 80.0) for i in range(4)), frozenset({"hf", "vllm"}))
GPU8 = Machine(tuple(GPU(i, "H100", 80.0) for i in range(8)), frozenset({"hf", "vllm"}))
VLLM_SEP = ["resources.device=cuda", "rollout.engine=vllm", "rollout.placement=separate", "resources.train_gpus=[0]"]

# (id, machine, overrides, None if it runs else (field, words in the message))
ROWS = [
    ("cpu-colocate", CPU, ["resources.device=cpu"], None),
    ("cpu-hf-workers-dp2", CPU, ["resources.device=cpu", "rollout.placement=separate", "rollout.data_parallel_size=2"], None),
    ("cpu-hf-tp2", CPU, ["resources.device=cpu", "rollout.placement=separate", "rollout.tensor_parallel_size=2"],
     ("rollout.tensor_parallel_size", "no tensor parallelism")),
    ("cpu-colocate-dp2", CPU, ["resources.device=cpu", "rollout.data_parallel_size=2"],
     ("rollout.data_parallel_size", "need placement 'separate'")),
    ("cpu-lmdeploy", CPU, ["resources.device=cpu", "rollout.engine=lmdeploy"], ("rollout.engine", "needs CUDA GPUs")),
    ("cpu-with-gpus", CPU, ["resources.device=cpu", "rollout.placement=separate", "resources.rollout_gpus=[1]"],
     ("resources.device", "cannot use train_gpus/rollout_gpus")),
    ("urls-colocate", CPU, ["resources.device=cpu", "rollout.worker_urls=['10.0.0.2:5555']"],
     ("rollout.worker_urls", "need placement 'separate'")),
    ("cpu-worker-python-missing", CPU, ["resources.device=cpu", "rollout.worker_python=/no/such/python"],
     ("rollout.worker_python", "is not a Python interpreter that runs")),
    ("gpu-1+3-dp3", GPU4, [*VLLM_SEP, "resources.rollout_gpus=[1, 2, 3]", "rollout.data_parallel_size=3"], None),
    ("gpu-1+2-tp2", GPU4, [*VLLM_SEP, "resources.rollout_gpus=[2, 3]", "rollout.tensor_parallel_size=2"], None),
    ("gpu-6+2-split", GPU8, [*VLLM_SEP, "resources.rollout_gpus=[6, 7]", "rollout.data_parallel_size=2"], None),
    ("gpu-count-mismatch", GPU4, [*VLLM_SEP, "resources.rollout_gpus=[1, 2, 3]", "rollout.data_parallel_size=2"],
     ("resources.rollout_gpus", "3 rollout GPUs do not match data_parallel_size x tensor_parallel_size = 2 x 1")),
    ("gpu-overlap", GPU4, [*VLLM_SEP, "resources.rollout_gpus=[0, 1]", "rollout.data_parallel_size=2"],
     ("resources.rollout_gpus", "GPUs [0] are in both train_gpus and rollout_gpus")),
    ("gpu-not-visible", GPU4, [*VLLM_SEP, "resources.rollout_gpus=[4, 5]", "rollout.data_parallel_size=2"],
     ("resources.rollout_gpus", "not visible (this machine has 4)")),
    ("gpu-separate-no-rollout-gpus", GPU4, VLLM_SEP, ("resources.rollout_gpus", "needs rollout GPUs")),
    ("gpu-lmdeploy-absent", GPU4, [*VLLM_SEP, "rollout.engine=lmdeploy", "resources.rollout_gpus=[1]"],
     ("rollout.engine", "not installed here")),
    ("gpu-colocate-rollout-gpus", GPU4, ["resources.device=cuda", "rollout.engine=vllm", "resources.rollout_gpus=[1]"],
     ("resources.rollout_gpus", "for placement 'separate'")),
]


@pytest.mark.parametrize("machine,overrides,expect", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_split_table(tmp_path, monkeypatch, machine, overrides, expect) -> None:
    monkeypatch.setattr(backend.machine, "_detect_machine", lambda: machine)
    spec = load_spec(TINY, [f"output.runs_dir={tmp_path}", *overrides])
    # the studio's form
    form = validate_values(spec_to_values(spec), ROOT)
    form_msgs = {f: " ".join(ms) for f, ms in form.by_field.items()}
    # the CLI and the launcher: validated before create_run creates anything
    try:
        create_run(checks.validate_or_raise(spec, ROOT), ROOT)
        cli_issues: list = []
    except SpecError as err:
        cli_issues = err.issues
    verdict = plan(spec, machine, ROOT)
    if expect is None:
        assert form.ok and not cli_issues and verdict.ok, (form.all_messages(), cli_issues, verdict.lines)
    else:
        field, words = expect
        assert words in form_msgs.get(field, ""), form_msgs
        assert any(i.field == field and words in i.message for i in cli_issues), cli_issues
        assert not verdict.ok and any(words in line for line in verdict.lines), verdict.lines


def test_gpu_panel_shows_chips_instances_and_memory() -> None:
    spec = load_spec(TINY, [*VLLM_SEP, "resources.rollout_gpus=[4, 5, 6, 7]", "rollout.data_parallel_size=2",
                            "rollout.tensor_parallel_size=2", "model.dtype=bfloat16"])
    verdict = plan(spec, GPU8, ROOT, params=7_615_616_512)
    text = "\n".join(verdict.lines)
    assert "2 instance(s) x TP 2" in text
    assert ("chips: GPU 0 training, GPU 1 idle, GPU 2 idle, GPU 3 idle, GPU 4 rollout 0, GPU 5 rollout 0, "
            "GPU 6 rollout 1, GPU 7 rollout 1") in text
    assert "7.1 GiB of weights per rollout GPU" in text  # 7.6e9 x 2 bytes / TP 2
    small = Machine(tuple(GPU(i, "L4", 24.0) for i in range(8)), frozenset({"hf", "vllm"}))
    tp1 = load_spec(TINY, [*VLLM_SEP, "resources.rollout_gpus=[7]", "model.dtype=bfloat16"])
    lines = plan(tp1, small, ROOT, params=7_615_616_512).lines  # 14.2 GiB of bf16 weights on one 24 GiB GPU: fits
    assert not any("exceed" in line for line in lines)
    lines = plan(tp1, small, ROOT, params=14_000_000_000).lines  # 26.1 GiB: does not
    assert "⚠ the engine's weights (26.1 GiB per GPU) exceed 90% of a 24 GiB GPU: raise tensor_parallel_size or " \
           "gpu_memory_utilization" in lines
