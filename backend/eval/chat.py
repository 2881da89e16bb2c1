"""Chat with a model or checkpoint: the reply streamed piece by piece as it is generated.

The conversation goes through the tokenizer's chat template (with the generation prompt); a tokenizer
without one (the tiny addition model) gets the last user message as plain text, with the system
prompt on the line before, as the trainer renders such prompts. Sampling: temperature 0 = greedy.

A user message may carry images (`"images": [path, ...]`): a vision-language model gets them through its
processor the way the trainer renders an image row (backend.multimodal: image placeholders first in the turn,
expanded to the image's patch tokens); a text-only model refuses them with ChatError rather than drop them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.eval.refs import ModelChoice, load_model, load_processor, load_tokenizer, model_config, resolve_model


@dataclass(frozen=True)
class ChatSettings:
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    seed: int = 0
    system_prompt: str = ""


def render_chat(tok: Any, messages: list[dict[str, str]], system_prompt: str = "") -> str:
    if system_prompt and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": system_prompt}, *messages]
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    last = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    return f"{system_prompt}\n{last}" if system_prompt else last


class ChatError(ValueError):
    pass


def vision_messages(messages: list[dict[str, Any]], system_prompt: str = "") -> tuple[list[dict[str, Any]], list[str]]:
    """Chat messages whose user turns carry `images` -> processor messages (each turn's image parts, then its
    text) and the image references in the order their placeholders appear."""
    out: list[dict[str, Any]] = []
    refs: list[str] = []
    for m in messages:
        imgs = list(m.get("images") or [])
        refs += imgs
        if m["role"] == "user":
            out.append({"role": "user", "content": [{"type": "image"}] * len(imgs) + [{"type": "text", "text": m["content"]}]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if system_prompt and not any(m["role"] == "system" for m in out):
        out = [{"role": "system", "content": system_prompt}, *out]
    return out, refs


class ChatModel:
    def __init__(self, ref: str, base_dir: str | Path = ".", device: str = "cpu") -> None:
        from backend.multimodal import is_vision_config

        self.choice: ModelChoice = resolve_model(ref, base_dir)
        self.tok = load_tokenizer(self.choice)
        self.model = load_model(self.choice, device)
        self.vision = load_processor(self.choice, self.tok) if is_vision_config(model_config(self.choice)) else None
        self.base_dir = Path(base_dir)
        self.device = device
        self.ref = ref

    def inputs(self, messages: list[dict[str, Any]], system_prompt: str = "") -> dict[str, torch.Tensor]:
        """generate()'s inputs for a conversation: token ids and mask, and a vision model's image inputs."""
        if self.vision is None:
            if any(m.get("images") for m in messages):
                raise ChatError(f"{self.ref} is a text-only model: it takes no images")
            text = render_chat(self.tok, messages, system_prompt)
            return dict(self.tok(text, return_tensors="pt", add_special_tokens=False).to(self.device))
        from backend.multimodal import MediaError, load_image, mm_token_types

        msgs, refs = vision_messages(messages, system_prompt)
        try:
            mm = self.vision.encode(msgs, [load_image(r, self.base_dir) for r in refs])
        except MediaError as err:
            raise ChatError(str(err)) from err
        ids = torch.tensor([mm.ids], device=self.device)
        # without the token types generate() silently falls back to 1-D positions (answers then go wrong)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "mm_token_type_ids": mm_token_types(self.model.config, ids),
                **{k: v.to(self.device) for k, v in mm.media.items()}}

    def stream(self, messages: list[dict[str, Any]], s: ChatSettings = ChatSettings()) -> Iterator[str]:
        """Yield the reply so far after each new piece of text (the last yield is the full reply)."""
        from transformers import TextIteratorStreamer

        enc = self.inputs(messages, s.system_prompt)
        streamer = TextIteratorStreamer(self.tok, skip_prompt=True, skip_special_tokens=True, timeout=300)
        greedy = s.temperature <= 0
        kw: dict[str, Any] = {**enc, "streamer": streamer, "max_new_tokens": s.max_new_tokens, "do_sample": not greedy,
                              "pad_token_id": self.tok.pad_token_id}
        if not greedy:
            kw.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
        errors: list[BaseException] = []

        def work() -> None:
            try:
                torch.manual_seed(s.seed)
                with torch.no_grad():
                    self.model.generate(**kw)
            except BaseException as err:  # surfaced to the reader below
                errors.append(err)
                streamer.end()

        th = threading.Thread(target=work, daemon=True)
        th.start()
        reply = ""
        for piece in streamer:
            reply += piece
            yield reply
        th.join()
        if errors:
            raise errors[0]
        if not reply:
            yield reply
