"""Chat with a model or checkpoint: the reply streamed piece by piece as it is generated.

The conversation goes through the tokenizer's chat template (with the generation prompt); a tokenizer
without one (the tiny addition model) gets the last user message as plain text, with the system
prompt on the line before, as the trainer renders such prompts. Sampling: temperature 0 = greedy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.eval.refs import ModelChoice, load_model, load_tokenizer, resolve_model


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


class ChatModel:
    def __init__(self, ref: str, base_dir: str | Path = ".", device: str = "cpu") -> None:
        self.choice: ModelChoice = resolve_model(ref, base_dir)
        self.tok = load_tokenizer(self.choice)
        self.model = load_model(self.choice, device)
        self.device = device
        self.ref = ref

    def stream(self, messages: list[dict[str, str]], s: ChatSettings = ChatSettings()) -> Iterator[str]:
        """Yield the reply so far after each new piece of text (the last yield is the full reply)."""
        from transformers import TextIteratorStreamer

        text = render_chat(self.tok, messages, s.system_prompt)
        enc = self.tok(text, return_tensors="pt", add_special_tokens=False).to(self.device)
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
