"""The rollout engine interface.

An engine samples completions for tokenized prompts and can take new weights after each
policy update. Implementations: transformers (hf.py, CPU and GPU), vLLM and LMDeploy (GPU).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

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
    # Seeds are per group: prompt i of a call samples with PromptInput.seed, or derive_seed(seed, i) when that
    # is unset, so a group's completions do not depend on how a batch is split over workers or chunks.
    seed: int | None = None


@dataclass
class Completion:
    token_ids: list[int]  # sampled tokens, including the EOS token when finish_reason is "stop"
    text: str
    finish_reason: Literal["stop", "length"]
    # log p(token) under the sampling policy at temperature T (logits / T, before top-k/top-p filtering),
    # the same definition the trainer uses; None when the engine does not report them.
    logprobs: list[float] | None = None
    # episodes (backend.agent): 1 on the model's own tokens, 0 on inserted ones (tool results, observations);
    # None = every token is the model's. `episode` is the agent's record of the turns (backend.agent.Episode).
    model_mask: list[int] | None = None
    episode: Any = None


@dataclass(frozen=True)
class RawMedia:
    """A multimodal prompt as engines that process media themselves take it (vLLM): the prompt's tokens with one
    placeholder per image (the engine expands it to the patch count) and the images as RGB PIL images."""

    prompt_ids: list[int]
    images: list[Any]


@dataclass
class PromptInput:
    token_ids: list[int]  # multimodal prompts: placeholders expanded to one token per merged patch
    # the model's media inputs for engines that run the transformers model (hf): {"pixel_values", "image_grid_thw",
    # "pixel_values_videos", "video_grid_thw"} (backend.multimodal); {} for text
    multi_modal: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None  # this group's sampling seed (see SamplingParams.seed)
    raw_media: RawMedia | None = None  # the same prompt for engines that process images themselves (vLLM)


def group_seeds(prompts: list[PromptInput], sampling: SamplingParams) -> list[PromptInput]:
    """Give every prompt its group seed (its own, else derive_seed(sampling.seed, index)); unchanged when unseeded.
    A hash, not seed + i: vLLM seeds sample j of a request with seed + j, so neighbouring groups would share samples."""
    if sampling.seed is None:
        return prompts
    return [p if p.seed is not None else replace(p, seed=derive_seed(sampling.seed, i)) for i, p in enumerate(prompts)]


@dataclass(frozen=True)
class InstanceTiming:
    """One engine instance's share of the last generate call (a pool reports one per worker)."""

    name: str
    groups: int
    completion_tokens: int
    seconds: float


class RolloutEngine:
    """The engine interface the trainer and the evaluator use, and nothing else: the trainer never asks what
    an engine is. `generate` and `update_weights` are every engine's own; the other abilities have defaults
    that mean "not this engine", so an engine overrides only what it has.

    generate() returns, for each prompt, `sampling.n` completions in order.
    update_weights() loads new weights, tagged with the policy version (optimizer steps) they come from; with
    `adapter` (its peft config) the tensors are a LoRA adapter, for the engines RunSpec.adapter_push names."""

    keeps_peft_names: bool = False  # its weights are a peft model's, named as peft names them (an in-process copy)

    def generate(self, prompts: list[PromptInput], sampling: SamplingParams) -> list[list[Completion]]:
        raise NotImplementedError

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int = 0,
                       adapter: dict[str, Any] | None = None) -> None:
        raise NotImplementedError

    def sleep(self) -> None:
        """Free device memory while the trainer updates (colocated GPU engines); weights may be dropped."""

    def wake_up(self) -> None:
        """Undo sleep()."""

    def close(self) -> None:
        """Release the engine (workers exit)."""

    def shares(self, model: Any) -> bool:
        """Whether the engine samples with `model` itself (no weight sync needed; it can evaluate it)."""
        return False

    def last_timings(self) -> list[InstanceTiming]:
        """Per-instance seconds of the last generate call; [] for a single engine (the caller times it)."""
        return []
