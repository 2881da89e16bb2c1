"""Registry of built-in reward functions: the table (BUILTIN_REWARDS) and the `builtin` decorator, nothing else.

A leaf: it imports no reward module. Each built-in module registers its functions with `@builtin` when it is
imported, and the package (backend/rewards/__init__.py) imports every built-in module once, so whoever reads
the table (any `backend.rewards.*` import runs the package first) sees them all.

A reward function has the TRL signature `fn(completions, prompts, **columns) -> list[float | None]`;
dataset columns arrive by name (the solution column as `solution`). None means "cannot score this
sample" and is excluded from that function's mean instead of counting as 0.

Parameters of a built-in are a pydantic model, validated by `backend.checks` before launch and passed
to the function as keyword arguments. `needs` declares the dataset columns a built-in reads ("solution"
stands for `data.solution_column`), or a function of its validated params that names them; the
capability check refuses a spec whose data lacks one, since every score would be None.

A stateful built-in (a reward model that loads weights once) is registered with `stateful=True`:
the decorated callable is then a factory
`make(params, device=..., base_dir=...) -> reward function`.

`kinds` declares what a needed column's cells must hold, by `backend.data.cell_kind`'s names ("text", "int",
"float", ...; absent = anything): exact_match compares str(solution), so a float column (2.0 -> "2.0") would
score 0 every step, silently; the check refuses it before launch instead.

`isolate=True` marks a built-in that runs in the reward worker rather than in the trainer: those that
call sympy through math-verify, which can take seconds or loop on adversarial input, and would hold
the GIL in the trainer's rollout thread. Cheap string rewards stay in the trainer (see scorer.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

RewardFn = Callable[..., list[float | None]]


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class BuiltinReward:
    name: str
    fn: RewardFn
    params_model: type[BaseModel]
    doc: str
    stateful: bool = False
    isolate: bool = False
    needs: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = ()
    # needed column -> the cell kinds it may hold, or a function of the validated params naming them (None: any)
    kinds: dict[str, tuple[str, ...]] | Callable[[Any], dict[str, tuple[str, ...]]] | None = None

    def required_columns(self, params: dict[str, Any]) -> tuple[str, ...]:
        """Dataset columns this reward reads with these params ('solution' = the solution column)."""
        if callable(self.needs):
            return tuple(self.needs(self.params_model.model_validate(params)))
        return self.needs

    def column_kinds(self, params: dict[str, Any]) -> dict[str, tuple[str, ...]]:
        """Needed column ('solution' = the solution column) -> the cell kinds it may hold; {} = anything."""
        if callable(self.kinds):
            return dict(self.kinds(self.params_model.model_validate(params)))
        return dict(self.kinds or {})

    def check_params(self, params: dict[str, Any]) -> str | None:
        try:
            self.params_model.model_validate(params)
        except ValidationError as err:
            return "; ".join(f"param {'.'.join(map(str, e['loc'])) or '?'}: {e['msg']}" for e in err.errors())
        return None

    def bind(self, params: dict[str, Any]) -> RewardFn:
        """A plain reward function with the params filled in (stateless built-ins)."""
        if self.stateful:
            raise TypeError(f"reward {self.name!r} loads state: use make(params, device, base_dir)")
        p = self.params_model.model_validate(params).model_dump()

        def scored(completions: list[Any], prompts: list[Any] | None = None, **columns: Any) -> list[float | None]:
            return self.fn(completions, prompts, **{**columns, **p})

        scored.__name__ = self.name
        return scored

    def make(self, params: dict[str, Any], device: str = "cpu", base_dir: Path = Path(".")) -> RewardFn:
        """A ready reward function: `bind` for plain built-ins, the factory's product for stateful ones."""
        if not self.stateful:
            return self.bind(params)
        return self.fn(self.params_model.model_validate(params), device=device, base_dir=Path(base_dir))


BUILTIN_REWARDS: dict[str, BuiltinReward] = {}


def builtin(name: str, params_model: type[BaseModel] = NoParams, stateful: bool = False, isolate: bool = False,
            needs: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = (),
            kinds: dict[str, tuple[str, ...]] | Callable[[Any], dict[str, tuple[str, ...]]] | None = None,
            ) -> Callable[[RewardFn], RewardFn]:
    def register(fn: RewardFn) -> RewardFn:
        doc = inspect.cleandoc(fn.__doc__ or "")
        BUILTIN_REWARDS[name] = BuiltinReward(name, fn, params_model, doc, stateful, isolate, needs, kinds)
        return fn

    return register
