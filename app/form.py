"""The pure form <-> RunSpec mapping (no Gradio here, so it is unit-testable field by field).

Every form field is a `FieldDoc` from `backend.spec.iter_fields()`; this module says which widget
value represents it and converts both ways:

  kind          widget value
  bool          bool (checkbox)
  int, float    number
  str, choice   str
  multichoice   list[str] (checkbox group)
  list          str, items separated by commas or new lines ("0, 1" -> [0, 1] for int lists)
  dict          JSON / YAML text
  rewards       rows [[name, weight, params-as-JSON], ...] (an editable table)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, get_args

import yaml

from backend.checks import check
from backend.spec import FieldDoc, RunSpec, SpecError, SpecIssue, iter_fields, spec_from_dict
from backend.workspace import Workspace

REWARD_HEADERS = ["name", "weight", "params"]


@cache
def fields() -> tuple[FieldDoc, ...]:
    return tuple(iter_fields())


def field_paths() -> list[str]:
    return [f.path for f in fields()]


def field_doc(path: str) -> FieldDoc:
    for f in fields():
        if f.path == path:
            return f
    raise KeyError(path)


@cache
def list_item_type(path: str) -> type:
    """The element type of a list field (int for GPU indices, str otherwise), read from the model."""
    section, name = path.split(".")
    ann = RunSpec.model_fields[section].annotation.model_fields[name].annotation  # type: ignore[union-attr]
    args = get_args(ann)
    return args[0] if args and args[0] in (int, float, str) else str


# ----------------------------------------------------------------------------- spec value -> widget value

def to_widget(doc: FieldDoc, value: Any) -> Any:
    k = doc.kind
    if k == "list":
        return ", ".join(str(v) for v in value or [])
    if k == "multichoice":
        return list(value or [])
    if k == "dict":
        return json.dumps(value or {}, ensure_ascii=False)
    if k == "rewards":
        rows = []
        for fn in value or []:
            d = fn.model_dump() if hasattr(fn, "model_dump") else dict(fn)
            params = d.get("params") or {}
            rows.append([d.get("name", ""), d.get("weight", 1.0), json.dumps(params, ensure_ascii=False) if params else ""])
        return rows
    return value


def spec_to_values(spec: RunSpec) -> dict[str, Any]:
    """Widget values for every field, keyed by 'section.field'."""
    out = {}
    for doc in fields():
        section, name = doc.path.split(".")
        out[doc.path] = to_widget(doc, getattr(getattr(spec, section), name))
    return out


# ----------------------------------------------------------------------------- widget value -> spec value

class FieldValueError(ValueError):
    pass


def _split_items(text: Any) -> list[str]:
    if isinstance(text, (list, tuple)):
        return [str(t).strip() for t in text if str(t).strip()]
    parts = str(text or "").replace("\n", ",").split(",")
    return [p.strip() for p in parts if p.strip()]


def _parse_structured(text: str) -> Any:
    """JSON first (what the table shows), YAML as the friendlier fallback ('k: 1')."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise FieldValueError(f"not JSON or YAML: {err}") from None


def _number(value: Any, kind: str) -> int | float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise FieldValueError("a number is required")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise FieldValueError(f"{value!r} is not a number") from None
    if math.isnan(x) or math.isinf(x):
        raise FieldValueError("a finite number is required")
    if kind == "int":
        if x != int(x):
            raise FieldValueError(f"{value} is not a whole number")
        return int(x)
    return x


def _reward_rows(value: Any) -> list[dict[str, Any]]:
    if hasattr(value, "values") and hasattr(value, "columns"):  # a pandas DataFrame, if a caller passes one
        value = value.values.tolist()
    out = []
    for i, row in enumerate(value or []):
        row = list(row) + [None] * (3 - len(row))
        name = str(row[0] or "").strip()
        if not name and not str(row[2] or "").strip():
            continue  # a blank row left by the table editor
        if not name:
            raise FieldValueError(f"row {i + 1}: name is empty")
        weight_raw = row[1]
        try:
            weight = 1.0 if weight_raw in (None, "") else float(weight_raw)
        except (TypeError, ValueError):
            raise FieldValueError(f"row {i + 1} ({name}): weight {weight_raw!r} is not a number") from None
        params_text = str(row[2] or "").strip()
        params = _parse_structured(params_text) if params_text else {}
        if not isinstance(params, dict):
            raise FieldValueError(f"row {i + 1} ({name}): params must be a JSON object like {{\"key\": 1}}")
        out.append({"name": name, "weight": weight, "params": params})
    return out


def from_widget(doc: FieldDoc, value: Any) -> Any:
    k = doc.kind
    if k == "bool":
        return bool(value)
    if k in ("int", "float"):
        return _number(value, k)
    if k in ("str", "choice"):
        return "" if value is None else str(value)
    if k == "multichoice":
        return list(value or [])
    if k == "list":
        items = _split_items(value)
        typ = list_item_type(doc.path)
        if typ is int:
            try:
                return [int(i) for i in items]
            except ValueError:
                raise FieldValueError(f"expected whole numbers separated by commas, got {value!r}") from None
        return items
    if k == "dict":
        text = str(value or "").strip()
        parsed = _parse_structured(text) if text else {}
        if not isinstance(parsed, dict):
            raise FieldValueError("expected a mapping")
        return parsed
    if k == "rewards":
        return _reward_rows(value)
    return value


def values_to_dict(values: dict[str, Any]) -> tuple[dict[str, Any], list[SpecIssue]]:
    """Nested spec dict from widget values, and a per-field issue for each value that cannot be parsed."""
    data: dict[str, dict[str, Any]] = {}
    issues = []
    for doc in fields():
        if doc.path not in values:
            continue  # absent fields keep the model's default
        section, name = doc.path.split(".")
        try:
            data.setdefault(section, {})[name] = from_widget(doc, values[doc.path])
        except FieldValueError as err:
            issues.append(SpecIssue(doc.path, str(err)))
    return data, issues


def values_to_spec(values: dict[str, Any]) -> RunSpec:
    """RunSpec from widget values; raises SpecError naming the fields (parse and model errors)."""
    data, issues = values_to_dict(values)
    if issues:
        raise SpecError(issues)
    return spec_from_dict(data)


# ----------------------------------------------------------------------------- validation

@dataclass
class Validation:
    spec: RunSpec | None
    by_field: dict[str, list[str]] = field(default_factory=dict)
    general: list[str] = field(default_factory=list)
    checked: list[SpecIssue] | None = None  # check(spec)'s own verdict, so the planner need not run it again

    @property
    def ok(self) -> bool:
        return self.spec is not None and not self.by_field and not self.general

    def all_messages(self) -> list[str]:
        return [f"{p}: {m}" for p, ms in self.by_field.items() for m in ms] + list(self.general)


def issue_field(loc: str) -> str:
    """'rewards.functions.0.weight' -> 'rewards.functions': the form field that shows the issue."""
    parts = loc.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else loc


def validate_values(values: dict[str, Any], base_dir: str | Path, workspace: Workspace | None = None) -> Validation:
    """Parse, model-validate, check (confined to `workspace` when given); every message names a field."""
    v = Validation(None)
    paths = set(field_paths())

    def add(issue: SpecIssue) -> None:
        f = issue_field(issue.field)
        if f in paths:
            msg = issue.message
            sub = issue.field[len(f) + 1:]
            if sub:  # keep the row/param position, e.g. '0.weight: ...'
                msg = f"{sub}: {msg}"
            v.by_field.setdefault(f, []).append(msg)
        else:
            v.general.append(str(issue))

    data, parse_issues = values_to_dict(values)
    for i in parse_issues:
        add(i)
    if parse_issues:
        return v
    try:
        spec = spec_from_dict(data)
    except SpecError as err:
        for i in err.issues:
            add(i)
        return v
    # the launcher's own check and confinement: what passes here starts (another interpreter is run at Start only)
    v.checked = check(spec, base_dir, workspace=workspace, run_interpreters=False)
    for i in v.checked:
        add(i)
    v.spec = spec
    return v


def changed_fields(spec: RunSpec, base: RunSpec) -> dict[str, Any]:
    """Fields where `spec` differs from `base`, as JSON-able values (for --set overrides)."""
    a, b = spec.model_dump(mode="json"), base.model_dump(mode="json")
    out = {}
    for doc in fields():
        s, n = doc.path.split(".")
        if a[s][n] != b[s][n]:
            out[doc.path] = a[s][n]
    return out
