"""The rollout engine interface.

An engine samples completions for tokenized prompts and can take new weights after each
policy update. Implementations: transformers (hf.py, CPU and GPU), vLLM and LMDeploy (GPU).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch


def derive_seed(*parts: int) -> int:
    """A 63-bit seed for the stream named by `parts` (run seed, rollout, retry, chunk...). It is a hash
    (numpy's SeedSequence), so distinct part tuples give independent streams: unlike sums such as
    `seed + 101 * index + salt`, no two tuples land on the same seed by arithmetic coincidence."""
    import numpy as np

    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)[0] >> 1)


@dataclass(frozen=True)
class SamplingParams:
    n: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
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


class RolloutEngine(Protocol):
    """generate() returns, for each prompt, `sampling.n` completions in order."""

    def generate(self, prompts: list[PromptInput], sampling: SamplingParams) -> list[list[Completion]]: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def close(self) -> None: ...
