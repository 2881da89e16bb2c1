"""python -m backend.rewards check --spec RUN.yaml [--plugin FILE] [--rows N] [--completions solution,model]

Scores N dataset rows with the spec's reward functions and prints a per-function table. Exit status:
0 all functions scored, 1 some function failed (its error is printed), 2 the spec or data is unusable.
`python -m backend.rewards list` prints the built-in rewards with their formulas and parameters.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from backend.checks import check_spec
from backend.rewards.check import SOURCES, format_table, run_check
from backend.rewards.registry import BUILTIN_REWARDS
from backend.spec import SpecError, load_spec


def _list() -> int:
    for name, b in sorted(BUILTIN_REWARDS.items()):
        print(f"{name}\n  " + b.doc.replace("\n", "\n  "))
        for pname, f in b.params_model.model_fields.items():
            default = "required" if f.is_required() else f"default {f.default!r}"
            print(f"  - {pname} ({default}): {f.description or ''}")
        print()
    return 0


def _check(args: argparse.Namespace) -> int:
    base = Path(args.base_dir)
    try:
        spec = load_spec(args.spec, args.set)
    except SpecError as err:
        print(err, file=sys.stderr)
        return 2
    checked = spec.model_copy(deep=True)
    checked.rewards.plugins = [*spec.rewards.plugins, *(p for p in args.plugin if p not in spec.rewards.plugins)]
    # only what scoring needs: a missing model directory matters to training, not here
    issues = [i for i in check_spec(checked, base) if i.field.split(".")[0] in ("rewards", "data")]
    if issues:
        print("\n".join(f"spec: {i}" for i in issues), file=sys.stderr)
        return 2
    sources = [s.strip() for s in args.completions.split(",") if s.strip()]
    try:
        result = run_check(spec, rows=args.rows, plugin=args.plugin, completions=sources, template=args.template,
                           base_dir=base, device=args.device)
    except Exception as err:  # data that cannot be read, a model that does not load, a worker that cannot start
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"functions": result.functions, "samples": result.samples}, default=str, indent=1))
    else:
        print(format_table(result.functions))
        for s in result.samples[: args.show]:
            scores = ", ".join(f"{k}={'-' if v is None else f'{v:.3g}'}" for k, v in s["rewards"].items())
            print(f"\n[{s['source']}] {s['prompt']!r} -> {s['completion']!r}\n  {scores}")
    return 1 if any(f["errors"] for f in result.functions) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backend.rewards", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="score dataset rows with the spec's rewards and print a table")
    c.add_argument("--spec", required=True, help="RunSpec YAML (a preset or a run's spec.yaml)")
    c.add_argument("--plugin", action="append", default=[], help="extra plugin file; its reward functions are "
                                                                  "scored too (repeatable)")
    c.add_argument("--rows", type=int, default=8, help="dataset rows to score (default 8)")
    c.add_argument("--completions", default="solution",
                   help=f"comma-separated sources among {', '.join(SOURCES)} (model samples from the spec's model)")
    c.add_argument("--template", default="{solution}",
                   help="solution completions: str.format over the row, "
                        "e.g. '<think>.</think><answer>{solution}</answer>'")
    c.add_argument("--set", action="append", default=[], help="override a spec field: section.field=value")
    c.add_argument("--base-dir", default=".", help="directory relative paths in the spec start from")
    c.add_argument("--device", default="cpu", help="device for reward models and model completions")
    c.add_argument("--show", type=int, default=3, help="print this many scored samples")
    c.add_argument("--json", action="store_true", help="print the results as JSON")
    sub.add_parser("list", help="list the built-in reward functions")
    args = ap.parse_args(argv)
    return _list() if args.cmd == "list" else _check(args)


if __name__ == "__main__":
    sys.exit(main())
