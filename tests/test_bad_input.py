"""Bad input is refused before launch, with the same message from the CLI and in the studio's form.

Each case names the field and says what is wrong (the file, the line or row, the column, the reward);
no run directory is created. The fixtures are small hand-made files in tests/data/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.form import spec_to_values, validate_values
from app.paths import Workspace
from backend.checks import check, check_spec
from backend.machine import Machine
from backend.plan import plan
from backend.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets" / "tiny-cpu.yaml"

CASES = [
    pytest.param(["data.sources=[tests/data/bad_json_line3.jsonl]"], "data.sources",
                 "tests/data/bad_json_line3.jsonl: line 3: not valid JSON", id="malformed-jsonl-line"),
    pytest.param(["data.sources=[tests/data/no_prompt_row2.jsonl]"], "data.prompt_column",
                 "tests/data/no_prompt_row2.jsonl line 2: no 'prompt' column", id="row-without-prompt"),
    pytest.param(["model.name_or_path=some-org/some-model"], "model.name_or_path",
                 "not a local model directory, and the hub cannot be reached", id="hub-model-offline"),
    # a missing file shaped like org/name.jsonl was taken for a hub dataset and failed 31 s into the run (issue 29)
    pytest.param(["data.sources=[data/does_not_exist.jsonl]"], "data.sources",
                 "no such file or directory: data/does_not_exist.jsonl", id="missing-local-data-file"),
    pytest.param(["data.sources=[some-org/some-dataset]"], "data.sources",
                 "not a local file or folder, and the hub cannot be reached", id="hub-dataset-offline"),
    pytest.param(["data.sources=[tests/data/no_solution.jsonl]", "rewards.functions=[{name: length}]"],
                 "data.solution_column",
                 "column 'solution' not in tests/data/no_solution.jsonl, which reward length needs", id="reward-needs-column"),
    pytest.param(["data.sources=[assets/data/add_train.jsonl]",
                  "rewards.functions=[{name: countdown, params: {nums_column: numbers}}]"],
                 "rewards.functions", "column 'numbers' not in assets/data/add_train.jsonl, which reward countdown needs",
                 id="reward-param-column"),
]


# issue 28: inputs that used to pass the check and then failed at run time, with the wrong cause or silently
REFUSED = [
    pytest.param(["data.sources=[assets/data/add_train.jsonl#99999999999]"], "data.sources",
                 "sample count after '#' is at most 10,000,000 rows", id="huge-sample-count"),
    pytest.param(["data.sources=[tests/data/prompt_dict.jsonl]"], "data.prompt_column",
                 "prompt_dict.jsonl line 1: 'prompt' is a dict; a prompt is non-empty text or a list of chat messages",
                 id="dict-prompt"),
    pytest.param(["data.sources=[tests/data/prompt_bytes.parquet]"], "data.prompt_column",
                 "prompt_bytes.parquet row 1: 'prompt' is bytes", id="bytes-prompt"),
    pytest.param(["data.sources=[tests/data/prompt_ints.jsonl]"], "data.prompt_column",
                 "prompt_ints.jsonl line 2: 'prompt' is a list of int values", id="list-of-ints-prompt"),
    pytest.param(["data.sources=[tests/data/prompt_nested.jsonl]"], "data.prompt_column",
                 "prompt_nested.jsonl line 1: 'prompt' is a nested list", id="nested-list-prompt"),
    pytest.param(["data.sources=[tests/data/chat_no_content.jsonl]"], "data.prompt_column",
                 "chat_no_content.jsonl line 1: 'prompt' is a chat message without 'content'", id="chat-without-content"),
    pytest.param(["data.sources=[tests/data/prompt_blank.jsonl]"], "data.prompt_column",
                 "prompt_blank.jsonl line 2: 'prompt' is empty (or only white space)", id="blank-prompt"),
    pytest.param(["data.sources=[tests/data/solution_float.jsonl]"], "data.solution_column",
                 "solution_float.jsonl line 1: 'solution' is a float; reward exact_match takes text / blank / int",
                 id="float-solution-exact-match"),
    pytest.param(["data.sources=[tests/data/prompt_dict.jsonl]", "data.prompt_template='Q: {prompt}'"],
                 "data.prompt_template", "'prompt' is a dict; the prompt template formats its columns as text",
                 id="dict-in-template"),
    pytest.param(["output.runs_dir=README.md"], "output.runs_dir", "README.md is a file, not a folder",
                 id="runs-dir-is-a-file"),
    pytest.param(["output.runs_dir=README.md/runs"], "output.runs_dir", "README.md is a file, not a folder",
                 id="runs-dir-under-a-file"),
    pytest.param(["algorithm.epsilon=.nan"], "algorithm.epsilon", "Input should be a finite number", id="nan-bound"),
    pytest.param(["rollout.temperature=.inf"], "rollout.temperature", "Input should be a finite number", id="inf-bound"),
    pytest.param(["algorithm.sync_ref_model=true"], "algorithm.sync_ref_model", "needs beta > 0",
                 id="ref-sync-without-reference"),
    pytest.param(["algorithm.sync_ref_model=true", "algorithm.beta=0.04", "model.finetune=lora"],
                 "algorithm.sync_ref_model", "not with LoRA", id="ref-sync-with-lora"),
]


@pytest.mark.parametrize("overrides, field, words", REFUSED)
def test_refused_before_launch_by_the_launchers_check_and_the_form(overrides: list[str], field: str, words: str) -> None:
    """The launcher's check (what the CLI and Start run) and the form name the same field and cause."""
    from backend.checks import validate_or_raise
    from backend.spec import SpecError

    try:
        spec = load_spec(TINY, overrides)
        with pytest.raises(SpecError) as err:
            validate_or_raise(spec, ROOT, Machine())
        issues = err.value.issues
    except SpecError as parse_err:  # refused when the spec is read (a bound)
        spec, issues = None, parse_err.issues
    assert any(i.field == field and words in i.message for i in issues), issues
    if spec is None:
        return
    v = validate_values(spec_to_values(spec), ROOT, Workspace(ROOT))
    assert any(words in m for m in v.by_field.get(field, [])), v.by_field


@pytest.mark.parametrize("overrides, field, words", CASES)
def test_cli_refuses_before_launch(tmp_path: Path, overrides: list[str], field: str, words: str) -> None:
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "backend.train", "--config", str(TINY), f"--set=output.runs_dir={runs}"]
    cmd += [f"--set={o}" for o in overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = next((x for x in proc.stderr.splitlines() if x.strip().startswith(f"- {field}:")), None)
    assert line is not None and words in line, proc.stderr
    assert not runs.exists() or not any(runs.iterdir())  # nothing was created


@pytest.mark.parametrize("overrides, field, words", CASES)
def test_form_shows_the_same_message_under_the_field(overrides: list[str], field: str, words: str) -> None:
    v = validate_values(spec_to_values(load_spec(TINY, overrides)), ROOT, Workspace(ROOT))
    assert not v.ok
    assert any(words in m for m in v.by_field.get(field, [])), v.by_field


def test_planner_and_launcher_agree_on_every_case() -> None:
    """A spec the planner calls OK starts; one it refuses is refused by the launcher's check too."""
    machine = Machine()  # no GPU, hf engine only, hub unreachable
    for case in CASES:
        spec = load_spec(TINY, case.values[0])
        verdict = plan(spec, machine, ROOT)
        assert not verdict.ok and verdict.issues == check(spec, ROOT, machine)
    good = load_spec(TINY)
    assert plan(good, machine, ROOT).ok and check(good, ROOT, machine) == []


def test_well_formed_checks_do_not_depend_on_the_machine() -> None:
    """GPU presets and hub models are well formed anywhere; only check_machine says they cannot start here."""
    spec = load_spec(TINY, ["model.name_or_path=some-org/some-model"])
    assert check_spec(spec, ROOT) == []
    assert check(spec, ROOT, Machine(hub_reachable=True)) == []


def test_scan_reports_other_formats(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from backend.data import scan_source

    (tmp_path / "a.csv").write_text("prompt,solution\n1+1=,2\n2+2=\n")
    scan = scan_source(tmp_path / "a.csv", ["prompt", "solution"])
    assert scan.missing == {"solution": "row 2"} and not scan.absent("solution")
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "solution": "1"}, {"prompt": None, "solution": "2"}]),
                   tmp_path / "a.parquet")
    assert scan_source(tmp_path / "a.parquet", ["prompt"]).missing == {"prompt": "row 2"}
    (tmp_path / "a.json").write_text('[{"prompt": "a"}, 3]')
    assert scan_source(tmp_path / "a.json", ["prompt"]).error == "row 2: not an object with columns (got int)"
    (tmp_path / "b.jsonl").write_bytes(b'{"prompt": "\xff"}\n')
    assert scan_source(tmp_path / "b.jsonl", ["prompt"]).error == "not UTF-8 text"
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert scan_source(tmp_path / "empty.jsonl", ["prompt"]).error == "no rows"


def test_a_reward_that_scores_nothing_is_reported_in_status(tmp_path: Path) -> None:
    from backend.rundir import create_run
    from backend.train.loop import GRPOTrainer

    plugin = tmp_path / "silent.py"
    plugin.write_text("def silent(completions, prompts=None, **kw):\n    return [None] * len(completions)\n")
    spec = load_spec(TINY, [f"output.runs_dir={tmp_path / 'runs'}", "algorithm.max_steps=2", "algorithm.prompts_per_step=2",
                            "rollout.num_generations=2", "output.eval_steps=0", f"rewards.plugins=[{plugin}]",
                            "rewards.functions=[{name: exact_match}, {name: silent}]"])
    run = create_run(spec, ROOT)
    GRPOTrainer(spec, run, ROOT).setup().train()
    warnings = run.read_status()["warnings"]
    assert len(warnings) == 1 and "'silent' returned None for every completion in 2 rollout batch(es)" in warnings[0]

    from app.runlist import run_info
    from app.runs_tab import progress_html

    html = progress_html(run_info(run), None, "en")
    assert 'id="run-warnings"' in html and "silent" in html


def _break_truncate(d: Path) -> None:
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])


def _break_header(d: Path) -> None:
    w = d / "model.safetensors"
    w.write_bytes((1 << 40).to_bytes(8, "little") + w.read_bytes()[8:])


def _break_config(d: Path) -> None:
    (d / "config.json").write_text('{"model_type": "qwen2",')


def _unknown_architecture(d: Path) -> None:
    import json

    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "frobnicator"}))


def _no_tokenizer(d: Path) -> None:
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()


@pytest.mark.parametrize("breakage, words", [
    (_break_truncate, "model.safetensors is truncated: its tensors need"),
    (_break_header, "model.safetensors is corrupt or truncated: no valid header"),
    (_break_config, "config.json is not valid JSON"),
    (_unknown_architecture, "model_type 'frobnicator' is not an architecture the installed transformers knows"),
    (_no_tokenizer, "has no tokenizer (tokenizer.json"),
], ids=["truncated-safetensors", "corrupt-safetensors-header", "bad-config-json", "unknown-architecture",
        "no-tokenizer"])
def test_a_broken_model_directory_is_refused_before_launch(tmp_path: Path, breakage, words: str) -> None:
    """Read before launch: config.json, the safetensors headers against the file sizes, the architecture, the
    tokenizer's files (these failed at load with a library traceback, or an empty tokenizer)."""
    import shutil

    from backend.checks import validate_or_raise
    from backend.spec import SpecError

    model = tmp_path / "model"
    shutil.copytree(ROOT / "assets" / "tiny-add", model)
    breakage(model)
    spec = load_spec(TINY, [f"model.name_or_path={model}"])
    with pytest.raises(SpecError) as err:
        validate_or_raise(spec, ROOT, Machine())
    assert any(i.field == "model.name_or_path" and words in i.message for i in err.value.issues), err.value.issues
    v = validate_values(spec_to_values(spec), ROOT, Workspace(ROOT, [tmp_path]))
    assert any(words in m for m in v.by_field.get("model.name_or_path", [])), v.by_field


def test_a_prompt_over_the_token_bound_is_refused_before_launch(tmp_path: Path) -> None:
    """data.max_prompt_tokens: a huge prompt is refused by its size alone (no tokenizer runs on it), a long one
    after counting its tokens with the model's tokenizer, as the trainer would render it; short ones pass."""
    import json

    from backend.checks import validate_or_raise
    from backend.spec import SpecError

    def refused(rows: list[dict], *overrides: str) -> list[str]:
        src = tmp_path / f"d{len(list(tmp_path.iterdir()))}.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
        spec = load_spec(TINY, [f"data.sources=[{src}]", *overrides])
        try:
            validate_or_raise(spec, ROOT, Machine())
        except SpecError as err:
            return [i.message for i in err.issues if i.field == "data.max_prompt_tokens"]
        return []

    short = [{"prompt": "12+34=", "solution": "64"}] * 3
    assert refused([*short, {"prompt": "1" * 600_000, "solution": "1"}]) == \
        [f"{tmp_path}/d0.jsonl line 4: the prompt is 600,000 bytes, far beyond 8,192 tokens"]
    (msg,) = refused([*short, {"prompt": "12+34=" * 10, "solution": "1"}], "data.max_prompt_tokens=16")
    assert "line 4: the prompt is" in msg and "tokens, over 16" in msg
    assert refused(short, "data.max_prompt_tokens=16") == []


@pytest.mark.parametrize("source, words", [
    ("tests/data/prompt_dict.jsonl", "row 1: 'prompt' is a dict; a prompt is non-empty text"),
    ("tests/data/prompt_blank.jsonl", "row 2: 'prompt' is empty (or only white space)"),
])
def test_the_trainers_loader_applies_the_same_prompt_rule(source: str, words: str) -> None:
    """Sources the check cannot read before launch (hub datasets) meet the same rule when the trainer loads them."""
    from backend.data import DataError, load_rows

    with pytest.raises(DataError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_rows([source], load_spec(TINY).data, 0, ROOT)


def test_the_preview_of_a_huge_prompt_is_clipped(tmp_path: Path) -> None:
    """The Build page's preview reads the first rows only and clips each text cell before rendering it."""
    import json
    import time

    from app.data_preview import PREVIEW_CHARS, preview_rows

    src = tmp_path / "huge.jsonl"
    src.write_text(json.dumps({"prompt": "7" * 5_000_000, "solution": "1"}) + "\n")
    t0 = time.time()
    rows, _ = preview_rows(load_spec(TINY, [f"data.sources=[{src}]"]), ROOT, n=5)
    assert time.time() - t0 < 20
    assert len(rows) == 1 and len(rows[0]["rendered"]) < PREVIEW_CHARS + 200
    assert rows[0]["rendered"].endswith(f"[{5_000_000 - PREVIEW_CHARS:,} more characters]")


def test_a_rewards_parameter_named_column_is_checked_by_kind(tmp_path: Path) -> None:
    """countdown reads nums as a list of numbers: a nums column holding text ("3 8") is refused, naming the row."""
    import json

    src = tmp_path / "cd.jsonl"
    src.write_text(json.dumps({"prompt": "make 24", "nums": [3, 8], "target": 24}) + "\n"
                   + json.dumps({"prompt": "make 24", "nums": "3 8", "target": 24}) + "\n")
    spec = load_spec(TINY, [f"data.sources=[{src}]", "data.eval_sources=[]", "output.eval_steps=0",
                            "rewards.functions=[{name: countdown}]"])
    assert [str(i) for i in check(spec, ROOT, Machine())] == [
        f"rewards.functions: {src} line 2: 'nums' is text; reward countdown takes list of int values / "
        "list of float values / list of text values"]
