"""Build-page helpers: model check without weights, data preview, GPU planner, reward test, presets, command."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from app.commands import export_yaml, list_presets, load_preset, preset_path, save_preset, train_command
from app.data_preview import preview_rows
from app.model_info import estimate_params, human_count, model_summary
from app.reward_test import score_rewards
from backend.data import DataError, head_rows
from backend.machine import GPU, Machine
from backend.plan import plan
from backend.spec import apply_overrides, load_spec, spec_from_dict

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets" / "tiny-cpu.yaml"


def test_model_summary_reads_headers_not_weights():
    s = model_summary(ROOT / "assets" / "tiny-add")
    assert s["architecture"] == "Qwen2ForCausalLM" and s["layers"] == 4 and s["parameters_exact"]
    est = estimate_params(json.loads((ROOT / "assets" / "tiny-add" / "config.json").read_text()))
    assert est == s["parameters"]  # the config estimate matches the safetensors count for this Qwen2
    assert human_count(2_652_672) == "2.65 M" and human_count(7_615_616_512) == "7.62 B"
    big = {"hidden_size": 3584, "num_hidden_layers": 28, "vocab_size": 152064, "num_attention_heads": 28,
           "num_key_value_heads": 4, "intermediate_size": 18944, "model_type": "qwen2"}
    assert 7.5e9 < estimate_params(big) < 7.7e9  # Qwen2.5-7B has 7.62 B
    assert estimate_params({"model_type": "x"}) is None


def test_read_rows_formats(tmp_path):
    rows = [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+2=", "solution": "4"}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "a.json").write_text(json.dumps({"data": rows}))
    (tmp_path / "a.csv").write_text("prompt,solution\n1+1=,2\n2+2=,4\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    for name in ("a.jsonl", "a.json", "a.csv", "a.parquet"):
        assert head_rows(tmp_path / name, 1) == rows[:1], name
    with pytest.raises(DataError):
        head_rows(tmp_path / "a.txt", 1)


def test_preview_shows_prompts_as_the_model_sees_them(tmp_path):
    spec = load_spec(TINY, ["data.system_prompt=Add."])
    rows, note = preview_rows(spec, ROOT, n=2)
    assert len(rows) == 2 and note == ""
    first = head_rows(ROOT / "assets" / "data" / "add_train.jsonl", 1)[0]
    assert rows[0]["rendered"] == f"Add.\n{first['prompt']}"  # tiny-add has no chat template
    assert rows[0]["columns"] == first


def test_planner_on_cpu_and_gpus():
    spec = load_spec(TINY)
    cpu = Machine()
    verdict = plan(spec, cpu, ROOT)
    assert verdict.ok and "CPU" in verdict.lines[0]
    cuda = spec_from_dict(apply_overrides(spec.model_dump(mode="json"), ["resources.device=cuda"]))
    assert not plan(cuda, cpu, ROOT).ok
    gpus = Machine(tuple(GPU(i, "H100", 80.0) for i in range(4)), frozenset({"hf", "vllm"}))
    sep = spec_from_dict(apply_overrides(spec.model_dump(mode="json"), [
        "rollout.engine=vllm", "rollout.placement=separate", "resources.train_gpus=[0, 1]",
        "resources.rollout_gpus=[2, 3]", "rollout.tensor_parallel_size=2"]))
    verdict = plan(sep, gpus, ROOT)
    assert "training on GPUs [0, 1]" in verdict.lines[0] and "[2, 3]" in verdict.lines[0]
    assert any("data parallel" in x for x in verdict.lines)
    missing = spec_from_dict(apply_overrides(sep.model_dump(mode="json"), ["resources.rollout_gpus=[2, 7]"]))
    verdict = plan(missing, gpus, ROOT)
    assert not verdict.ok and any("not visible" in x for x in verdict.lines)


def test_reward_test_runs_in_a_subprocess():
    result = score_rewards(load_spec(TINY), ROOT, rows=3)
    assert "error" not in result, result
    names = {f["function"] for f in result["functions"]}
    assert {"exact_match", "digit_match"} <= names
    assert len(result["samples"]) == 3 and all(s["reward"] == 1.0 for s in result["samples"])  # solutions score max (digit_match: weight 0)


def test_presets_save_load_and_names(tmp_path):
    spec = load_spec(TINY, ["algorithm.max_steps=7"])
    save_preset(tmp_path, "mine", spec)
    with pytest.raises(FileExistsError):
        save_preset(tmp_path, "mine", spec)
    save_preset(tmp_path, "mine", spec, overwrite=True)
    assert load_preset(tmp_path, "mine") == spec
    (tmp_path / "tiny-cpu.yaml").write_text(TINY.read_text())
    assert list_presets(tmp_path) == ["tiny-cpu", "mine"]
    for bad in ("../x", "a/b", "", ".hidden", "x" * 80):
        with pytest.raises(ValueError):
            preset_path(tmp_path, bad)
    assert list_presets(ROOT / "presets")[0] == "tiny-cpu"
    out = export_yaml(spec, tmp_path / "exp", "my run")
    assert out.name == "my-run.yaml" and load_spec(out) == spec


def test_train_command_reproduces_the_spec(tmp_path):
    spec = load_spec(TINY, ["algorithm.max_steps=60", "data.system_prompt=\"Be: brief, 'ok'\"", "output.run_name=x",
                            "rollout.temperature=0.7", "rewards.functions=[{name: exact_match, weight: 2}]"])
    cmd = train_command(spec, "tiny-cpu", str(ROOT / "presets"))
    args = shlex.split(cmd.replace("\\\n", " "))
    assert args[:5] == ["python", "-m", "backend.train", "--config", str(ROOT / "presets" / "tiny-cpu.yaml")]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    rebuilt = load_spec(TINY, sets)  # what the CLI would build from the command
    assert rebuilt == spec
    bare = train_command(spec)
    assert "--config" not in bare and load_spec(TINY, []) != spec


def test_build_page_checks_once_per_change(monkeypatch):
    """The form's validation keeps check()'s verdict and the planner line reuses it: one check per change."""
    import app.form as form
    import backend.checks as checks
    from app.build_tab import planner_md
    from app.form import spec_to_values, validate_values

    spec = load_spec(TINY)
    calls = []
    real = checks.check
    monkeypatch.setattr(form, "check", lambda *a, **k: calls.append(a) or real(*a, **k))
    v = validate_values(spec_to_values(spec), ROOT)
    assert v.ok and v.checked == [] and len(calls) == 1
    monkeypatch.setattr(checks, "check", lambda *a, **k: pytest.fail("plan ran check() again"))
    assert "✓" in planner_md(v.spec, "en", ROOT, v.checked)
    # a bad spec: the planner's verdict is the form's, issues and all
    bad = {**spec_to_values(spec), "resources.device": "cuda"}  # no GPU here
    monkeypatch.setattr(form, "check", real)
    v = validate_values(bad, ROOT)
    assert not v.ok and v.checked and "⚠" in planner_md(v.spec, "en", ROOT, v.checked)
