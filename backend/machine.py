"""What this machine offers a run: GPUs, installed rollout engines, another interpreter's engines, the hub.

Probing only, no rules: `backend.checks` decides what a spec needs of the machine, `backend.plan` says where a
run would go. Probes are cheap and cached, and none imports torch or an engine (nvidia-smi for GPUs,
importlib's find_spec for packages, a subprocess for another interpreter), so the studio stays light and a
broken engine install cannot fail the process that asks about it. Tests build their own `Machine`.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import socket
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    memory_gib: float


@dataclass(frozen=True)
class Machine:
    """What this machine offers a run. Tests build their own; `Machine.detect()` reads the real one."""

    gpus: tuple[GPU, ...] = ()
    engines: frozenset[str] = frozenset({"hf"})
    hub_reachable: bool = False
    ram_gib: float = 0.0  # the host's memory (0 = unknown: backend.footprint refuses nothing on it)

    @staticmethod
    def detect() -> Machine:
        return _detect_machine()


@lru_cache(maxsize=1)
def detect_gpus() -> tuple[GPU, ...]:
    """Visible NVIDIA GPUs via nvidia-smi (no torch import, so the studio stays light); () when none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            try:
                gpus.append(GPU(int(parts[0]), parts[1], float(parts[2]) / 1024))
            except ValueError:
                continue
    if visible is not None:  # torch renumbers the visible ones from 0
        keep = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        gpus = [GPU(i, g.name, g.memory_gib) for i, g in enumerate(g for g in gpus if g.index in keep)]
    return tuple(gpus)


def installed_engines() -> frozenset[str]:
    engines = {"hf"}
    for name in ("vllm", "lmdeploy"):
        if importlib.util.find_spec(name) is not None:
            engines.add(name)
    return frozenset(engines)


def deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


@lru_cache(maxsize=1)
def model_types() -> frozenset[str] | None:
    """The model_type names the installed transformers loads (its CONFIG_MAPPING_NAMES), or None when they cannot
    be read. Read from its source with `ast`: importing transformers takes seconds, which a form's check must not."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.origin:
        return None
    auto = Path(spec.origin).parent / "models" / "auto"
    names: set[str] = set()
    for f in ("auto_mappings.py", "configuration_auto.py"):  # the generated table, and the additions beside it
        try:
            tree = ast.parse((auto / f).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONFIG_MAPPING_NAMES"
                                                    for t in node.targets):
                names |= _string_keys(node.value)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                  and isinstance(node.func.value, ast.Name) and node.func.value.id == "CONFIG_MAPPING_NAMES"):
                names |= _string_keys(node)
    return frozenset(names) or None


def _string_keys(node: ast.AST) -> set[str]:
    """String keys of the dict literals and (key, value) pairs under `node`."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Dict):
            out |= {k.value for k in n.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(n, ast.Tuple) and len(n.elts) == 2 and isinstance(n.elts[0], ast.Constant) \
                and isinstance(n.elts[0].value, str):
            out.add(n.elts[0].value)
    return out


@lru_cache(maxsize=8)
def engines_in(python: str) -> frozenset[str] | None:
    """Engines importable by another interpreter (a rollout worker's own environment); None if it does not run."""
    code = ("import importlib.util as u; print(' '.join(n for n in ('vllm', 'lmdeploy', 'transformers') "
            "if u.find_spec(n)))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return frozenset({"hf" if n == "transformers" else n for n in out})


@lru_cache(maxsize=8)
def torchvision_error(python: str) -> str | None:
    """Why `python` cannot import torchvision (its last error line), or None when it can. A subprocess: a
    torchvision built for another torch fails inside its import, which should not happen in this process."""
    try:
        out = subprocess.run([python, "-c", "import torchvision"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as err:
        return str(err)
    if out.returncode == 0:
        return None
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {out.returncode}"


@lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the model hub (HF_ENDPOINT, mirrors included) accepts a connection from here; offline mode says no."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False
    try:
        from urllib.parse import urlparse

        from huggingface_hub import constants

        url = urlparse(constants.ENDPOINT)
        with socket.create_connection((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)), timeout=1.5):
            return True
    except (OSError, ImportError, ValueError):
        return False


def hub_cached(repo_id: str, repo_type: str = "model") -> bool:
    """Whether a hub model (its config.json) or dataset (a snapshot) is in the local hub cache, so it loads
    without the hub."""
    try:
        if repo_type == "model":
            from huggingface_hub import try_to_load_from_cache

            return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
        from huggingface_hub import constants

        snapshots = Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}" / "snapshots"
        return snapshots.is_dir() and any(snapshots.iterdir())
    except Exception:
        return False


@lru_cache(maxsize=1)
def _detect_machine() -> Machine:
    import psutil

    return Machine(detect_gpus(), installed_engines(), hub_reachable(), psutil.virtual_memory().total / 2**30)
