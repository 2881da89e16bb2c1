"""The rollout engine interface.

An engine samples completions for tokenized prompts and can take new weights after each
policy update. Implementations: transformers (hf.py, CPU and GPU), vLLM and LMDeploy (GPU).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    n: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    # Seeds are per group: prompt i of a call samples with PromptInput.seed, or seed + GROUP_SEED_STRIDE * i
    # when that is unset, so a group's completions do not depend on how a batch is split over workers or chunks.
    seed: int | None = None


@dataclass
class Completion:
    token_ids: list[int]  # sampled tokens, including the EOS token when finish_reason is "stop"
    text: str
    finish_reason: Literal["stop", "length"]
    # log p(token) under the sampling policy at temperature T (logits / T, before top-k/top-p filtering),
    # the same definition the trainer uses; None when the engine does not report them.
    logprobs: list[float] | None = None


@dataclass
class PromptInput:
    token_ids: list[int]
    multi_modal: dict[str, Any] = field(default_factory=dict)  # e.g. {"image": [...]} for VLMs
    seed: int | None = None  # this group's sampling seed (see SamplingParams.seed)


# vLLM seeds sample j of a request with seed + j: groups' seeds lie further apart than any group is large
GROUP_SEED_STRIDE = 10_007


def group_seeds(prompts: list[PromptInput], sampling: SamplingParams) -> list[PromptInput]:
    """Give every prompt its group seed (its own, else sampling.seed + stride x its index); unchanged when unseeded."""
    if sampling.seed is None:
        return prompts
    return [p if p.seed is not None else replace(p, seed=sampling.seed + GROUP_SEED_STRIDE * i)
            for i, p in enumerate(prompts)]


class RolloutEngine(Protocol):
    """generate() returns, for each prompt, `sampling.n` completions in order."""

    def generate(self, prompts: list[PromptInput], sampling: SamplingParams) -> list[list[Completion]]: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def close(self) -> None: ...
