"""Checkpoints: a directory written atomically, and the trainer state in it (`trainer_state.pt`), stored safely.

`write_atomically` fills a temp directory, marks it COMPLETE and renames it into place, so a kill during a save
leaves the previous checkpoint as the newest complete one (an incomplete leftover is replaced next time).

Only tensors and plain data (dicts, lists, numbers, strings) are written, with a format number, so
the file loads with `torch.load(weights_only=True)`: a run directory copied from someone else cannot
run code when the studio resumes it. Batch dataclasses are stored field by field, so renaming or
adding a field with a default does not break old checkpoints. Files from the first version (a
pickle of whole objects) are refused with a message that says so.
"""

from __future__ import annotations

import dataclasses
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


def write_atomically(final: Path, fill: Callable[[Path], None], marker: str) -> Path:
    """Write checkpoint directory `final`: `fill(tmp)` writes its files into a temp directory beside it, which
    is then marked COMPLETE (holding `marker`) and renamed into place."""
    tmp = final.parent / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    (tmp / "COMPLETE").write_text(marker)
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
