"""One evaluation: a model on a data set, n samples per prompt, scored by reward functions.

Writes into its output folder (RUN_DIR/eval/<eval_id>/ by default, see `default_out_dir`):
  status.json    state (running, finished, failed), pid, prompts done/total, samples/s, ETA; rewritten
                 atomically after every batch, so the studio shows progress by reading one file
  results.json   the settings, metrics (backend/eval/metrics.py), per-function means, thinking metrics
  samples.jsonl  one row per sample: prompt index, sample index, prompt, completion, solution,
                 extracted answer, correct, reward (weighted total), rewards per function, tokens,
                 truncated, thinking metrics; for multimodal rows also images / videos / audios, the media
                 references as the trainer's samples record them (backend.multimodal.media_ref)
Multimodal models and runs (images, videos, audio columns) go through the trainer's own code: the model class
of backend.models.model_class, the processor of backend.models.load_media_processor and
backend.multimodal.render_mm_prompt, with media paths resolved against the directory the trainer resolves
them against (the run's launch directory; for --data, base_dir). The media column is the run's
(data.images_column ...), else --images-column / --videos-column / --audios-column, else, for a
vision-language (audio-language) model, an `images` or `image` (`audios` or `audio`) column of the data.
Only the transformers engine takes media here.
Prompts are sampled in fixed batches with seeds derived from `seed` and the batch index, so two models
evaluated with the same data, batch size and seed see the same prompts in the same order (what
compare.py lines up).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backend.agent import Agent, context_window
from backend.agent.episodes import episode_metrics, sample_fields, score_inputs
from backend.data import load_rows, render_prompt
from backend.eval.benchmarks import Benchmark, load_benchmark, math_answer, parse_data_ref, plain_answer
from backend.eval.metrics import PromptResult, summarize
from backend.eval.options import EvalConfig, problems
from backend.eval.refs import ModelChoice, load_model, load_processor, load_tokenizer, model_config, resolve_model
from backend.eval.thinking import ThinkingStats, summarize_thinking, thinking_stats
from backend.multimodal import MediaError, is_audio_config, is_vision_config, media_ref, render_mm_prompt
from backend.rewards.scorer import RewardScorer
from backend.rewards.worker import WorkerError
from backend.rollout.base import PromptInput, RolloutEngine, SamplingParams
from backend.rundir import CORRECTNESS_REWARDS, atomic_write_text, read_eval_status
from backend.spec import DataSection, RewardFunction, RewardsSection, ToolsSection


@dataclass
class EvalData:
    label: str
    rows: list[dict[str, Any]]
    data: DataSection
    rewards: RewardsSection
    bench: Benchmark | None
    extract: Callable[[str], str | None]
    media_base: Path = Path(".")  # relative media paths resolve against it, as in training

    @property
    def media_columns(self) -> dict[str, str]:
        """kind ('images', 'videos', 'audios') -> column, for the media columns in use."""
        d = self.data
        return {k: c for k, c in (("images", d.images_column), ("videos", d.videos_column), ("audios", d.audios_column)) if c}


class EvalError(ValueError):
    pass


def resolve_data(cfg: EvalConfig, choice: ModelChoice) -> EvalData:
    base_dir = Path(cfg.base_dir)
    spec = choice.spec
    if cfg.data:
        bench, path = parse_data_ref(cfg.data)
    elif spec is not None and spec.data.eval_sources:
        bench, path = None, ""
    else:
        raise EvalError("--data is required (the model is not a run with data.eval_sources)")
    if bench is not None:
        data = DataSection(prompt_column="prompt", solution_column="solution", system_prompt=cfg.system_prompt)
        rows = load_benchmark(bench, path, base_dir)
        rewards = RewardsSection(functions=[RewardFunction(name=bench.reward)])
        label, extract = bench.name, bench.extract_answer
    else:
        if spec is not None:
            data = spec.data.model_copy(update={"limit": 0})
            rewards = spec.rewards
            rbase = choice.base_dir
        else:
            data, rewards, rbase = DataSection(), RewardsSection(functions=[RewardFunction(name="accuracy")]), base_dir
        if cfg.system_prompt:
            data = data.model_copy(update={"system_prompt": cfg.system_prompt})
        if cfg.prompt_column:
            data = data.model_copy(update={"prompt_column": cfg.prompt_column})
        sources = [path] if path else list(spec.data.eval_sources)  # type: ignore[union-attr]
        rows = load_rows(sources, data, 0, base_dir if path else rbase)
        label = Path(sources[0].split("#")[0]).stem if len(sources) == 1 else "eval_sources"
        names = [f.name for f in rewards.functions]
        extract = math_answer if "accuracy" in names else plain_answer
        data = _media_data(cfg, choice, data, rows)
    if cfg.rewards:
        rewards = RewardsSection(functions=[RewardFunction(name=n) for n in cfg.rewards], plugins=rewards.plugins)
    if cfg.limit:
        rows = rows[: cfg.limit]
    if not rows:
        raise EvalError(f"data {cfg.data or 'eval_sources'}: no rows")
    media_base = base_dir if bench is not None or path else choice.base_dir
    return EvalData(label, rows, data, rewards, bench, extract, media_base)


def _media_data(cfg: EvalConfig, choice: ModelChoice, data: DataSection, rows: list[dict[str, Any]]) -> DataSection:
    """The data section with its media columns: given ones win over the run's; with none at all, a multimodal model
    takes the data's `images`/`image` (`audios`/`audio`) column when there is one."""
    given = {f"{k}_column": getattr(cfg, f"{k}_column") for k in ("images", "videos", "audios")}
    data = data.model_copy(update={k: v for k, v in given.items() if v})
    columns = set(rows[0]) if rows else set()
    for fld, col in given.items():
        if col and col not in columns:
            raise EvalError(f"--{fld.replace('_', '-')} {col!r}: no such column in the data (columns: {sorted(columns)})")
    if data.images_column or data.videos_column or data.audios_column:
        return data
    try:
        mcfg = model_config(choice)
    except (OSError, ValueError):
        return data  # not a local transformers model: loading it reports why
    kind = "images" if is_vision_config(mcfg) else "audios" if is_audio_config(mcfg) else ""
    found = next((c for c in (kind, kind[:-1]) if kind and c in columns), "")
    return data.model_copy(update={f"{kind}_column": found}) if found else data


def correctness_index(names: list[str], wanted: str) -> int:
    """Which reward function decides correctness: `wanted`, else the first correctness built-in, else the first."""
    if wanted:
        if wanted not in names:
            raise EvalError(f"--correct {wanted!r} is not among the reward functions {names}")
        return names.index(wanted)
    return next((names.index(n) for n in CORRECTNESS_REWARDS if n in names), 0)


def candidate_matches(candidate: str, gold: Any) -> bool:
    """The rule for an intermediate answer: equal after removing spaces, commas and $, or equal numbers."""
    def norm(s: str) -> str:
        return re.sub(r"[\s,$]", "", s)
    c, g = norm(str(candidate)), norm(str(gold))
    if c == g:
        return True
    try:
        from fractions import Fraction
        return Fraction(c) == Fraction(g)
    except (ValueError, ZeroDivisionError):
        return False


def open_engine(cfg: EvalConfig, choice: ModelChoice, tokenizer: Any) -> RolloutEngine:
    """An engine behind the RolloutEngine interface. hf loads the weights here. vllm and lmdeploy are built
    by the rollout package's engine factory, `backend.rollout.worker.build_engine(WorkerConfig(...))`, in this
    process; they load merged weights from a folder, so an adapter is first merged into a temporary one."""
    if cfg.engine == "hf":
        from backend.rollout.hf import HFEngine

        return HFEngine(load_model(choice, cfg.device), tokenizer)
    import importlib
    import importlib.util

    if importlib.util.find_spec(cfg.engine) is None:
        raise EvalError(f"--engine {cfg.engine}: the {cfg.engine} package is not installed here (use --engine hf)")
    try:
        worker = importlib.import_module("backend.rollout.worker")
        build, make_cfg = worker.build_engine, worker.WorkerConfig
    except (ImportError, AttributeError) as err:
        raise EvalError(f"--engine {cfg.engine}: this checkout has no engine factory "
                        f"(backend.rollout.worker.build_engine): {err}") from None
    path = choice.weights
    if choice.is_adapter:
        import tempfile

        from backend.eval.export import export_model

        path = export_model(choice, Path(tempfile.mkdtemp(prefix="grpo-eval-merged-"))).path
    spec = choice.spec
    return build(make_cfg(engine=cfg.engine, model=str(path), device="cpu" if cfg.device == "cpu" else "cuda",
                          seed=cfg.seed, dtype=spec.model.dtype if spec else "auto",
                          trust_remote_code=bool(spec and spec.model.trust_remote_code)))


def default_out_dir(choice: ModelChoice, data_label: str, base_dir: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^\w.-]+", "-", f"{choice.label}-{data_label}")[:60]
    root = choice.run.eval_dir if choice.run is not None else base_dir / "evals"
    out = root / f"{stamp}-{name}"
    k = 1
    while out.exists():
        k += 1
        out = root / f"{stamp}-{name}-{k}"
    return out


class Progress:
    """status.json of an eval folder, rewritten atomically; plus a log line per update."""

    def __init__(self, out: Path, total: int, info: dict[str, Any]) -> None:
        import psutil

        self.path, self.total, self.t0 = out / "status.json", total, time.time()
        me = psutil.Process()
        self.base = {"pid": os.getpid(), "pid_create_time": me.create_time(), "total": total, **info}
        self.write("running", 0)

    def write(self, state: str, done: int, samples: int = 0, error: str = "") -> None:
        elapsed = time.time() - self.t0
        rate = samples / elapsed if elapsed > 0 else 0.0
        eta = elapsed / done * (self.total - done) if done else None
        st = {**self.base, "state": state, "done": done, "elapsed_s": elapsed, "samples_per_s": rate,
              "eta_s": eta if state == "running" else 0.0, "error": error, "updated_at": time.time()}
        atomic_write_text(self.path, json.dumps(st, indent=1))
        if state == "running" and done:
            eta_s = f"{eta:.0f}s" if eta is not None else "?"
            print(f"eval {done}/{self.total} prompts  {rate:.1f} samples/s  ETA {eta_s}", file=sys.stderr, flush=True)


read_status = read_eval_status  # the studio reads it through backend.rundir


def run_eval(cfg: EvalConfig, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Run the evaluation of the module docstring and return results.json's content."""
    try:
        return _run_eval(cfg, log)
    except BaseException as err:
        # an eval launched with --out (the studio's way) reports even an early failure in its folder
        if cfg.out and not (Path(cfg.out) / "status.json").is_file():
            Path(cfg.out).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(cfg.out) / "status.json", json.dumps(
                {"state": "failed", "pid": os.getpid(), "done": 0, "total": 0, "error": f"{type(err).__name__}: {err}",
                 "updated_at": time.time()}))
        raise


def _run_eval(cfg: EvalConfig, log: Callable[[str], None]) -> dict[str, Any]:
    base_dir = Path(cfg.base_dir)
    bad = problems(cfg)
    if bad:
        raise EvalError("; ".join(bad))
    n = cfg.n or max(cfg.ks)
    choice = resolve_model(cfg.model, base_dir)
    ed = resolve_data(cfg, choice)
    if ed.media_columns and cfg.engine != "hf":
        cols = ", ".join(f"{k} column {c!r}" for k, c in ed.media_columns.items())
        raise EvalError(f"--engine {cfg.engine}: multimodal evaluation ({cols}) runs with --engine hf; "
                        "backend.eval does not pass media to vLLM or LMDeploy")
    out = Path(cfg.out) if cfg.out else default_out_dir(choice, ed.label, base_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = choice.spec
    temperature = cfg.temperature
    if temperature is None:
        temperature = 0.0 if n == 1 else (spec.rollout.temperature if spec else 1.0)
    max_tokens = cfg.max_tokens or (spec.rollout.max_completion_length if spec else 1024)
    settings = {"model": cfg.model, "model_label": choice.label, "weights": str(choice.weights),
                "data": cfg.data or "eval_sources", "data_label": ed.label, "n": n, "ks": sorted(set(cfg.ks)),
                "temperature": temperature, "top_p": cfg.top_p, "top_k": cfg.top_k, "max_tokens": max_tokens,
                "seed": cfg.seed, "batch": cfg.batch, "engine": cfg.engine, "limit": cfg.limit, "out": str(out)}
    progress = Progress(out, len(ed.rows), {"settings": settings, "out": str(out)})
    try:
        results = _evaluate(cfg, choice, ed, out, n, temperature, max_tokens, settings, progress, log)
    except BaseException as err:
        progress.write("failed", 0, error=f"{type(err).__name__}: {err}")
        raise
    return results


def _evaluate(cfg: EvalConfig, choice: ModelChoice, ed: EvalData, out: Path, n: int, temperature: float,
              max_tokens: int, settings: dict[str, Any], progress: Progress, log: Callable[[str], None]) -> dict[str, Any]:
    t_load = time.time()
    tok = load_tokenizer(choice)
    # the trainer's multimodal path: the model's processor renders each row (backend.models, backend.multimodal)
    processor = load_processor(choice, tok, audio="audios" in ed.media_columns) if ed.media_columns else None
    engine = open_engine(cfg, choice, tok)
    scorer = RewardScorer(ed.rewards, base_dir=choice.base_dir if choice.spec else Path(cfg.base_dir))
    judge = None
    if cfg.judge:
        from backend.eval.thinking import LocalJudge

        judge = LocalJudge(cfg.judge, cfg.device)
    load_s = time.time() - t_load
    progress.t0 = time.time()  # rate and ETA from the first batch on (loading is not sampling)
    ci = correctness_index(scorer.names, cfg.correct)
    greedy = temperature == 0
    log(f"evaluating {choice.label} ({choice.weights}) on {ed.label}: {len(ed.rows)} prompts x {n} samples, "
        f"{'greedy' if greedy else f'temperature {temperature}'}, max {max_tokens} tokens, engine {cfg.engine}")

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    agent = _agent(cfg, choice, tok, max_tokens)  # tools: each sample is an episode through the same tool loop
    tools = agent.schemas if agent is not None else None
    episodes: list[Any] = []
    per_prompt: list[PromptResult] = []
    think: list[ThinkingStats | None] = []
    gen_s = score_s = 0.0
    mats: list[np.ndarray] = []
    samples_path = out / "samples.jsonl"
    samples_path.write_text("")
    done = 0
    with scorer, samples_path.open("a") as sf:
        for b, i0 in enumerate(range(0, len(ed.rows), cfg.batch)):
            rows = ed.rows[i0:i0 + cfg.batch]
            if processor is not None:
                mms = [_render_mm(r, ed, processor, i0 + k) for k, r in enumerate(rows)]
                texts, inputs = [m.text for m in mms], [PromptInput(m.ids, m.media) for m in mms]
            else:
                texts = [render_prompt(r, ed.data, tok, tools) for r in rows]
                inputs = [PromptInput(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
            sp = SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0 if greedy else temperature,
                                top_p=1.0 if greedy else cfg.top_p, top_k=1 if greedy else cfg.top_k,
                                seed=cfg.seed * 1_000_003 + b)
            t0 = time.time()
            if agent is None:
                groups = engine.generate(inputs, sp)
            else:
                def reprompt(k: int, observation: str, rows: list[dict[str, Any]] = rows,
                             texts: list[str] = texts) -> PromptInput:
                    texts[k] = render_prompt(rows[k], ed.data, tok, tools, observation)
                    return PromptInput(tok(texts[k], add_special_tokens=False)["input_ids"])

                groups = agent.runner.run(engine, inputs, sp, rows, reprompt)
            gen_s += time.time() - t0
            flat = [c for g in groups for c in g]
            episodes += [c.episode for c in flat]
            rep_rows = [r for r in rows for _ in range(n)]
            t0 = time.time()
            answer_texts, scored_rows, chats = score_inputs(flat, rep_rows)
            mat = scorer.score([t for t in texts for _ in range(n)], answer_texts, scored_rows,
                               [c.token_ids for c in flat], conversations=chats)
            score_s += time.time() - t0
            mats.append(mat)
            totals = np.nansum(mat * scorer.weights[None, :], axis=1)
            for p, (row, text, group) in enumerate(zip(rows, texts, groups, strict=True)):
                sub = mat[p * n:(p + 1) * n]
                correct = [bool(s[ci] >= 1.0 - 1e-6) for s in sub]  # NaN compares False
                answers = [ed.extract(c.episode.final_text if c.episode is not None else c.text) for c in group]
                gold = row.get("solution")
                stats = [thinking_stats(c.text, ok, (lambda a, g=gold: candidate_matches(a, g)) if gold is not None else None,
                                        count, cfg.think_markers,
                                        judge.for_question(text, str(gold)) if judge is not None else None)
                         for c, ok in zip(group, correct, strict=True)]
                think.extend(stats)
                per_prompt.append(PromptResult(correct, answers, [len(c.token_ids) for c in group],
                                               [c.finish_reason == "length" for c in group],
                                               [float(x) for x in totals[p * n:(p + 1) * n]]))
                for j, c in enumerate(group):
                    rec = {"index": i0 + p, "sample": j, "prompt": text, "completion": c.text,
                           "solution": gold if isinstance(gold, (str, int, float)) or gold is None else str(gold),
                           "answer": answers[j], "correct": correct[j], "reward": float(totals[p * n + j]),
                           "rewards": {nm: _num(sub[j, k]) for k, nm in enumerate(scorer.names)},
                           "tokens": len(c.token_ids), "truncated": c.finish_reason == "length",
                           "thinking": stats[j].to_dict() if stats[j] is not None else None}
                    rec.update(sample_fields(c.episode))  # an episode, turn by turn, as in the trainer's samples
                    for kind, col in ed.media_columns.items():  # as the trainer's samples (the studio shows them)
                        rec[kind] = media_ref(row.get(col))
                    sf.write(json.dumps(rec, ensure_ascii=False) + "\n")
            sf.flush()
            done += len(rows)
            progress.write("running", done, done * n)
    engine.close()
    if agent is not None:
        agent.close()
    metrics = summarize(per_prompt, settings["ks"])
    metrics.update(episode_metrics(episodes))  # tools/call_frequency, episode/turns_mean, ... ({} without tools)
    allm = np.concatenate(mats)
    fn_means = {f"rewards/{nm}/mean": None if np.isnan(allm[:, k]).all() else _num(np.nanmean(allm[:, k]))
                for k, nm in enumerate(scorer.names)}
    total = len(ed.rows) * n
    results = {**settings, "correct_function": scorer.names[ci], "metrics": {**metrics, **fn_means},
               "thinking": summarize_thinking(think),
               "timing": {"load_s": load_s, "generate_s": gen_s, "score_s": score_s,
                          "samples_per_s": total / gen_s if gen_s > 0 else None,
                          "samples_per_s_with_scoring": total / (gen_s + score_s) if gen_s + score_s > 0 else None},
               "finished_at": time.time()}
    atomic_write_text(out / "results.json", json.dumps(results, indent=1, ensure_ascii=False))
    progress.write("finished", done, total)
    m = results["metrics"]
    log(f"accuracy {m['accuracy']:.4f}  " + "  ".join(f"pass@{k} {m[f'pass@{k}']:.4f}" for k in settings["ks"])
        + f"  maj@{n} {m[f'maj@{n}']:.4f}  mean length {m['mean_length']:.1f}  truncated {m['truncation_rate']:.3f}"
        + f"  ({results['timing']['samples_per_s'] or 0:.1f} samples/s)")
    log(f"results: {out / 'results.json'}")
    return results


def _agent(cfg: EvalConfig, choice: Any, tok: Any, max_tokens: int) -> Agent | None:
    """The tools of the evaluation: the options', else the evaluated run's tools section; None for none."""
    spec = choice.spec
    if cfg.tools:
        section, base = ToolsSection(functions=list(cfg.tools), files=list(cfg.tool_files)), Path(cfg.base_dir)
        if spec is not None:
            section = spec.tools.model_copy(update={"functions": list(cfg.tools), "files": list(cfg.tool_files),
                                                    "environment": ""})
    elif spec is not None and spec.tools.enabled:
        section, base = spec.tools, choice.base_dir
    else:
        return None
    turns = cfg.max_turns or (spec.rollout.max_turns if spec is not None else 5)
    try:
        try:
            context = context_window(model_config(choice))
        except (OSError, ValueError):
            context = None
        kwargs = dict(spec.data.chat_template_kwargs) if spec is not None else None  # as the run rendered them
        return Agent(section, tok, base, turns, max_tokens, kwargs, context=context)
    except WorkerError as err:
        raise EvalError(str(err)) from None


def _render_mm(row: dict[str, Any], ed: EvalData, processor: Any, index: int) -> Any:
    """backend.multimodal.render_mm_prompt, its MediaError naming the row and the media column(s)."""
    try:
        return render_mm_prompt(row, ed.data, processor, ed.media_base)
    except MediaError as err:
        cols = ", ".join(f"{c!r}" for c in ed.media_columns.values())
        raise EvalError(f"row {index} (column {cols}): {err}") from None


def _num(x: Any) -> float | None:
    v = float(x)
    return None if math.isnan(v) else v
