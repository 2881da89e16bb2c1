"""Compare evaluations of several models on the same prompts: metrics table, answers side by side,
filters, reward distributions, CSV.

    python -m backend.eval.compare --model RUN:base --model RUN --data FILE [eval options] --out DIR
    python -m backend.eval.compare --evals DIR1 DIR2 ... [--csv FILE]

The first evaluation is the baseline. A prompt counts as *right* for a model when at least half of
its samples are correct (with one sample: that sample is correct). Filters: "base_wrong_other_right"
keeps prompts the baseline gets wrong and some other model gets right; "base_right_other_wrong" the
reverse; "differ" prompts where the models' answers differ. Evaluations line up by prompt index and
must hold the same prompts (the same data, limit and batch; run them with the same seed for
the same sampling).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.rundir import read_json_object, read_jsonl

FILTERS = ("all", "base_wrong_other_right", "base_right_other_wrong", "differ")


class CompareError(ValueError):
    pass


@dataclass
class EvalResult:
    folder: Path
    label: str
    results: dict[str, Any]
    samples: list[dict[str, Any]]

    def by_prompt(self) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        for s in self.samples:
            out.setdefault(int(s["index"]), []).append(s)
        return out


_SAMPLE_TYPES: dict[str, type | tuple[type, ...]] = {"index": int, "prompt": str, "completion": str,
                                                    "reward": (int, float)}  # what compare() reads of a sample


def load_eval(folder: str | Path, label: str = "") -> EvalResult:
    """An evaluation folder's results and samples; CompareError when they are missing or not what an
    evaluation writes (its files are untrusted, as every run-directory file)."""
    folder = Path(folder)
    if not (folder / "results.json").is_file():
        raise CompareError(f"{folder}: no results.json (is the evaluation finished?)")
    results, problem = read_json_object(folder / "results.json")
    if problem or not isinstance(results.get("metrics", {}), dict):
        raise CompareError(f"{folder}/results.json {problem or 'has metrics that are not an object'}")
    samples = read_jsonl(folder / "samples.jsonl")[0]
    for n, sample in enumerate(samples, 1):
        bad = [k for k, want in _SAMPLE_TYPES.items() if not isinstance(sample.get(k), want) or isinstance(sample.get(k), bool)]
        if bad:
            raise CompareError(f"{folder}/samples.jsonl: sample {n} has no valid {', '.join(bad)}")
    label = label or results.get("model_label") or folder.name
    return EvalResult(folder, str(label), results, samples)


@dataclass
class PromptRow:
    index: int
    prompt: str
    solution: Any
    answers: list[str]  # per model: its first sample's completion
    right: list[bool]  # per model: at least half its samples correct
    correct_rate: list[float]
    reward: list[float]  # per model: mean reward over its samples
    images: list[str] = field(default_factory=list)  # the prompt's media references (images, a video's first frame)


@dataclass
class Comparison:
    labels: list[str]
    metric_names: list[str]
    table: list[list[Any]]  # one row per model: label, metrics in metric_names order
    rows: list[PromptRow]
    rewards: list[list[float]]  # per model: every sample's reward (for histograms)

    def filtered(self, which: str) -> list[PromptRow]:
        if which not in FILTERS:
            raise CompareError(f"filter {which!r}: one of {', '.join(FILTERS)}")
        if which == "all":
            return self.rows
        if which == "base_wrong_other_right":
            return [r for r in self.rows if not r.right[0] and any(r.right[1:])]
        if which == "base_right_other_wrong":
            return [r for r in self.rows if r.right[0] and not all(r.right[1:])]
        return [r for r in self.rows if len({a.strip() for a in r.answers}) > 1]

    def to_csv(self, which: str = "all") -> str:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["index", "prompt", "solution", *[f"{lb}:{k}" for lb in self.labels
                                                      for k in ("answer", "right", "correct_rate", "reward")]])
        for r in self.filtered(which):
            cells: list[Any] = []
            for j in range(len(self.labels)):
                cells += [r.answers[j], int(r.right[j]), f"{r.correct_rate[j]:.4f}", f"{r.reward[j]:.4f}"]
            w.writerow([r.index, r.prompt, r.solution, *cells])
        return buf.getvalue()


def table_metrics(evals: list[EvalResult]) -> list[str]:
    keys: list[str] = []
    for e in evals:
        for k in e.results.get("metrics", {}):
            if k not in keys and k not in ("prompts", "samples_per_prompt"):
                keys.append(k)
    return keys


def compare(evals: list[EvalResult]) -> Comparison:
    if len(evals) < 2:
        raise CompareError("compare needs at least two evaluations")
    per = [e.by_prompt() for e in evals]
    idx = sorted(per[0])
    for e, p in zip(evals[1:], per[1:], strict=True):
        if sorted(p) != idx or any(p[i][0]["prompt"] != per[0][i][0]["prompt"] for i in idx):
            raise CompareError(f"{e.label} ({e.folder}) was not evaluated on the same prompts as {evals[0].label}; "
                               f"use the same data, limit and batch")
    rows = []
    for i in idx:
        groups = [p[i] for p in per]
        rates = [sum(bool(s["correct"]) for s in g) / len(g) for g in groups]
        rows.append(PromptRow(i, groups[0][0]["prompt"], groups[0][0].get("solution"),
                              [g[0]["completion"] for g in groups], [r >= 0.5 for r in rates], rates,
                              [sum(s["reward"] for s in g) / len(g) for g in groups],
                              list(groups[0][0].get("images") or []) + list(groups[0][0].get("videos") or [])[:1]))
    names = table_metrics(evals)
    table = [[e.label, *[e.results.get("metrics", {}).get(k) for k in names]] for e in evals]
    return Comparison([e.label for e in evals], names, table, rows, [[s["reward"] for s in e.samples] for e in evals])


def main(argv: list[str] | None = None) -> int:
    from backend.eval.cli import config as eval_config
    from backend.eval.cli import parser as eval_parser
    from backend.eval.run import EvalError, run_eval

    ap = argparse.ArgumentParser(prog="python -m backend.eval.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--evals", nargs="*", default=[], help="finished evaluation folders (the first is the baseline)")
    ap.add_argument("--csv", default="", help="write the side-by-side CSV here (default OUT/compare.csv)")
    ap.add_argument("--filter", default="all", choices=FILTERS)
    a, rest = ap.parse_known_args(argv)
    folders = [Path(f) for f in a.evals]
    out_root = None
    if not folders:
        models, others, it = [], [], iter(rest)
        for tok in it:
            if tok == "--model":
                models.append(next(it, ""))
            elif tok.startswith("--model="):
                models.append(tok.split("=", 1)[1])
            else:
                others.append(tok)
        if len(models) < 2:
            print("error: give --evals DIR DIR ... or at least two --model", file=sys.stderr)
            return 2
        ea = eval_parser().parse_args(["--model", models[0], *others])
        if not ea.out:
            print("error: --out DIR is needed when running the evaluations", file=sys.stderr)
            return 2
        out_root = Path(ea.out)
        for j, m in enumerate(models):
            cfg = eval_config(ea, model=m, out=str(out_root / f"{j}"))
            try:
                run_eval(cfg)
            except (EvalError, ValueError, FileNotFoundError) as err:
                print(f"error: {m}: {err}", file=sys.stderr)
                return 2
            folders.append(out_root / f"{j}")
    try:
        cmp = compare([load_eval(f) for f in folders])
    except CompareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    csv_path = Path(a.csv) if a.csv else (out_root / "compare.csv" if out_root else None)
    if csv_path is not None:
        csv_path.write_text(cmp.to_csv(a.filter))
    print("\t".join(["model", *cmp.metric_names]))
    for row in cmp.table:
        print("\t".join(str(row[0]) if j == 0 else ("" if v is None else f"{v:.4f}") for j, v in enumerate(row)))
    if csv_path is not None:
        print(f"csv: {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
