"""The trainer state in a checkpoint (`checkpoints/step-N/trainer_state.pt`), stored safely.

Only tensors and plain data (dicts, lists, numbers, strings) are written, with a format number, so
the file loads with `torch.load(weights_only=True)`: a run directory copied from someone else cannot
run code when the studio resumes it. Batch dataclasses are stored field by field, so renaming or
adding a field with a default does not break old checkpoints. Files from the first version (a
pickle of whole objects) are refused with a message that says so.
"""

from __future__ import annotations

import dataclasses
import pickle
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend.train.batch import PendingRollout, Rollout

FORMAT = 2


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
    return None if ro is None else {f.name: getattr(ro, f.name) for f in dataclasses.fields(ro)
                                    if not f.metadata.get("transient")}


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
