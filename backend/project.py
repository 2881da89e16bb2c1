"""Where this project lives, and the environment its child processes (trainer, reward worker, rollout
workers, the reward checker) start with: one home for both, so every child imports this checkout."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ with this checkout first on PYTHONPATH and unbuffered output (logs arrive as written)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env
