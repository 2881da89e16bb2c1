"""Agentic rollouts (docs/agent.md): tools and environments answer the model between its turns.

The door: `Agent` (the worker and the episode runner a run's `tools` section asks for), `Episode`, `Segment`,
`EpisodeRunner`, `inserted_ids`, the parsers. Floor 3, beside the rewards: it runs engines (floor 2) and its
worker is the reward worker's kind of process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.agent.episodes import EnvironmentFailed, Episode, EpisodeRunner, Segment, TemplateError, inserted_ids
from backend.agent.parsers import PARSERS, ToolCall, choose_parser
from backend.agent.worker import EnvWorker, StepResult
from backend.spec import RunSpec, ToolsSection

__all__ = ["Agent", "EnvWorker", "EnvironmentFailed", "Episode", "EpisodeRunner", "PARSERS", "Segment", "StepResult",
           "TemplateError", "ToolCall", "choose_parser", "context_window", "inserted_ids"]


def context_window(model_or_config: Any) -> int | None:
    """A model's context window (max_position_embeddings of its text config), None when it states none."""
    cfg = getattr(model_or_config, "config", model_or_config)
    cfg = getattr(cfg, "text_config", None) or cfg
    n = getattr(cfg, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


class Agent:
    """A run's tools or environment: the worker process (started here, so a broken tool file fails the launch)
    and the runner that plays episodes with it."""

    def __init__(self, tools: ToolsSection, tokenizer: Any, base_dir: Path, max_turns: int, max_tokens: int,
                 template_kwargs: dict[str, Any] | None = None, context: int | None = None):
        files = [str((Path(f) if Path(f).is_absolute() else Path(base_dir) / f).resolve()) for f in tools.files]
        self.worker = EnvWorker(files, list(tools.functions), tools.environment, tools.timeout_s, tools.max_result_chars)
        self.worker.start()
        parser = choose_parser(tools.parser, getattr(tokenizer, "chat_template", None))
        self.runner = EpisodeRunner(tokenizer, self.worker, parser, max_turns, max_tokens, template_kwargs, context)

    @classmethod
    def of_run(cls, spec: RunSpec, tokenizer: Any, base_dir: Path, model_context: int | None) -> Agent:
        """The agent a run's spec asks for: its tools, turn and token bounds, the chat-template arguments the
        prompt was rendered with, and the context of the engine that samples (an engine sized smaller by
        rollout.max_model_len refuses longer episodes)."""
        r = spec.rollout
        context = min((c for c in (model_context, r.engine_context) if c), default=None)
        return cls(spec.tools, tokenizer, base_dir, r.max_turns, r.max_completion_length,
                   dict(spec.data.chat_template_kwargs), context)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas, as `apply_chat_template(tools=...)` takes them ([] for an environment)."""
        return self.worker.schemas

    def close(self) -> None:
        self.worker.close()
