"""Checkpoints: a directory written atomically, and the trainer state in it (`trainer_state.pt`), stored safely.

`write_atomically` fills a temp directory, writes its manifest (every file's size and SHA-256) last, marks it
COMPLETE and renames it into place, so a kill during a save leaves the previous checkpoint as the newest complete
one (an incomplete leftover is replaced next time). A save that fails (a full disk, any error) removes its
partial directory and keeps the previous checkpoint; a full disk says "no space left on device" and where.
What a kill -9 mid-save leaves is removed when the run resumes (`remove_partial`).
`resume_point` picks the newest checkpoint whose files match their manifest and says which ones it skipped and
why (a truncated model.safetensors or trainer_state.pt); a checkpoint from before manifests is taken as it is.

Only tensors and plain data (dicts, lists, numbers, strings) are written, with a format number, so
the file loads with `torch.load(weights_only=True)`: a run directory copied from someone else cannot
run code when the studio resumes it. Batch dataclasses are stored field by field, so renaming or
adding a field with a default does not break old checkpoints. Files from the first version (a
pickle of whole objects) are refused with a message that says so.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import pickle
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend.train.batch import PendingRollout, Rollout

FORMAT = 2
MANIFEST = "manifest.json"  # {"files": {relative path: {"size": bytes, "sha256": hex}}}, written last
ENTROPY_STATE = "entropy_control.json"  # the adaptive entropy controller's state, as TRL's entropy_ctrl_state.json


class CheckpointError(RuntimeError):
    pass


@dataclass
class TrainerState:
    step: int
    rollouts_done: int
    sampler: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    pending: PendingRollout | None
    in_flight: list[Rollout]  # async: batches sampled ahead, in the order they will be trained
    elapsed_s: float
    replay: dict[str, Any] | None = None  # success replay's store (backend.train.replay), when it is on


def _rollout_to_plain(ro: Rollout | None) -> dict[str, Any] | None:
    return None if ro is None else {f.name: getattr(ro, f.name) for f in dataclasses.fields(ro)}


def _rollout_from_plain(d: dict[str, Any] | None) -> Rollout | None:
    if d is None:
        return None
    known = {f.name for f in dataclasses.fields(Rollout)}
    return Rollout(**{k: v for k, v in d.items() if k in known})


def _rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_trainer_state(path: Path, *, step: int, rollouts_done: int, sampler: dict[str, Any], optimizer: dict[str, Any],
                       scheduler: dict[str, Any], pending: PendingRollout | None, in_flight: list[Rollout],
                       elapsed_s: float, replay: dict[str, Any] | None = None) -> None:
    torch.save({
        "format": FORMAT, "step": step, "rollouts_done": rollouts_done, "sampler": sampler,
        "optimizer": optimizer, "scheduler": scheduler, "rng": _rng_state(), "elapsed_s": elapsed_s,
        "pending": None if pending is None else {"rollout": _rollout_to_plain(pending.rollout),
                                                 "iterations_done": pending.iterations_done},
        "in_flight": [_rollout_to_plain(ro) for ro in in_flight], "replay": replay,
    }, path)


def load_trainer_state(path: Path) -> TrainerState:
    """Read a trainer state and restore the RNGs; CheckpointError for an old or foreign file."""
    try:
        raw = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"{path} holds pickled objects (a checkpoint from the first version of GRPO Studio, or not ours); "
            "loading it could run code, so it is refused. Start a new run, or resume from a checkpoint written "
            f"by this version. ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(f"{path}: trainer state format {found!r} is not the supported format {FORMAT}")
    _set_rng_state(raw["rng"])
    pending = raw["pending"]
    flight = raw["in_flight"]  # a list; one rollout or None in files from before max_staleness
    flight = [] if flight is None else [flight] if isinstance(flight, dict) else flight
    return TrainerState(
        step=raw["step"], rollouts_done=raw["rollouts_done"], sampler=raw["sampler"], optimizer=raw["optimizer"],
        scheduler=raw["scheduler"], elapsed_s=raw.get("elapsed_s", 0.0), replay=raw.get("replay"),
        in_flight=[_rollout_from_plain(d) for d in flight],  # type: ignore[misc]
        pending=None if pending is None else PendingRollout(_rollout_from_plain(pending["rollout"]),  # type: ignore[arg-type]
                                                            pending["iterations_done"]))


def is_complete(ckpt: Path) -> bool:
    return (ckpt / "COMPLETE").exists()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(ckpt: Path) -> None:
    """The manifest of every file in `ckpt` but itself and the COMPLETE marker."""
    files = {p.relative_to(ckpt).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(ckpt.rglob("*")) if p.is_file() and p.name not in (MANIFEST, "COMPLETE")}
    (ckpt / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def verify(ckpt: Path) -> str:
    """'' when `ckpt` is complete and its files match its manifest, else why not."""
    if not is_complete(ckpt):
        return "it was never completed"
    try:
        files = json.loads((ckpt / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return ""  # written before manifests: nothing to check it against
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MANIFEST} is unreadable"
    if not isinstance(files, dict) or not all(
            isinstance(want, dict) and isinstance(want.get("size"), int) and isinstance(want.get("sha256"), str)
            and not Path(name).is_absolute() and ".." not in Path(name).parts for name, want in files.items()):
        return f"its {MANIFEST} is not one this version writes"  # a file outside the checkpoint is never read
    for name, want in files.items():
        path = ckpt / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["size"]:
            return f"{name} is {path.stat().st_size} bytes, {want['size']} when written (truncated?)"
        if _sha256(path) != want["sha256"]:
            return f"{name} does not match its SHA-256 when written (corrupt)"
    return ""


def resume_point(checkpoints: list[Path]) -> tuple[Path | None, list[str]]:
    """The newest of `checkpoints` (oldest first) that verifies, and one note per newer one skipped; None when
    there are none. CheckpointError when there are some and none verifies."""
    notes = []
    for ckpt in reversed(checkpoints):
        why = verify(ckpt)
        if not why:
            return ckpt, notes
        notes.append(f"checkpoint {ckpt.name} skipped: {why}")
    if notes:
        raise CheckpointError("no checkpoint to resume from verifies: " + "; ".join(notes))
    return None, notes


def remove_partial(checkpoints_dir: Path) -> None:
    """Remove what saves killed midway left (.step-N.tmp): a resume must not find the disk full of them."""
    for tmp in checkpoints_dir.glob(".step-*.tmp") if checkpoints_dir.is_dir() else []:
        shutil.rmtree(tmp, ignore_errors=True)


def _disk_full(err: BaseException, where: Path) -> bool:
    """Whether `err` (or what caused it) is a full disk: ENOSPC/EDQUOT, or a library's own wording (torch.save
    says only "iostream error") while the disk under `where` has (almost) no space left."""
    e: BaseException | None = err
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        e = e.__cause__ or e.__context__
    try:
        return shutil.disk_usage(where).free < 1 << 20
    except OSError:
        return False


def write_atomically(final: Path, fill: Callable[[Path], None], marker: str) -> Path:
    """Write checkpoint directory `final`: `fill(tmp)` writes its files into a temp directory beside it, then
    its manifest is written, it is marked COMPLETE (holding `marker`) and renamed into place. On any failure
    the temp directory is removed (the previous checkpoint stays the newest)."""
    tmp = final.parent / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        fill(tmp)
        write_manifest(tmp)
        (tmp / "COMPLETE").write_text(marker)
    except BaseException as err:
        full = _disk_full(err, final.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise CheckpointError(f"no space left on device in {final.parent} while saving {final.name}: the "
                                  "partial checkpoint was removed, the previous one is kept") from err
        raise
    shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of a killed save
    os.replace(tmp, final)
    return final


def prune(checkpoints: list[Path], limit: int) -> None:
    """Keep the newest `limit` checkpoints (oldest first in `checkpoints`); 0 keeps all."""
    for old in checkpoints[:-limit] if limit else []:
        shutil.rmtree(old, ignore_errors=True)


def save_entropy_state(ckpt: Path, coef: float, last_entropy: float) -> None:
    (ckpt / ENTROPY_STATE).write_text(json.dumps({"entropy_coef": coef, "last_entropy": last_entropy}))


def load_entropy_state(ckpt: Path) -> tuple[float, float] | None:
    """(entropy_coef, last_entropy) as saved, or None where the checkpoint has none."""
    if not (ckpt / ENTROPY_STATE).is_file():
        return None
    saved = json.loads((ckpt / ENTROPY_STATE).read_text())
    return saved["entropy_coef"], saved["last_entropy"]
