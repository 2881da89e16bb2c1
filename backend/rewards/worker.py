"""The reward worker: a separate process that runs reward functions, so user code cannot take the
trainer (or the studio) down.

Parent side, `RewardWorker`: starts `python -m backend.rewards.worker FD` in a new session (its own
process group, so a kill also reaches processes a plugin started), talks over a socket pair with
multiprocessing's Connection (pickled messages), and gives each function `timeout_s` per batch. A
timeout or a dead worker (os._exit, segfault, out-of-memory kill) kills the process group and the
next batch starts a fresh worker, so nothing hangs and one bad batch does not poison the next.
A fresh interpreter (not multiprocessing's spawn) keeps the trainer's __main__ and torch out of it.
Its stdout goes to our stderr, so a plugin's print() cannot corrupt `check --json` output (the
trainer's train.log holds both streams anyway); its stdin is empty, so input() cannot hang.

Child side, `main`: loads the plugin files and built-ins named in the init message, then for each
batch runs the requested functions in order and sends one message per function, so the parent can
time and blame functions one by one. When a function raises, the child re-runs it on single samples
(within a small time budget) to name the first sample that fails on its own.

Protocol (tuples): parent -> child ("init", {...}), ("score", batch, [j...], payload), ("stop",);
child -> parent ("ready", pid) | ("init_error", message), then per function
("result", batch, j, scores, seconds) | ("error", batch, j, (message, first failing sample or None), seconds).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from backend.procs import exit_with_group, kill_group, spawn_group, watch_parent

STARTUP_TIMEOUT_S = 60.0  # importing plugins (torch, an API client) can be slow; at least this long to start
ISOLATE_BUDGET_S = 2.0  # time spent finding the first failing sample after an exception


class WorkerError(RuntimeError):
    """The worker could not start (bad plugin file, unknown function, import that hangs)."""


# ----------------------------------------------------------------------------- shared helpers

def describe_exception(err: BaseException) -> str:
    """'ValueError: msg (at plugin.py:12 in fn)', pointing at the innermost frame outside this package."""
    frames = traceback.extract_tb(err.__traceback__)
    here = str(Path(__file__).parent)
    user = [f for f in frames if not f.filename.startswith(here)] or frames
    where = f" (at {Path(user[-1].filename).name}:{user[-1].lineno} in {user[-1].name})" if user else ""
    return f"{type(err).__name__}: {err}{where}"


class _Budget(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Budget()


def first_failing_sample(call: Callable[[dict[str, Any]], Any], kwargs: dict[str, Any], n: int,
                         budget_s: float) -> int | None:
    """Index of the first sample on which `call` raises when given that sample alone, or None when none
    does within the budget (batch-level bugs, or slow functions). Lists of length n are sliced; other
    values pass through. In the main thread an interval timer cuts a call that loops."""
    if n <= 1:
        return 0 if n == 1 else None
    alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    end = time.monotonic() + budget_s
    old = signal.signal(signal.SIGALRM, _on_alarm) if alarm else None
    try:
        for i in range(n):
            left = end - time.monotonic()
            if left <= 0:
                return None
            one = {k: v[i:i + 1] if isinstance(v, list) and len(v) == n else v for k, v in kwargs.items()}
            try:
                if alarm:
                    signal.setitimer(signal.ITIMER_REAL, left)
                call(one)
            except _Budget:
                return None
            except BaseException:
                return i
            finally:
                if alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        if alarm:
            signal.signal(signal.SIGALRM, old)
    return None


def plain_scores(out: Any) -> Any:
    """numpy arrays, tensors and tuples -> a list of Python numbers (picklable, checkable by the parent)."""
    if hasattr(out, "tolist") and not isinstance(out, list):
        out = out.tolist()
    if isinstance(out, tuple):
        out = list(out)
    if isinstance(out, list):
        return [x.item() if hasattr(x, "item") and not isinstance(x, (int, float)) else x for x in out]
    return out


# ----------------------------------------------------------------------------- child process

def _build(init: dict[str, Any]) -> dict[int, tuple[str, Callable[..., Any], dict[str, Any]]]:
    from backend.rewards.plugins import PluginError, check_callable, load_plugin
    from backend.rewards.registry import BUILTIN_REWARDS

    fns: dict[int, tuple[str, Callable[..., Any], dict[str, Any]]] = {}
    plugin_fns: dict[str, Callable[..., Any]] = {}
    if any(f["kind"] == "plugin" for f in init["functions"].values()):
        for i, path in enumerate(init["plugins"]):
            for name, fn in load_plugin(Path(path), i).items():
                plugin_fns.setdefault(name, fn)  # the first file that defines a name wins
    for j, f in init["functions"].items():
        name, params = f["name"], f["params"]
        if f["kind"] == "builtin":
            fns[j] = ("builtin", BUILTIN_REWARDS[name].make(params, init["device"], Path(init["base_dir"])), {})
        else:
            fn = plugin_fns.get(name)
            if fn is None:
                raise PluginError(f"reward {name!r} is not defined in the plugin files {init['plugins']}")
            check_callable(name, fn, params)
            fns[j] = ("plugin", fn, params)
    return fns


def _kwargs(kind: str, params: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    if kind == "builtin":
        return {**payload["columns"], "prompts": payload["prompts"], "completions": payload["completions"]}
    chat = payload.get("chat_prompts")
    prompts = chat if chat is not None else payload["prompts"]
    completions = payload["completions"]
    if payload.get("chat_completions") is not None:  # episodes: the whole conversation (backend.agent)
        completions = payload["chat_completions"]
    elif chat is not None:  # TRL's conversational format
        completions = [[{"role": "assistant", "content": c}] for c in completions]
    return {**payload["columns"], **params, "prompts": prompts, "completions": completions}


def _serve(conn: Connection) -> None:
    from backend.rewards.plugins import call_reward

    init = conn.recv()[1]
    try:
        fns = _build(init)
    except BaseException as err:  # anything a plugin import does, SystemExit included
        conn.send(("init_error", describe_exception(err)))
        return
    for kind, fn, _ in fns.values():  # pay math-verify's imports and sympy's caches before the first batch's clock
        if kind == "builtin":
            try:
                fn(completions=["\\boxed{1}"], prompts=["1"], solution=["1"])
            except Exception:
                pass
    conn.send(("ready", os.getpid()))
    loop = asyncio.new_event_loop()  # one loop for all batches: async clients may keep connections in it
    budget = min(ISOLATE_BUDGET_S, float(init["timeout_s"]) / 4)
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            return
        _, batch, indices, payload = msg
        n = len(payload["completions"])
        for j in indices:
            kind, fn, params = fns[j]
            kwargs = _kwargs(kind, params, payload)
            t0 = time.perf_counter()
            try:
                scores = plain_scores(call_reward(fn, kwargs, loop))
            except BaseException as err:  # SystemExit and KeyboardInterrupt from user code are errors too
                dt = time.perf_counter() - t0
                i = first_failing_sample(lambda kw, fn=fn: call_reward(fn, kw, loop), kwargs, n, budget)
                conn.send(("error", batch, j, (describe_exception(err), i), dt))
                continue
            dt = time.perf_counter() - t0
            try:
                conn.send(("result", batch, j, scores, dt))
            except OSError:  # the pipe is gone: let it end the worker
                raise
            except Exception as err:  # pickling fails before anything is written
                conn.send(("error", batch, j, (f"returned a value that cannot be sent back ({err})", None), dt))


def main(fd: int) -> None:
    conn = Connection(fd)
    watch_parent(os.getppid())  # the trainer died without closing us (SIGKILL, OOM)
    try:
        _serve(conn)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        exit_with_group()  # the parent went away: nobody else will end what a plugin started


# ----------------------------------------------------------------------------- parent side

def exit_reason(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
    return f"exited with code {code}"


class WorkerProcess:
    """The lifecycle both isolated workers share (this one, and the tool worker in backend.agent.worker): a fresh
    interpreter leading its own process group, a socket pair, an "init" message answered by "ready" or
    "init_error" within the startup timeout, kill (the whole group, now) and close (ask, then make sure)."""

    init: dict[str, Any]

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.starts = 0
        self._finalizer: weakref.finalize | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.conn is not None

    def _launch(self, argv: list[str], what: str, loads: str, wait_s: float) -> tuple[Any, ...]:
        """Start `python argv... FD`, send the init message; the "ready" message, or WorkerError saying why not."""
        self.kill()
        parent, child = Pipe(duplex=True)
        fd = child.fileno()
        self.proc = spawn_group([sys.executable, *argv, str(fd)], stdout=2, stderr=None, pass_fds=(fd,))
        child.close()
        self.conn = parent
        self.starts += 1
        self._finalizer = weakref.finalize(self, kill_group, self.proc, 0.0)
        try:
            parent.send(("init", self.init))
            if not parent.poll(wait_s):
                self.kill()
                raise WorkerError(f"{what} did not start within {wait_s:g}s (an import that hangs?)")
            msg = parent.recv()
        except (EOFError, OSError):
            code = self.kill()
            raise WorkerError(f"{what} {exit_reason(code)} while starting") from None
        if msg[0] == "init_error":
            self.kill()
            raise WorkerError(f"{what} could not load {loads}: {msg[1]}")
        return msg

    def kill(self) -> int | None:
        """Kill the worker's process group now; returns its exit code (None if there was none)."""
        code = kill_group(self.proc, grace_s=0.0)
        if self._finalizer is not None:
            self._finalizer.detach()
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn, self._finalizer = None, None, None
        return code

    def close(self) -> None:
        """Ask the worker to stop, then make sure it has (safe to call twice)."""
        if self.alive:
            assert self.conn is not None and self.proc is not None
            try:
                self.conn.send(("stop",))
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


class RewardWorker(WorkerProcess):
    """One worker process for the functions `init["functions"]` ({column index: kind/name/params})."""

    def __init__(self, init: dict[str, Any], timeout_s: float):
        super().__init__()
        self.init = init
        self.timeout_s = float(timeout_s)
        self._batch = 0
        self._last_exit: int | None = None

    def start(self) -> None:
        self._launch(["-m", "backend.rewards.worker"], "reward worker", "the rewards", max(self.timeout_s, STARTUP_TIMEOUT_S))

    def run(self, indices: list[int], payload: dict[str, Any]) -> Iterator[tuple[int, str, Any, float]]:
        """Send the batch now, and return an iterator of (j, outcome, value, seconds) per function in order:
        outcome "result" (value = scores), "error" (value = (message, first failing sample or None)),
        "timeout" or "died" (value = message). After a timeout or death the worker is restarted for the
        functions still pending. Sending before iterating lets the caller work while the worker scores."""
        pending = list(indices)
        return self._collect(pending, payload, self._send(pending, payload) if pending else None)

    def _send(self, pending: list[int], payload: dict[str, Any]) -> tuple[int, float] | None:
        if not self.alive:
            self.start()
        assert self.conn is not None
        self._batch += 1
        try:
            self.conn.send(("score", self._batch, list(pending), payload))
        except OSError:
            self._last_exit = self.kill()
            return None
        return self._batch, time.monotonic()

    def _collect(self, pending: list[int], payload: dict[str, Any],
                 sent: tuple[int, float] | None) -> Iterator[tuple[int, str, Any, float]]:
        while pending:
            if sent is None:
                sent = self._send(pending, payload)
                if sent is None:
                    yield pending.pop(0), "died", f"reward worker {exit_reason(self._last_exit)}", 0.0
                    continue
            batch, t_last = sent
            while pending:
                j = pending[0]
                left = t_last + self.timeout_s - time.monotonic()
                assert self.conn is not None
                try:
                    # a result already waiting counts even if we come late (the caller was busy)
                    msg = self.conn.recv() if self.conn.poll(max(left, 0.0)) else None
                except (EOFError, OSError):
                    code = self.kill()
                    sent = None
                    yield pending.pop(0), "died", f"reward worker {exit_reason(code)}", time.monotonic() - t_last
                    break
                if msg is None:
                    self.kill()
                    sent = None
                    yield pending.pop(0), "timeout", f"timed out after {self.timeout_s:g}s", self.timeout_s
                    break
                kind, b, jj, value, seconds = msg
                if b != batch or jj != j:
                    continue  # left over from an abandoned batch
                pending.pop(0)
                t_last = time.monotonic()
                yield j, kind, value, seconds


if __name__ == "__main__":
    main(int(sys.argv[1]))
