"""`python -m backend.eval`: evaluate a model, a checkpoint or a run on held-out data or a benchmark.

    python -m backend.eval --model runs/<id>[:STEP|:base] [--data FILE|NAME|NAME=FILE] [--k 1,4] [--n 8]
    python -m backend.eval --model assets/tiny-add --data assets/data/add_test.jsonl --rewards exact_match
    python -m backend.eval --model runs/<id> --data gsm8k=~/data/gsm8k/test.parquet --k 1,8 --max-tokens 1024
    python -m backend.eval --model assets/tiny-vl --data assets/data/count_test.jsonl \\
        --prompt-column problem --rewards counting,format

Results go to RUN_DIR/eval/<id>/ (or --out): results.json, samples.jsonl, status.json (progress).
Named formats: gsm8k, math500, aime, gpqa (see backend/eval/benchmarks.py); a bare name uses the tiny
sample of that format shipped in assets/bench/. Exit status: 0 done, 2 bad arguments, 1 failed.
"""

from __future__ import annotations

import argparse
import json
import sys

from backend.eval import options
from backend.eval.options import EvalConfig
from backend.eval.refs import ModelRefError
from backend.eval.run import EvalError, run_eval


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m backend.eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_arguments(ap)
    return ap


def config(a: argparse.Namespace, model: str | None = None, out: str | None = None) -> EvalConfig:
    """The EvalConfig of parsed arguments (also backend.eval.compare's, per model and output folder)."""
    override = {k: v for k, v in (("model", model), ("out", out)) if v is not None}
    return options.from_namespace(a, **override)


def main(argv: list[str] | None = None) -> int:
    cfg = config(parser().parse_args(argv))
    bad = options.problems(cfg)
    if bad:
        for b in bad:
            print(f"error: {b}", file=sys.stderr)
        return 2
    try:
        res = run_eval(cfg)
    except (EvalError, ModelRefError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"out": res.get("out", ""), **res["metrics"]}, indent=1))
    return 0
