"""Tool calls out of the model's text: the Qwen/Hermes format and Llama 3's JSON format.

    hermes   <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>   (Qwen2.5/3, Hermes, many others)
    llama3   {"name": "add", "parameters": {"a": 1, "b": 2}}   the whole turn, optionally after <|python_tag|>

A call that does not parse (bad JSON, no name, arguments that are not an object) is still a `ToolCall`, with
`error` set: the episode returns that error to the model as the tool's answer and counts it, as it counts a tool
that raises. `choose_parser` reads the model's chat template, so `tools.parser: auto` needs no configuration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_HERMES_OPEN = re.compile(r"<tool_call>(?!.*</tool_call>)\s*(.*)$", re.DOTALL)  # a call the turn never closed


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the call could not be parsed; it is then never run

    def as_message_call(self) -> dict[str, Any]:
        """The call as chat templates and TRL's reward functions take it."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call_from_json(raw: str, args_key: tuple[str, ...]) -> ToolCall:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as err:
        return ToolCall("", {}, f"the tool call is not valid JSON ({err.msg} at character {err.pos}): {raw[:200]!r}")
    if not isinstance(obj, dict):
        return ToolCall("", {}, f"the tool call is not a JSON object: {raw[:200]!r}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", {}, f"the tool call has no \"name\": {raw[:200]!r}")
    args: Any = {}
    for key in args_key:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):  # some models write the arguments as a JSON string (OpenAI's wire format)
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(name, {}, f"the arguments of {name!r} are a string that is not JSON: {args[:200]!r}")
    if not isinstance(args, dict):
        return ToolCall(name, {}, f"the arguments of {name!r} are not a JSON object: {args!r:.200}")
    return ToolCall(name, args)


def parse_hermes(text: str) -> list[ToolCall]:
    calls = [_call_from_json(m.group(1), ("arguments", "parameters")) for m in _HERMES.finditer(text)]
    tail = _HERMES_OPEN.search(text)
    if tail is not None:  # an opened, never closed call is an attempt: answered with an error, not ignored
        call = _call_from_json(tail.group(1), ("arguments", "parameters"))
        calls.append(ToolCall(call.name, call.arguments, call.error or "the tool call has no closing </tool_call>"))
    return calls


def parse_llama3(text: str) -> list[ToolCall]:
    body = text.replace("<|python_tag|>", "").replace("<|eom_id|>", "").replace("<|eot_id|>", "").strip()
    if not body.startswith("{"):
        return []  # prose: the model answered
    parts = [p for p in (s.strip() for s in body.split(";")) if p] if "};" in body else [body]
    return [_call_from_json(p, ("parameters", "arguments")) for p in parts]


PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {"hermes": parse_hermes, "llama3": parse_llama3}


def choose_parser(setting: str, chat_template: str | None) -> str:
    """The parser a run uses: the setting, or for "auto" the format the chat template writes."""
    if setting != "auto":
        return setting
    template = chat_template or ""
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    return "hermes"
