#!/usr/bin/env bash
# Set up (venv, pinned packages) and start the studio on http://127.0.0.1:7860 .
# Usage: bash scripts/studio.sh [launch.py options, e.g. --port 8000]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python launch.py "$@"
