"""One module per Build-tab section (LlamaBoard style): each lays out its RunSpec fields and its own helpers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.config import StudioConfig
from app.fields import FormUI, Registry


@dataclass
class BuildContext:
    config: StudioConfig
    form: FormUI
    reg: Registry
    values: dict[str, Any]  # initial widget values (the default preset)
    lang: str
    lang_input: Any  # the language selector, an input of every handler that writes messages
    deferred: list[Callable[[], Any]] = field(default_factory=list)  # wirings that need the whole form
