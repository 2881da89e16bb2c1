"""The layout of docs/architecture.md, checked from the source (read with `ast`, nothing imported): no
module-level import circle in backend/, every module imports only from its own floor or below, and the studio
never imports the trainer.

For circles only module-level imports count: an import inside a function runs when called, after every module
has loaded, and one under `if TYPE_CHECKING:` never runs. For floors every import counts, lazy ones too: an
arrow that runs up is one wherever it is written. An edge goes to the module an import names: `from
backend.rewards import builtins` is an edge to backend.rewards.builtins when that is a module, else to the
package backend.rewards. A package's `__init__` running before its submodules is Python's mechanics, not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BACKEND = ROOT / "backend"

# docs/architecture.md's floors: a module's floor is that of the longest prefix listed here (a package's
# modules share its room's floor unless one is listed on its own).
FLOORS: dict[str, int] = {
    "backend": 1,  # the package itself
    "backend.spec": 1, "backend.rundir": 1, "backend.project": 1, "backend.procs": 1, "backend.rollout.base": 1,
    "backend.sandbox": 1, "backend.relevance": 1,
    "backend.data": 2, "backend.workspace": 2, "backend.models": 2, "backend.multimodal": 2, "backend.rollout": 2, "backend.importers": 2,
    "backend.exporters": 2,
    "backend.rewards": 3, "backend.eval": 3, "backend.agent": 3,
    "backend.machine": 4, "backend.footprint": 4, "backend.checks": 4, "backend.plan": 4,
    "backend.train": 5,
    "backend.launcher": 6, "backend.rewards.check": 6,
    "backend.rewards.__main__": 6,  # `python -m backend.rewards check`: the reward checker's command
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(BACKEND.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module loads: at top level, or inside top-level if/try/with blocks (never in a
    function or class body, nor under `if TYPE_CHECKING:`)."""
    out: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If):
            todo += ([] if _is_type_checking(node.test) else node.body) + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            todo += node.body
    return out


def imports_of(name: str, lazy: bool = False) -> set[str]:
    """The backend modules `name` imports at module level (with `lazy`, anywhere in it)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in _all_imports(tree) if lazy else _top_level_imports(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from the package, up level-1 packages
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for t in targets:
            while t and t not in MODULES:  # `import backend.x.y` names a module; an attribute path falls back
                t = t.rpartition(".")[0]
            if t.startswith("backend") and t != name:
                found.add(t)
    return found


GRAPH: dict[str, set[str]] = {m: imports_of(m) for m in MODULES}  # what runs at import time
ARROWS: dict[str, set[str]] = {m: imports_of(m, lazy=True) for m in MODULES}  # every import


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def floor_of(name: str) -> int:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        if (prefix := ".".join(parts[:k])) in FLOORS:
            return FLOORS[prefix]
    raise KeyError(f"{name} has no floor: add its room to docs/architecture.md and FLOORS")


def test_the_graph_is_read() -> None:
    # the parser sees the arrows it must see, or the checks below would pass on an empty graph
    assert "backend.spec" in GRAPH["backend.checks"]
    assert "backend.rewards.builtins" in GRAPH["backend.rewards"]
    assert "backend.multimodal.media" in GRAPH["backend.multimodal"]
    assert "backend.checks" in ARROWS["backend.train.cli"] and "backend.checks" not in GRAPH["backend.train.cli"]


def test_find_cycle_names_the_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_level_import_circle_in_backend() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "module-level import circle: " + " -> ".join(cycle or [])


def test_every_backend_module_has_a_floor() -> None:
    for m in MODULES:
        floor_of(m)


def upward_imports() -> list[str]:
    return sorted(f"{m} (floor {floor_of(m)}) imports {n} (floor {floor_of(n)})"
                  for m, deps in ARROWS.items() for n in deps if floor_of(n) > floor_of(m))


def test_modules_import_only_from_their_floor_or_below() -> None:
    bad = upward_imports()
    assert not bad, "imports that run up a floor:\n" + "\n".join(bad)


def test_the_studio_never_imports_the_trainer() -> None:
    bad = []
    for p in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):  # lazy imports too: none at all
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{p.relative_to(ROOT)} imports {n}" for n in names if n == "backend.train" or n.startswith("backend.train.")]
    assert not bad, "\n".join(bad)


def test_the_trainer_reads_no_runtime_policy_from_checks_or_plan() -> None:
    # docs/architecture.md, floor 5: never checks.py or plan.py for runtime policy (that is RunSpec's); the CLI's
    # validation of a new spec before its run directory is created is the one use
    bad = sorted(f"{m} imports {n}" for m, deps in ARROWS.items() if m.startswith("backend.train.") and m != "backend.train.cli"
                 for n in deps if n in ("backend.checks", "backend.plan"))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ["backend.rewards.registry", "backend.rundir", "backend.procs"])
def test_leaves_stay_leaves(name: str) -> None:
    # the rooms this redesign made leaves: the reward table imports no reward module, the run directory and the
    # process helpers nothing above floor 1
    assert all(floor_of(n) <= 1 for n in ARROWS[name]), ARROWS[name]
    assert not any(n.startswith("backend.rewards") for n in ARROWS[name]), ARROWS[name]
