"""Score completions with the RunSpec's reward functions.

    scorer = RewardScorer(spec.rewards, base_dir, device)
    matrix = scorer.score(prompts, completions, rows)    # (N, F) float32, NaN where a function gave None
    scorer.close()

Where code runs: every plugin function, and the built-ins that call sympy through math-verify
(accuracy, cosine, length: they can take seconds or loop on adversarial input, and would hold the GIL
in the trainer's async rollout thread), run in one reward worker process (worker.py), with `timeout_s`
per function per batch. Cheap string built-ins (exact_match, format, countdown, ...) and reward
models (on the trainer's device) run in the trainer: `python -m bench.rewards` shows the worker's
copy and round trip would cost several times their own work, and under 1% of accuracy's. The worker
scores its functions while the in-process ones run. With isolate_builtins=True everything, reward
models included, runs in the worker: the studio's "Test rewards" uses that, so the UI process never
scores anything itself.

Failures (an exception, a wrong number of scores, NaN/inf or a value beyond float32, a timeout, a worker that died) produce
a message naming the function and the first offending sample. on_error="fail" raises RewardError
with it; on_error="skip" leaves that function's column NaN for the batch, counts the failure in
`error_counts` (the trainer logs rewards/<fn>/errors) and keeps `last_errors[fn]`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from backend.rewards.registry import BUILTIN_REWARDS
from backend.rewards.text import snippet
from backend.rewards.worker import ISOLATE_BUDGET_S, RewardWorker, WorkerError, first_failing_sample
from backend.spec import RewardsSection

log = logging.getLogger(__name__)
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the largest score the (N, F) float32 matrix holds
_NOT_COLUMNS = ("prompt", "prompts", "completion", "completions", "completion_ids")  # as TRL: not passed as columns


class RewardError(RuntimeError):
    pass


def columns_for(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Per-completion rows -> {column: values}, the keyword arguments of a TRL reward function."""
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    return {k: [r.get(k) for r in rows] for k in keys}


def _sample(i: int, completions: list[Any] | None) -> str:
    if completions is None or not 0 <= i < len(completions):
        return f"sample {i}"
    return f"sample {i} (completion {snippet(completions[i])})"


def check_scores(name: str, scores: Any, n: int, completions: list[Any] | None = None) -> list[float]:
    """Validate one function's output: a list of n numbers or None, no NaN or inf. None -> NaN."""
    if not isinstance(scores, (list, tuple)):
        raise RewardError(f"reward {name!r} returned {type(scores).__name__}, expected a list of {n} floats")
    if len(scores) != n:
        first = f"; first unscored: {_sample(len(scores), completions)}" if len(scores) < n else ""
        raise RewardError(f"reward {name!r} returned {len(scores)} scores for {n} completions{first}")
    out = []
    for i, s in enumerate(scores):
        if s is None:
            out.append(math.nan)
            continue
        try:
            v = float(s)
        except (TypeError, ValueError):
            raise RewardError(f"reward {name!r} {_sample(i, completions)}: {s!r} is not a number") from None
        if not math.isfinite(v):
            raise RewardError(f"reward {name!r} {_sample(i, completions)}: {v} is not finite")
        if abs(v) > FLOAT32_MAX:  # the score matrix is float32: it would be inf there
            raise RewardError(f"reward {name!r} {_sample(i, completions)}: {v} is too large (over {FLOAT32_MAX:.3g})")
        out.append(v)
    return out


def _is_chat(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) and "role" in m for m in prompt)


class RewardScorer:
    """Scores batches with the functions of a RewardsSection; see the module docstring."""

    def __init__(self, rewards: RewardsSection, base_dir: Path = Path("."), device: str = "cpu", *,
                 isolate_builtins: bool = False):
        base_dir = Path(base_dir)
        self.names: list[str] = [f.name for f in rewards.functions]
        self.weights = np.array([f.weight for f in rewards.functions], dtype=np.float32)
        self.on_error = rewards.on_error
        self.error_counts: dict[str, int] = {n: 0 for n in self.names}
        self.last_errors: dict[str, str] = {}
        self.last_timings: dict[str, float] = {}  # seconds per function in the last batch
        self.where: list[str] = []  # "trainer" or "worker", per function
        self._local: dict[int, Callable[..., Any]] = {}
        self._worker: RewardWorker | None = None
        self._closed = False
        self._lock = threading.Lock()  # the trainer's async rollout thread and its eval may both score

        plugins = []
        for p in rewards.plugins:
            path = Path(p) if Path(p).is_absolute() else base_dir / p
            if not path.is_file():
                raise RewardError(f"reward plugin file not found: {p}")
            plugins.append(str(path.resolve()))
        remote: dict[int, dict[str, Any]] = {}
        try:
            for j, f in enumerate(rewards.functions):
                b = BUILTIN_REWARDS.get(f.name)
                if b is not None:
                    err = b.check_params(f.params)
                    if err:
                        raise RewardError(f"reward {f.name!r}: {err}")
                    if isolate_builtins or b.isolate:
                        remote[j] = {"kind": "builtin", "name": f.name, "params": f.params}
                    else:
                        try:
                            self._local[j] = b.make(f.params, device, base_dir)
                        except Exception as err:  # a reward model that does not load
                            raise RewardError(f"reward {f.name!r}: {type(err).__name__}: {err}") from err
                elif plugins:
                    remote[j] = {"kind": "plugin", "name": f.name, "params": f.params}
                else:
                    raise RewardError(f"unknown reward {f.name!r} (built-ins: {', '.join(sorted(BUILTIN_REWARDS))}; "
                                      f"no plugin files)")
                self.where.append("worker" if j in remote else "trainer")
            if remote:
                init = {"plugins": plugins, "functions": remote, "device": device, "base_dir": str(base_dir.resolve()),
                        "timeout_s": rewards.timeout_s}
                self._worker = RewardWorker(init, rewards.timeout_s)
                self._worker.start()  # fail at launch, not at step 1, on a broken plugin
        except RewardError:
            self.close()
            raise
        except (WorkerError, OSError, ValueError, ImportError) as err:
            self.close()
            raise RewardError(str(err)) from err

    # ------------------------------------------------------------------------- scoring

    def score(self, prompts: list[Any], completions: list[Any], rows: list[dict[str, Any]],
              completion_ids: list[list[int]] | None = None,
              conversations: list[list[dict[str, Any]]] | None = None) -> np.ndarray:
        """(N, F) float32 scores, NaN where a function returned None or (on_error="skip") failed.
        completion_ids (token ids per completion), when given, reach every function as the TRL column
        `completion_ids`, and length-based built-ins then count tokens instead of characters.
        `conversations` (episodes as chat messages, backend.agent) are what plugins get as `completions`;
        built-ins score `completions` (the final answers)."""
        with self._lock:
            return self._score(prompts, completions, rows, completion_ids, conversations)

    def _score(self, prompts: list[Any], completions: list[Any], rows: list[dict[str, Any]],
               completion_ids: list[list[int]] | None,
               conversations: list[list[dict[str, Any]]] | None = None) -> np.ndarray:
        if self._closed:
            raise RewardError("the reward scorer is closed")
        n = len(completions)
        if len(prompts) != n or len(rows) != n:
            raise ValueError(f"score() needs one prompt and one row per completion: got {len(prompts)} prompts, "
                             f"{n} completions, {len(rows)} rows")
        out = np.full((n, len(self.names)), np.nan, dtype=np.float32)
        if n == 0:
            return out
        cols = columns_for(rows)
        chat = cols.get("prompt") if _is_chat(rows[0].get("prompt")) else None
        for k in _NOT_COLUMNS:
            cols.pop(k, None)
        if completion_ids is not None:
            if len(completion_ids) != n:
                raise ValueError(f"completion_ids has {len(completion_ids)} entries for {n} completions")
            cols["completion_ids"] = [list(ids) for ids in completion_ids]
        prompts, completions = list(prompts), list(completions)

        remote: Iterator[tuple[int, str, Any, float]] | None = None
        done = False
        try:
            if self._worker is not None:  # the worker starts on its functions while the built-ins run here
                idx = [j for j, w in enumerate(self.where) if w == "worker"]
                payload = {"prompts": prompts, "completions": completions, "columns": cols, "chat_prompts": chat,
                           "chat_completions": conversations}
                remote = self._worker.run(idx, payload)
            for j, fn in self._local.items():
                self._settle(j, *self._run_local(fn, prompts, completions, cols), out, completions)
            for j, kind, value, seconds in remote or ():
                self._settle(j, kind, value, seconds, out, completions)
            done = True
        except WorkerError as err:
            raise RewardError(str(err)) from err
        finally:
            if not done and self._worker is not None:
                self._worker.kill()  # it may still be busy with this batch; the next batch restarts it
        return out

    def _run_local(self, fn: Callable[..., Any], prompts: list[Any], completions: list[Any],
                   cols: dict[str, list[Any]]) -> tuple[str, Any, float]:
        kwargs = {**cols, "prompts": prompts, "completions": completions}
        t0 = time.perf_counter()
        try:
            return "result", fn(**kwargs), time.perf_counter() - t0
        except Exception as err:
            from backend.rewards.worker import describe_exception

            seconds = time.perf_counter() - t0
            i = first_failing_sample(lambda kw: fn(**kw), kwargs, len(completions), ISOLATE_BUDGET_S)
            return "error", (describe_exception(err), i), seconds

    def _settle(self, j: int, kind: str, value: Any, seconds: float, out: np.ndarray, completions: list[Any]) -> None:
        name, n = self.names[j], len(completions)
        self.last_timings[name] = seconds
        if kind == "result":
            try:
                out[:, j] = check_scores(name, value, n, completions)
                return
            except RewardError as err:
                msg = str(err)
        elif kind == "error":
            message, i = value
            first = f"; first failing {_sample(i, completions)}" if i is not None else \
                f"; no single sample fails alone (batch of {n})"
            msg = f"reward {name!r} raised {message}{first}"
        else:  # timeout / died: the batch as a whole is to blame
            msg = (f"reward {name!r}: {value} while scoring a batch of {n} completions, "
                   f"first {_sample(0, completions)}; the reward worker was restarted")
        self.error_counts[name] += 1
        self.last_errors[name] = msg
        if self.on_error == "fail":
            raise RewardError(msg)
        log.warning("%s (scored None for this batch; on_error=skip)", msg)

    # ------------------------------------------------------------------------- lifetime

    @property
    def worker_starts(self) -> int:
        """How many times the reward worker process was started (restarts show up here)."""
        return self._worker.starts if self._worker is not None else 0

    def close(self) -> None:
        """Stop the worker process and drop loaded reward models; safe to call twice."""
        self._closed = True
        if self._worker is not None:
            self._worker.close()
        self._local = {}

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
