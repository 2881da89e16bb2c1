"""Reward models: a sequence-classification model scores prompt + completion (the first logit).

As in TRL, the text is the prompt followed by the completion (the trainer's prompts are already
rendered with the chat template), or, for conversational rows, the messages run through the reward
tokenizer's chat template; tokenized without special tokens, padded right, cut to max_length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from backend.rewards.registry import RewardFn, builtin
from backend.rewards.text import completion_text


class RewardModelParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="Sequence-classification model: local directory (relative to the project) "
                                  "or hub id.")
    batch_size: int = Field(16, ge=1, le=4096, description="Texts per forward pass.")
    max_length: int = Field(1024, ge=8, le=1_000_000, description="Tokens kept per text (the start is kept).")
    dtype: str = Field("auto", pattern="^(auto|float32|bfloat16|float16)$",
                       description="Weights dtype; auto = bfloat16 on GPU, float32 on CPU.")


def resolve_device(device: str) -> str:
    import torch

    if device in ("", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class RewardModel:
    """Loaded once; calling it scores a batch like any reward function."""

    def __init__(self, params: RewardModelParams, device: str = "cpu", base_dir: Path = Path(".")):
        import torch
        from transformers import AutoModelForSequenceClassification

        from backend.data import is_hub_id
        from backend.models import load_tokenizer

        path = params.path
        if not is_hub_id(path, base_dir) and not Path(path).is_absolute():
            path = str(Path(base_dir) / path)
        if not is_hub_id(params.path, base_dir) and not Path(path).is_dir():
            raise FileNotFoundError(f"reward model directory not found: {params.path}")
        self.device = resolve_device(device)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
            params.dtype, torch.bfloat16 if self.device.startswith("cuda") else torch.float32)
        self.tok = load_tokenizer(path)  # with a pad token: the model finds each text's last token via the pad id
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype).to(self.device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tok.pad_token_id
        self.batch_size, self.max_length = params.batch_size, params.max_length

    def texts(self, prompts: list[Any], completions: list[Any]) -> list[str]:
        out = []
        for p, c in zip(prompts, completions, strict=True):
            if isinstance(p, list) and getattr(self.tok, "chat_template", None):
                msgs = [*p, {"role": "assistant", "content": completion_text(c)}]
                out.append(self.tok.apply_chat_template(msgs, tokenize=False))
            else:
                out.append(completion_text(p) + completion_text(c))
        return out

    def __call__(self, completions: list[Any], prompts: list[Any] | None = None, **_: Any) -> list[float | None]:
        import torch

        texts = self.texts(prompts if prompts is not None else [""] * len(completions), completions)
        scores: list[float | None] = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tok(texts[i:i + self.batch_size], return_tensors="pt", padding=True, padding_side="right",
                               truncation=True, max_length=self.max_length, add_special_tokens=False)
                logits = self.model(**enc.to(self.device)).logits
                scores.extend(logits[:, 0].float().cpu().tolist())
        return scores


@builtin("reward_model", RewardModelParams, stateful=True)
def reward_model(params: RewardModelParams, device: str = "cpu", base_dir: Path = Path(".")) -> RewardFn:
    """r = logit 0 of a sequence-classification model on prompt + completion (TRL's convention), scored in
    batches of batch_size on the trainer's device; texts are cut to max_length tokens."""
    return RewardModel(params, device, base_dir)
