#!/usr/bin/env bash
# Create .venv and install GRPO Studio with pinned versions. Safe to re-run: skips what is already there.
# Usage: bash scripts/setup.sh [extras, e.g. test,bench]
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
stamp=".venv/.installed-$(cat pyproject.toml requirements/cpu.lock | sha1sum | cut -c1-12)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  if [ -n "$extras" ]; then
    .venv/bin/python -m pip install -q -c requirements/cpu.lock -e ".[$extras]"
  else
    .venv/bin/python -m pip install -q -c requirements/cpu.lock -e .
  fi
  touch "$stamp"
fi
