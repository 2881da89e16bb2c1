"""The Build page's exports (Preview shows the form as an ms-swift command and a TRL config, with what each cannot
hold) and the import box's Undo, through their handlers."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pytest

from app.config import StudioConfig
from app.export_view import export_updates, lost_md, undo_import, undoable_import
from app.fields import Registry
from app.form import fields
from backend.exporters import export_swift, export_trl
from backend.importers import import_any
from backend.spec import RunSpec, load_spec

ROOT = Path(__file__).resolve().parents[1]
SWIFT_CMD = ("NPROC_PER_NODE=2 swift rlhf --rlhf_type grpo --model Qwen/Qwen2.5-0.5B-Instruct --beta 0.01 "
             "--num_generations 4 --per_device_train_batch_size 4 --max_steps 30 --reward_funcs accuracy")


@pytest.fixture(scope="module")
def tab(tmp_path_factory):
    from app.build_tab import BuildTab

    config = StudioConfig.create(ROOT, tmp_path_factory.mktemp("runs"))
    with gr.Blocks():
        return BuildTab(config, Registry(), gr.State("en"))


def is_update(v, **kw) -> bool:
    return isinstance(v, dict) and v.get("__type__") == "update" and all(v.get(k) == x for k, x in kw.items())


def test_preview_shows_both_exports_with_what_they_cannot_hold(tab):
    assert tab.exports.swift.elem_id == "export-swift" and tab.exports.trl.elem_id == "export-trl"
    spec = load_spec(ROOT / "presets" / "qwen2.5-7b-dapo-math.yaml")
    form = tab.fill(spec)
    out = tab.on_preview("qwen2.5-7b-dapo-math", "en", *form)
    assert len(out) == 2 + len(tab.exports.outputs)
    assert is_update(out[0], visible=True) and out[1] == ""
    row, swift_text, swift_lost, trl_text, trl_lost = out[2:]
    assert is_update(row, visible=True)
    assert swift_text == export_swift(spec).text and trl_text == export_trl(spec).text
    assert "swift rlhf" in swift_text and "model_name_or_path: Qwen/Qwen2.5-7B-Instruct" in trl_text
    assert "`resources.rollout_gpus`" in swift_lost and "`algorithm.dynamic_sampling`" in trl_lost
    assert "`algorithm.dynamic_sampling`" not in swift_lost  # ms-swift has dynamic_sample
    # the text the pane shows imports back to the form's spec, but for what is listed
    assert import_any(swift_text).apply().algorithm.epsilon_high == 0.28


def test_an_invalid_form_hides_the_exports(tab):
    form = tab.fill(RunSpec())
    form[[f.path for f in fields()].index("rollout.num_generations")] = 1  # below the bound
    out = tab.on_preview("", "en", *form)
    assert out[1].startswith("⚠") and is_update(out[2], visible=False)
    assert export_updates(None, "en")[0] == gr.update(visible=False)


def test_the_lists_name_every_field_lost_or_say_none_is():
    spec = RunSpec.model_validate({"data": {"prompt_template": "Add {a} and {b}."}})
    md = lost_md(export_swift(spec), "en")
    assert "`data.prompt_template`" in md and "ms-swift cannot express" in md
    full = export_swift(RunSpec.model_validate({"output": {"log_samples_steps": 1}}))
    assert full.inexpressible == [] and lost_md(full, "zh").startswith("ms-swift 可以表达")


def test_undo_restores_the_form_from_before_the_import(tab):
    assert tab.undo.button.elem_id == "import-undo-btn" and tab.undo.button.interactive is False
    n = len(fields())
    paths = [f.path for f in fields()]
    before = tab.fill(RunSpec())
    run = undoable_import(tab.on_import)
    out = run(SWIFT_CMD, "en", None, *before)
    message, form, kept, button = out[0], out[1:1 + n], out[1 + n], out[2 + n]
    assert "Imported" in message and form[paths.index("model.name_or_path")] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert kept == before and is_update(button, interactive=True)
    back = undo_import("en", kept, n)
    assert back[1:1 + n] == before and back[1 + n] is None and is_update(back[2 + n], interactive=False)
    assert "undone" in back[0]
    # nothing left to undo: the button stays off and the form untouched
    again = undo_import("en", None, n)
    assert all(is_update(v) for v in again[1:1 + n]) and is_update(again[2 + n], interactive=False)


def test_a_failed_import_keeps_what_there_was_to_undo(tab):
    n = len(fields())
    before = tab.fill(RunSpec())
    run = undoable_import(tab.on_import)
    out = run("", "en", None, *before)  # nothing to import: no field changes
    assert out[1 + n] is None and is_update(out[2 + n], interactive=False)
    earlier = list(before)
    out = run("not a config at all", "en", earlier, *before)
    assert out[0].startswith("⚠") and out[1 + n] is earlier and is_update(out[2 + n], interactive=True)
