"""Small C kernels for the CPU (backend/csrc), compiled on first use with the host's C compiler, loaded with ctypes.

A few hot loops of the CPU path cost far more in torch's general kernels than the bytes they move: one decode
step's attention over the key/value cache is a batch of tiny matrix-vector products, which torch's scaled
dot-product attention runs blockwise at 4-5 GB/s (backend.rollout.decode_attention). The kernels are plain C over
raw float pointers, without torch's headers (a build against those takes minutes; this one well under a second).

A library is built once per source, compiler, flags and CPU into the cache directory ($GRPO_STUDIO_CACHE, else
~/.cache/grpo-studio; a temp directory where neither is writable) under a name hashed from all four: it is
built for this CPU (-march=native), so a home directory shared between machines never loads one built for
another. A build writes a temporary file and renames it, so processes that build at once (rollout workers) do
not see half a library. -fopenmp: the library links the OpenMP runtime torch has already loaded (the same
soname), and callers pass torch's thread count. Without a compiler, or when a build fails, `load` returns None
(the reason logged once) and callers run torch's kernels; GRPO_STUDIO_NATIVE=0 turns the kernels off.
Imports nothing of this project: the floor, beside backend.gemm.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SOURCES = Path(__file__).resolve().parent / "csrc"
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared")
OPENMP = "-fopenmp"  # the kernels' threads; a build without it runs single-threaded
BUILD_TIMEOUT_S = 120


def compiler() -> str | None:
    """The C compiler: $CC, else cc or gcc or clang on PATH."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or cc
    return next((p for p in (shutil.which(n) for n in ("cc", "gcc", "clang")) if p), None)


def cache_dir() -> Path:
    """Where built libraries live: $GRPO_STUDIO_CACHE/native, else ~/.cache/grpo-studio/native, else a temp dir."""
    base = os.environ.get("GRPO_STUDIO_CACHE")
    root = Path(base) if base else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo-studio"
    user = getattr(os, "getuid", lambda: 0)()
    for path in (root / "native", Path(tempfile.gettempdir()) / f"grpo-studio-native-{user}"):
        try:
            path.mkdir(parents=True, exist_ok=True)
            if os.access(path, os.W_OK):
                return path
        except OSError:
            continue
    raise OSError("no writable directory for native kernels")


def _cpu_identity() -> str:
    """The CPU's model and instruction-set flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "vendor_id"))}))
    except OSError:
        return platform.processor() + platform.machine()


def _build(source: Path, cc: str, flags: tuple[str, ...]) -> Path:
    """The library for `source`, built into the cache unless a build with the same key is there already."""
    text = source.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(b"\0".join([text, " ".join(flags).encode(), version.encode(), _cpu_identity().encode()]))
    out_dir = cache_dir()
    lib = out_dir / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(source), "-o", tmp, "-lm"], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed on {source.name}: {(done.stderr or done.stdout).strip()[-2000:]}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The built library of backend/csrc/<name>.c, or None (no compiler, a failed build, GRPO_STUDIO_NATIVE=0)."""
    if os.environ.get("GRPO_STUDIO_NATIVE", "1") == "0":
        return None
    cc = compiler()
    if cc is None:
        log.warning("native kernel %s: no C compiler (set CC); using torch's kernels", name)
        return None
    source = SOURCES / f"{name}.c"
    errors = []
    # without OpenMP (Apple's clang), then without -march=native (compilers that do not take it)
    for flags in ((*FLAGS, OPENMP), FLAGS, tuple(f for f in FLAGS if f != "-march=native")):
        try:
            return ctypes.CDLL(str(_build(source, cc, flags)))
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            errors.append(str(e))
    log.warning("native kernel %s could not be built; using torch's kernels: %s", name, errors[-1])
    return None
