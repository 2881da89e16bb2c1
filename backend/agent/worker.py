"""The environment worker: tools and environment classes run here, in their own process, never in the trainer.

It is the reward worker's kind of process (backend.rewards.worker: a fresh interpreter leading its own process
group, a socket pair, the same exception descriptions and exit reasons), serving a different protocol, so a tool
that crashes or hangs cannot take the trainer down nor hold up reward scoring.

Parent side, `EnvWorker`:
    w = EnvWorker(tools_section, base_dir); w.start()     # loads the files; w.schemas: the tools' JSON schemas
    w.reset([(episode_id, row), ...]) -> [StepResult]       # environment classes only: one instance per episode
    w.step([(episode_id, assistant_message), ...]) -> [StepResult]
    w.end([episode_id, ...]); w.close()

Every call is bounded: each tool call or environment step by `timeout_s` inside the child (an interval timer
interrupts Python code), the whole request by the sum of its items' timeouts plus a margin in the parent. A
request that passes that, or a worker that dies, kills the process group; every item of the request gets an error
result, and the next request starts a fresh worker. Instances of an environment class die with their worker, so
their episodes end (`StepResult.lost`).

Protocol (pickled tuples; the child is ours, run from the project's own code): parent -> child ("init", {...}),
("reset", batch, items), ("step", batch, items), ("end", ids), ("stop",); child -> parent ("ready", pid, schemas)
| ("init_error", message), ("done", batch, [result dict per item]).
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from backend.procs import exit_with_group, watch_parent
from backend.rewards.worker import STARTUP_TIMEOUT_S, WorkerProcess, describe_exception, exit_reason

MARGIN_S = 5.0  # the parent's allowance beyond the items' own timeouts (pickling, a slow start of a call)


@dataclass
class StepResult:
    """What the environment said to one episode: new messages for the model, whether the episode is over, a
    reward. `errors` are tool or environment failures (counted; the model sees them as tool messages)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    reward: float | None = None
    calls: int = 0  # tool calls run (or refused) in this step
    errors: list[str] = field(default_factory=list)
    lost: bool = False  # the worker died or timed out: a stateful environment's episode cannot go on
    seconds: float = 0.0


# ----------------------------------------------------------------------------- child process

class _Timeout(BaseException):  # not Exception: a tool's own `except Exception` must not swallow it
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _bounded(timeout_s: float, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) with an interval timer that interrupts it after timeout_s (Python code; a C call that never returns
    is the parent's timeout's to kill)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _text(value: Any, cap: int) -> str:
    """A tool's return value as the text the model reads, cut at `cap` characters (saying so)."""
    if isinstance(value, str):
        s = value
    else:
        try:
            s = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            s = str(value)
    return s if len(s) <= cap else s[:cap] + f"... [cut: {len(s) - cap} more characters]"


def _builtin_tools() -> dict[str, Any]:
    from backend.sandbox import python_tool

    return {"python": python_tool}


def _load(init: dict[str, Any]) -> tuple[dict[str, Any], type | None]:
    from backend.rewards.plugins import load_plugin

    found: dict[str, Any] = {}
    for i, path in enumerate(init["files"]):
        for name, obj in load_plugin(Path(path), 1000 + i).items():
            found.setdefault(name, obj)
    tools: dict[str, Any] = {}
    for name in init["functions"]:
        obj = found.get(name)
        if obj is None and name in ("python",):
            obj = _builtin_tools()[name]
        if obj is None:
            raise ValueError(f"tool {name!r} is not a built-in (python) and is not defined in the tool files "
                             f"{[Path(p).name for p in init['files']]}")
        if inspect.isclass(obj) or not callable(obj):
            raise ValueError(f"tool {name!r} is not a function")
        tools[name] = obj
    env_cls = None
    if init["environment"]:
        env_cls = found.get(init["environment"])
        if env_cls is None or not inspect.isclass(env_cls):
            raise ValueError(f"environment class {init['environment']!r} is not defined in the tool files "
                             f"{[Path(p).name for p in init['files']]}")
        for method in ("reset", "step"):
            if not callable(getattr(env_cls, method, None)):
                raise ValueError(f"environment class {init['environment']!r} has no {method}() method")
    return tools, env_cls


def _schemas(tools: dict[str, Any]) -> list[dict[str, Any]]:
    from transformers.utils import get_json_schema

    out = []
    for name, fn in tools.items():
        try:
            schema = get_json_schema(fn)
        except Exception as err:  # transformers' DocstringParsingException, TypeHintParsingException
            raise ValueError(f"tool {name!r}: {type(err).__name__}: {err} (a tool needs type hints and a docstring "
                             f"with an Args: section)") from None
        schema["function"]["name"] = name
        out.append(schema)
    return out


def _run_calls(tools: dict[str, Any], message: dict[str, Any], timeout_s: float, cap: int) -> dict[str, Any]:
    msgs, errors = [], []
    for call in message.get("tool_calls") or []:
        name, args, err = call["name"], call["arguments"], call.get("error")
        if err is None and name not in tools:
            err = f"unknown tool {name!r} (tools: {', '.join(tools) or 'none'})"
        if err is None:
            try:
                content = _text(_bounded(timeout_s, tools[name], **args), cap)
            except _Timeout:
                err = f"tool {name!r} timed out after {timeout_s:g}s"
            except TypeError as e:  # bad or missing arguments
                err = f"bad arguments for {name!r}: {e}"
            except BaseException as e:  # SystemExit from user code is an error too
                err = f"tool {name!r} raised {describe_exception(e)}"
        msg = {"role": "tool", "name": name or "unknown", "content": content if err is None else json.dumps({"error": err})}
        if err is not None:
            errors.append(err)
            msg["error"] = err  # for the episode's record; taken off before the message reaches the template
        msgs.append(msg)
    return {"messages": msgs, "done": False, "reward": None, "calls": len(msgs), "errors": errors}


def _env_result(out: Any, cap: int) -> dict[str, Any]:
    """An environment's step() return: a dict, or (observation, done[, reward])."""
    if isinstance(out, tuple):
        out = dict(zip(("observation", "done", "reward"), out))
    if not isinstance(out, dict):
        raise TypeError(f"step() returned {type(out).__name__}; expected a dict with observation, done, reward")
    obs, reward = out.get("observation"), out.get("reward")
    if reward is not None:
        reward = float(reward)
    if obs is None:
        msgs = []
    elif isinstance(obs, list):
        msgs = [{"role": m.get("role", "user"), "content": _text(m.get("content", ""), cap),
                 **({"name": m["name"]} if "name" in m else {})} for m in obs]
    else:
        msgs = [{"role": "user", "content": _text(obs, cap)}]
    return {"messages": msgs, "done": bool(out.get("done", False)), "reward": reward, "calls": 0, "errors": []}


def _serve(conn: Connection) -> None:
    init = conn.recv()[1]
    try:
        tools, env_cls = _load(init)
        schemas = _schemas(tools)
    except BaseException as err:
        conn.send(("init_error", describe_exception(err) if not isinstance(err, ValueError) else str(err)))
        return
    conn.send(("ready", os.getpid(), schemas))
    timeout_s, cap = float(init["timeout_s"]), int(init["max_result_chars"])
    envs: dict[int, Any] = {}
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            return
        if msg[0] == "end":
            for eid in msg[1]:
                envs.pop(eid, None)
            continue
        kind, batch, items = msg
        results = []
        for eid, arg in items:
            t0 = time.perf_counter()
            try:
                if kind == "reset":
                    envs[eid] = env_cls()  # type: ignore[misc]
                    obs = _bounded(timeout_s, envs[eid].reset, arg)
                    r = _env_result({"observation": obs, "done": False}, cap)
                elif env_cls is None:
                    r = _run_calls(tools, arg, timeout_s, cap)
                else:
                    r = _env_result(_bounded(timeout_s, envs[eid].step, arg), cap)
            except _Timeout:
                r = {"messages": [], "done": True, "reward": None, "calls": 0,
                     "errors": [f"environment {kind}() timed out after {timeout_s:g}s"]}
            except BaseException as err:
                r = {"messages": [], "done": True, "reward": None, "calls": 0,
                     "errors": [f"environment {kind}() raised {describe_exception(err)}"]}
            r["seconds"] = time.perf_counter() - t0
            results.append(r)
        conn.send(("done", batch, results))


def main(fd: int) -> None:
    conn = Connection(fd)
    watch_parent(os.getppid())
    try:
        _serve(conn)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        exit_with_group()


# ----------------------------------------------------------------------------- parent side

class EnvWorker(WorkerProcess):
    """The tools' or environment's process; see the module docstring."""

    def __init__(self, files: list[str], functions: list[str], environment: str, timeout_s: float,
                 max_result_chars: int):
        super().__init__()
        self.init = {"files": files, "functions": functions, "environment": environment, "timeout_s": timeout_s,
                     "max_result_chars": max_result_chars}
        self.timeout_s = float(timeout_s)
        self.schemas: list[dict[str, Any]] = []
        self._batch = 0
        self._lock = threading.Lock()  # the async rollout thread and the trainer's eval may both run episodes

    @property
    def stateful(self) -> bool:
        return bool(self.init["environment"])

    def start(self) -> None:
        # -c, not -m: the package's __init__ imports this module, and runpy would then run a second copy of it
        msg = self._launch(["-c", "import sys; from backend.agent.worker import main; main(int(sys.argv[1]))"],
                           "the tool worker", "the tools", STARTUP_TIMEOUT_S)
        self.schemas = msg[2]

    def reset(self, items: list[tuple[int, dict[str, Any]]]) -> list[StepResult]:
        return self._request("reset", items)

    def step(self, items: list[tuple[int, dict[str, Any]]]) -> list[StepResult]:
        return self._request("step", items)

    def end(self, episode_ids: list[int]) -> None:
        """Drop the environment instances of finished episodes."""
        if self.stateful and episode_ids and self.conn is not None:
            try:
                self.conn.send(("end", list(episode_ids)))
            except OSError:
                self.kill()

    def _request(self, kind: str, items: list[tuple[int, Any]]) -> list[StepResult]:
        if not items:
            return []
        with self._lock:
            if not self.alive:
                self.start()
            assert self.conn is not None
            self._batch += 1
            calls = sum(max(1, len(m.get("tool_calls") or [])) if isinstance(m, dict) else 1 for _, m in items)
            wait = self.timeout_s * calls + MARGIN_S
            t0 = time.monotonic()
            why = None
            try:
                self.conn.send((kind, self._batch, items))
                while why is None:
                    left = t0 + wait - time.monotonic()
                    if not self.conn.poll(max(left, 0.0)):
                        why = f"timed out after {wait:g}s"
                        break
                    msg = self.conn.recv()
                    if msg[0] == "done" and msg[1] == self._batch:
                        return [StepResult(r["messages"], r["done"], r["reward"], r["calls"], r["errors"],
                                           seconds=r["seconds"]) for r in msg[2]]
            except (EOFError, OSError):
                why = None
            code = self.kill()
            why = why or f"{exit_reason(code)}"
            seconds = time.monotonic() - t0
            return [self._lost(kind, m, f"the tool worker {why}", seconds) for _, m in items]

    def _lost(self, kind: str, message: Any, why: str, seconds: float) -> StepResult:
        """The error result of an item whose request the worker did not answer."""
        calls = message.get("tool_calls") or [] if isinstance(message, dict) and kind == "step" else []
        if calls and not self.stateful:  # stateless tools: answer each call with the error; the episode goes on
            msgs = [{"role": "tool", "name": c["name"] or "unknown", "content": json.dumps({"error": why}), "error": why}
                    for c in calls]
            return StepResult(msgs, False, None, len(calls), [why] * len(calls), seconds=seconds)
        return StepResult([], True, None, 0, [why], lost=True, seconds=seconds)
