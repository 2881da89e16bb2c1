"""Form <-> RunSpec mapping: every field round-trips, and validation names the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.form import (
    FieldValueError,
    field_doc,
    fields,
    from_widget,
    spec_to_values,
    to_widget,
    validate_values,
    values_to_spec,
)
from app.locales import UI, field_help, field_label
from app.paths import Workspace
from backend.spec import RunSpec, iter_fields, load_spec

ROOT = Path(__file__).resolve().parent.parent


def other_value(doc):
    """A valid value different from the default, for each kind of field."""
    k, d = doc.kind, doc.default
    if k == "bool":
        return not d
    if k == "int":
        lo = int(doc.minimum) if doc.minimum is not None else 0
        hi = int(doc.maximum) if doc.maximum is not None else d + 10
        return d + 1 if d + 1 <= hi else max(lo, d - 1)
    if k == "float":
        lo = doc.minimum if doc.minimum is not None else 0.0
        hi = doc.maximum if doc.maximum is not None else 10.0
        return round((lo + (hi if hi < 1e6 else lo + 10)) / 2 + 0.0123, 6) if d != (lo + hi) / 2 else lo + 0.5
    if k == "choice":
        return next(c for c in doc.choices if c != d)
    if k == "multichoice":
        return [doc.choices[-1]]
    if k == "list":
        return [1, 3] if doc.path.endswith("_gpus") else ["x/a.jsonl#5", "b"]
    if k == "rewards":
        return [{"name": "exact_match", "weight": 0.5, "params": {"k": 1}}, {"name": "my_fn", "weight": -2.0,
                                                                                "params": {}}]
    if k == "dict":
        return {"a": 1}
    return "some text"


def test_every_spec_field_is_in_the_form():
    assert [f.path for f in fields()] == [f.path for f in iter_fields()]
    values = spec_to_values(RunSpec())
    assert set(values) == {f.path for f in iter_fields()}


@pytest.mark.parametrize("path", [f.path for f in iter_fields()])
def test_each_field_round_trips_a_non_default_value(path):
    doc = field_doc(path)
    section, name = path.split(".")
    value = other_value(doc)
    data = RunSpec().model_dump(mode="json")
    data[section][name] = value
    spec = RunSpec.model_validate(data)
    values = spec_to_values(spec)
    back = values_to_spec(values)
    assert getattr(getattr(back, section), name) == getattr(getattr(spec, section), name)
    assert back == spec


@pytest.mark.parametrize("preset", sorted(p.stem for p in (ROOT / "presets").glob("*.yaml")))
def test_presets_round_trip_through_the_form(preset):
    spec = load_spec(ROOT / "presets" / f"{preset}.yaml")
    assert values_to_spec(spec_to_values(spec)) == spec


def test_widget_parsing():
    assert from_widget(field_doc("resources.train_gpus"), "0, 1\n2") == [0, 1, 2]
    assert from_widget(field_doc("data.sources"), "a.jsonl#10, b.csv") == ["a.jsonl#10", "b.csv"]
    assert from_widget(field_doc("algorithm.max_steps"), 5.0) == 5
    with pytest.raises(FieldValueError):
        from_widget(field_doc("algorithm.max_steps"), 2.5)
    with pytest.raises(FieldValueError):
        from_widget(field_doc("resources.train_gpus"), "0, x")
    rows = [["exact_match", "2", '{"a": 1}'], ["", None, ""], ["digit_match", None, "a: 2"]]
    assert from_widget(field_doc("rewards.functions"), rows) == [
        {"name": "exact_match", "weight": 2.0, "params": {"a": 1}},
        {"name": "digit_match", "weight": 1.0, "params": {"a": 2}}]
    with pytest.raises(FieldValueError):
        from_widget(field_doc("rewards.functions"), [["x", "1", "[1, 2]"]])
    assert to_widget(field_doc("rewards.functions"), [{"name": "a", "weight": 1, "params": {}}]) == [["a", 1, ""]]


def _values(**changes):
    v = spec_to_values(load_spec(ROOT / "presets" / "tiny-cpu.yaml"))
    v["output.runs_dir"] = "runs"
    v.update(changes)
    return v


def test_valid_preset_validates():
    v = validate_values(_values(), ROOT, Workspace(ROOT))
    assert v.ok, v.all_messages()


@pytest.mark.parametrize("changes, field, words", [
    ({"rollout.num_generations": 1}, "rollout.num_generations", "greater than or equal to 2"),
    ({"algorithm.max_steps": "abc"}, "algorithm.max_steps", "not a number"),
    ({"algorithm.gradient_accumulation_steps": 3}, "algorithm.gradient_accumulation_steps", "micro-batches"),
    ({"model.name_or_path": "assets/nope"}, "model.name_or_path", "no such model directory"),
    ({"model.name_or_path": "../../etc"}, "model.name_or_path", "outside the workspace"),
    ({"data.sources": "/etc/passwd.jsonl"}, "data.sources", "outside the workspace"),
    ({"data.prompt_column": "question"}, "data.prompt_column", "not in"),
    ({"rewards.functions": [["no_such_reward", 1, ""]]}, "rewards.functions", "unknown reward"),
    ({"rewards.functions": [["exact_match", "heavy", ""]]}, "rewards.functions", "not a number"),
    ({"rewards.functions": [["exact_match", 1000, ""]]}, "rewards.functions", "0.weight"),
    ({"algorithm.epsilon": 0.3, "algorithm.epsilon_high": 0.1}, "algorithm.epsilon_high", ">= epsilon"),
    ({"output.run_name": "a b/c"}, "output.run_name", "letters"),
])
def test_validation_messages_name_the_field(changes, field, words):
    v = validate_values(_values(**changes), ROOT, Workspace(ROOT))
    assert not v.ok
    assert field in v.by_field, v.all_messages()
    assert any(words in m for m in v.by_field[field]), v.by_field[field]


def test_locales_cover_every_string():
    for key, entry in UI.items():
        assert entry.get("en") and entry.get("zh"), key


def _chinese(text: str) -> bool:
    return any("\u4e00" <= c <= "\u9fff" for c in text)


def test_every_field_has_its_labels_and_chinese_help_beside_its_english():
    docs = iter_fields()
    missing = [f.path for f in docs if not (f.label and f.label_zh and f.help_zh)]
    assert not missing, f"give {missing} json_schema_extra=_ui(label, label_zh, help_zh) in backend/spec.py"
    copied = [f.path for f in docs if f.help_zh == f.help or not _chinese(f.help_zh)]
    assert not copied, f"help_zh of {copied} is not a translation"
    for f in docs:
        assert (field_label(f, "en"), field_label(f, "zh")) == (f.label, f.label_zh)
        assert field_help(f, "en") == f"{f.help} [{f.path}]"
        assert field_help(f, "zh") == f"{f.help_zh} [{f.path}]"  # the option's name is always shown


def test_a_field_without_studio_text_is_shown_by_its_name_and_english_help():
    doc = dataclasses.replace(field_doc("algorithm.max_steps"), label="", label_zh="", help_zh="")
    assert field_label(doc, "en") == field_label(doc, "zh") == "max steps"
    assert field_help(doc, "zh") == f"{doc.help} [algorithm.max_steps]"
    assert field_label(dataclasses.replace(doc, label="Max steps"), "zh") == "Max steps"  # zh falls back to en


def test_the_english_and_chinese_help_give_the_same_numbers_and_dtypes():
    """Issue 29 item 11: the dtype help once said different things in the two languages. A translation may word
    things its own way, but the numbers and the names with digits in them (float32, bfloat16, fp32, AVX512-BF16)
    are the same in both."""
    import re

    def figures(text: str) -> set[str]:
        return {m.lower() for m in re.findall(r"[A-Za-z_]*\d[\w.\-]*\w|\d", text)}

    differ = {f.path: (figures(f.help) ^ figures(f.help_zh)) for f in iter_fields() if f.help_zh}
    differ = {k: v for k, v in differ.items() if v}
    assert not differ, differ
