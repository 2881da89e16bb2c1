"""`python -m backend.eval`: evaluate a model, a checkpoint or a run on held-out data or a benchmark.

    python -m backend.eval --model runs/<id>[:STEP|:base] [--data FILE|NAME|NAME=FILE] [--k 1,4] [--n 8]
    python -m backend.eval --model assets/tiny-add --data assets/data/add_test.jsonl --rewards exact_match
    python -m backend.eval --model runs/<id> --data gsm8k=~/data/gsm8k/test.parquet --k 1,8 --max-tokens 1024
    python -m backend.eval --model assets/tiny-vl --data assets/data/count_test.jsonl \
        --prompt-column problem --rewards counting,format

Results go to RUN_DIR/eval/<id>/ (or --out): results.json, samples.jsonl, status.json (progress).
Named formats: gsm8k, math500, aime, gpqa (see backend/eval/benchmarks.py); a bare name uses the tiny
sample of that format shipped in assets/bench/. Exit status: 0 done, 2 bad arguments, 1 failed.
"""

from __future__ import annotations

import argparse
import json
import sys

from backend.eval.benchmarks import BENCHMARKS
from backend.eval.refs import ModelRefError
from backend.eval.run import ENGINES, EvalConfig, EvalError, run_eval


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,4, got {s!r}") from None


def _names(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m backend.eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model dir, adapter dir, RUN_DIR, RUN_DIR:STEP or RUN_DIR:base")
    ap.add_argument("--data", default="", help=f"data file, or a format name ({', '.join(BENCHMARKS)}) "
                                               "optionally =FILE; default: the run's data.eval_sources")
    ap.add_argument("--k", type=_ints, default=[1], help="pass@k values, e.g. 1,4 (default 1)")
    ap.add_argument("--n", type=int, default=0, help="samples per prompt (default: the largest k)")
    ap.add_argument("--temperature", type=float, default=None,
                    help="0 = greedy; default greedy for n=1, else the run's temperature (or 1.0)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=0, help="default: the run's max_completion_length, else 1024")
    ap.add_argument("--limit", type=int, default=0, help="evaluate the first N prompts only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16, help="prompts per engine call")
    ap.add_argument("--engine", default="hf", choices=ENGINES,
                    help="hf (transformers, here); vllm and lmdeploy where installed (GPU), built by backend.rollout")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    ap.add_argument("--rewards", type=_names, default=[], help="reward functions to score with (default: the "
                                                               "benchmark's, the run's, else accuracy)")
    ap.add_argument("--correct", default="", help="the reward whose score 1 means correct (default: the first of "
                                                  "accuracy, multiple_choice, exact_match, countdown, counting)")
    ap.add_argument("--system-prompt", default="")
    ap.add_argument("--think-markers", type=_names, default=None,
                    help="comma-separated thought-switch markers (default: English and Chinese set)")
    ap.add_argument("--judge", default="", help="local causal LM directory that finds the first correct "
                                                "position in a think block instead of the rule")
    ap.add_argument("--prompt-column", default="", help="the data's prompt column (default: the run's "
                                                         "data.prompt_column, else prompt)")
    for kind, what in (("images", "image"), ("videos", "video"), ("audios", "audio")):
        ap.add_argument(f"--{kind}-column", default="", help=f"the data's {what} column (default: the run's "
                        f"data.{kind}_column, else a column named {kind} or {what} for a model that takes {kind})")
    ap.add_argument("--out", default="", help="output folder (default RUN_DIR/eval/<id>, or ./evals/<id>)")
    return ap


def config(a: argparse.Namespace, model: str | None = None, out: str | None = None) -> EvalConfig:
    """The EvalConfig of parsed arguments (also backend.eval.compare's, per model and output folder)."""
    cfg = EvalConfig(model=a.model if model is None else model, data=a.data, ks=a.k, n=a.n, temperature=a.temperature,
                     top_p=a.top_p, top_k=a.top_k, max_tokens=a.max_tokens, limit=a.limit, seed=a.seed, batch=a.batch,
                     engine=a.engine, device=a.device, rewards=a.rewards, correct=a.correct,
                     system_prompt=a.system_prompt, judge=a.judge, out=a.out if out is None else out,
                     prompt_column=a.prompt_column, images_column=a.images_column, videos_column=a.videos_column,
                     audios_column=a.audios_column)
    if a.think_markers is not None:
        cfg.think_markers = a.think_markers
    return cfg


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    for name, v, lo in (("--n", a.n, 0), ("--max-tokens", a.max_tokens, 0), ("--limit", a.limit, 0),
                        ("--batch", a.batch, 1), ("--top-k", a.top_k, 0)):
        if v < lo:
            print(f"error: {name} must be >= {lo}, got {v}", file=sys.stderr)
            return 2
    if a.temperature is not None and a.temperature < 0:
        print(f"error: --temperature must be >= 0, got {a.temperature}", file=sys.stderr)
        return 2
    if not 0 < a.top_p <= 1:
        print(f"error: --top-p must be in (0, 1], got {a.top_p}", file=sys.stderr)
        return 2
    cfg = config(a)
    try:
        res = run_eval(cfg)
    except (EvalError, ModelRefError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"out": res.get("out", ""), **res["metrics"]}, indent=1))
    return 0
