"""Per-browser-session view state, kept on the server.

Live updates run on a timer. Gradio's page spends time per event input and output (it looks each one up
in the component tree), so the ticking event has no inputs at all: what a session is looking at (run,
smoothing, axis, filters, open panels, language, tab) is written here by small events when the user
changes it, and the tick reads it by session id. What each session last drew lives here too, so
unchanged outputs are skipped.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import gradio as gr


class SessionMemo:
    def __init__(self, defaults: dict[str, Any], max_sessions: int = 512) -> None:
        self.defaults = defaults
        self.max_sessions = max_sessions
        self._memo: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, request: gr.Request | None) -> dict[str, Any]:
        key = getattr(request, "session_hash", None) or "default"
        with self._lock:
            m = self._memo.get(key)
            if m is None:
                m = self._memo[key] = copy.deepcopy(self.defaults)
            self._memo.move_to_end(key)
            while len(self._memo) > self.max_sessions:  # closed tabs are forgotten, oldest first
                self._memo.popitem(last=False)
            return m

    def setter(self, key: str, transform: Callable[[Any], Any] | None = None) -> Callable[..., None]:
        """An event handler storing the component's value under `key` for the calling session."""
        def store(value: Any, request: gr.Request) -> None:
            self.get(request)[key] = transform(value) if transform else value
        store.__name__ = f"set_{key}"
        return store
