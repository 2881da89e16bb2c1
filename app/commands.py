"""Presets, exported YAML and the equivalent command line: pure file helpers for the Build tab."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from app.form import changed_fields
from backend.launcher import training_command
from backend.spec import RunSpec, load_spec

DEFAULT_PRESET = "tiny-cpu"
_PRESET_NAME = re.compile(r"^[A-Za-z0-9][\w.-]{0,63}$")


def list_presets(presets_dir: str | Path) -> list[str]:
    d = Path(presets_dir)
    names = sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []
    if DEFAULT_PRESET in names:  # the one that runs anywhere comes first
        names.remove(DEFAULT_PRESET)
        names.insert(0, DEFAULT_PRESET)
    return names


def preset_path(presets_dir: str | Path, name: str) -> Path:
    if not _PRESET_NAME.match(name or ""):
        raise ValueError("preset names use letters, digits, '.', '-' and '_' (at most 64)")
    return Path(presets_dir) / f"{name}.yaml"


def load_preset(presets_dir: str | Path, name: str) -> RunSpec:
    return load_spec(preset_path(presets_dir, name))


def save_preset(presets_dir: str | Path, name: str, spec: RunSpec, overwrite: bool = False) -> Path:
    path = preset_path(presets_dir, name)
    if path.exists() and not overwrite:
        raise FileExistsError(f"preset {name} exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Saved from GRPO Studio.\n{spec.to_yaml()}")
    return path


def _yaml_value(v: object) -> str:
    # JSON is valid YAML and unambiguous for the CLI's YAML parsing of --set values
    return v if isinstance(v, str) and v and not re.search(r"[\s:#\[\]{},'\"]", v) and not _looks_typed(v) \
        else json.dumps(v, ensure_ascii=False)


def _looks_typed(s: str) -> bool:
    """Strings YAML would read as another type ('true', '1e-4', 'null') must be quoted."""
    import yaml

    try:
        return not isinstance(yaml.safe_load(s), str)
    except yaml.YAMLError:
        return True


def train_command(spec: RunSpec, preset: str = "", presets_dir: str | Path = "presets") -> str:
    """The CLI that starts the same run: `python -m backend.train --config PRESET --set ...` for the
    fields that differ from the preset (or from the defaults when there is no preset)."""
    base_args: list[str]
    if preset:
        try:
            base = load_preset(presets_dir, preset)
            base_args = ["--config", str(Path(presets_dir) / f"{preset}.yaml")]
        except Exception:
            base, base_args = RunSpec(), []
    else:
        base, base_args = RunSpec(), []
    diff = changed_fields(spec, base)
    args = ["python", "-m", "backend.train", *base_args]
    for path, value in diff.items():
        args += ["--set", f"{path}={_yaml_value(value)}"]
    lines = [" ".join(shlex.quote(a) for a in args[:3 + len(base_args)])]
    for i in range(3 + len(base_args), len(args), 2):
        lines.append(f"  {args[i]} {shlex.quote(args[i + 1])}")
    command = " \\\n".join(lines)
    res = spec.resources
    if res.world_size > 1:  # the trainer then supervises its ranks, started as:
        ranks = " ".join(shlex.quote(a) for a in training_command(spec))
        command += (f"\n# {res.world_size} training ranks ({res.nnodes} node(s) x {res.ranks_per_node}"
                    + (f", DeepSpeed ZeRO-{res.deepspeed_stage}" if res.deepspeed_stage else "") + f"), started as:\n# {ranks}")
    return command


def export_yaml(spec: RunSpec, out_dir: str | Path, name: str = "runspec") -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^\w.-]+", "-", name).strip("-") or "runspec"
    path = out / f"{safe}.yaml"
    path.write_text(spec.to_yaml())
    return path
