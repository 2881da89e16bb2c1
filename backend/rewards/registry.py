"""Registry of built-in reward functions.

A reward function has the TRL signature `fn(completions, prompts, **columns) -> list[float | None]`;
dataset columns arrive by name (the solution column as `solution`). None means "cannot score this
sample" and is excluded from that function's mean instead of counting as 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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

    def check_params(self, params: dict[str, Any]) -> str | None:
        try:
            self.params_model.model_validate(params)
        except ValidationError as err:
            return "; ".join(f"param {'.'.join(map(str, e['loc'])) or '?'}: {e['msg']}" for e in err.errors())
        return None

    def bind(self, params: dict[str, Any]) -> RewardFn:
        p = self.params_model.model_validate(params).model_dump()

        def scored(completions: list[str], prompts: list[str], **columns: Any) -> list[float | None]:
            return self.fn(completions, prompts, **columns, **p)

        scored.__name__ = self.name
        return scored


BUILTIN_REWARDS: dict[str, BuiltinReward] = {}


def builtin(name: str, params_model: type[BaseModel] = NoParams) -> Callable[[RewardFn], RewardFn]:
    def register(fn: RewardFn) -> RewardFn:
        BUILTIN_REWARDS[name] = BuiltinReward(name, fn, params_model, (fn.__doc__ or "").strip())
        return fn

    return register


# Importing the module registers the built-ins.
from backend.rewards import builtins as _builtins  # noqa: E402,F401
