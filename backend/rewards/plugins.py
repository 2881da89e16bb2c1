"""User reward plugins: Python files whose functions score completions.

A plugin file defines functions with the TRL / open-r1 signature, so existing ones work unchanged:

    def my_reward(completions, prompts=None, solution=None, **kwargs) -> list[float | None]: ...
    async def judged(completions, **kwargs) -> list[float]: ...      # async functions work too

RunSpec names them under rewards.functions (by function name), with the file under rewards.plugins
(a name that is also a built-in's means the built-in; the first file that defines a name wins).
A function may also be registered under another name with the decorator, which also tells
`python -m backend.rewards check --plugin FILE` which functions of the file are rewards:

    from backend.rewards.plugins import reward_function

    @reward_function(name="short_answer")
    def short(completions, **kwargs): ...

Calls are keyword-only, as in TRL: prompts=, completions=, completion_ids= (when the trainer has them),
every dataset column but the prompt, and the RunSpec params of the function (params win over columns).
A function without **kwargs receives only the arguments it names. When the dataset's `prompt` column
holds chat messages, prompts are those messages and each completion is [{"role": "assistant",
"content": text}], exactly as TRL passes them.

Plugin code runs only in the reward worker process (worker.py), never in the trainer or the studio;
this module is imported there to load plugins, and by the studio/spec checks only to read them with ast.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
REWARD_ATTR = "__grpo_reward_name__"
_DECORATORS = {"reward_function", "reward"}


def reward_function(fn: F | None = None, *, name: str | None = None) -> Any:
    """Mark a plugin function as a reward, optionally under another name. Use bare or with name=."""

    def mark(f: F) -> F:
        setattr(f, REWARD_ATTR, name or f.__name__)
        return f

    return mark(fn) if fn is not None else mark


reward = reward_function


# ----------------------------------------------------------------------------- reading without running

def _decorated_name(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        dname = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if dname not in _DECORATORS:
            continue
        if isinstance(d, ast.Call):
            for kw in d.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    return kw.value.value
        return fn.name
    return None


def _takes_completions(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    return any(x.arg == "completions" for x in [*a.posonlyargs, *a.args, *a.kwonlyargs])


def read_plugin(path: str | Path) -> tuple[set[str], dict[str, str]]:
    """(names a RunSpec may use, {reward name: function name} of the file's rewards), read with ast.

    Names: top-level functions, decorator names, and names imported with `from x import y`
    (a plugin may re-export functions from a library). Rewards: the decorated functions if the file
    uses the decorator, else the top-level public functions that take a `completions` argument."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    names: set[str] = set()
    decorated: dict[str, str] = {}
    plain: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            alias = _decorated_name(node)
            if alias is not None:
                names.add(alias)
                decorated[alias] = node.name
            elif not node.name.startswith("_") and _takes_completions(node):
                plain[node.name] = node.name
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names if a.name != "*")
    return names, decorated or plain


def plugin_reward_names(path: str | Path) -> set[str]:
    """Every name a RunSpec may use from this plugin file (for check_spec)."""
    return read_plugin(path)[0]


# ----------------------------------------------------------------------------- loading (worker only)

class PluginError(RuntimeError):
    pass


def load_plugin(path: Path, index: int) -> dict[str, Callable[..., Any]]:
    """Import one plugin file: {name: function} for decorated names first, then every public callable."""
    mod_name = f"grpo_reward_plugin_{index}_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"cannot import plugin {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # so the plugin can import its sibling modules
    spec.loader.exec_module(module)
    found: dict[str, Callable[..., Any]] = {}
    for attr, value in vars(module).items():
        if callable(value) and not attr.startswith("_"):
            found.setdefault(attr, value)
        alias = getattr(value, REWARD_ATTR, None) if callable(value) else None
        if isinstance(alias, str):
            found[alias] = value
    return found


def accepts(fn: Callable[..., Any]) -> tuple[bool, set[str]]:
    """(takes **kwargs, keyword names it takes)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True, set()
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    names = {n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return var_kw, names


def check_callable(name: str, fn: Callable[..., Any], params: dict[str, Any]) -> None:
    """Fail at start, not at step 1, when the function cannot take completions= or its params."""
    var_kw, names = accepts(fn)
    if not var_kw and "completions" not in names:
        raise PluginError(f"reward {name!r} must accept a 'completions' argument "
                          f"(signature fn(completions, prompts=..., **columns))")
    unknown = sorted(set(params) - names) if not var_kw else []
    if unknown:
        raise PluginError(f"reward {name!r} does not accept params {unknown}")


def call_reward(fn: Callable[..., Any], kwargs: dict[str, Any], loop: asyncio.AbstractEventLoop | None = None) -> Any:
    """Call with TRL's keyword convention; drop arguments a function without **kwargs does not name;
    run coroutines (async reward functions) to completion."""
    var_kw, names = accepts(fn)
    if not var_kw:
        kwargs = {k: v for k, v in kwargs.items() if k in names}
    out = fn(**kwargs)
    if inspect.isawaitable(out):
        if loop is None:
            out = asyncio.run(_await(out))
        else:
            out = loop.run_until_complete(_await(out))
    return out


async def _await(aw: Any) -> Any:
    return await aw
