#!/usr/bin/env bash
# Set up (venv, pinned packages, Chromium for the browser tests) and run the whole test suite.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,bench
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Chromium (and a CJK font for the Chinese screenshots) for the browser tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-wqy-microhei >/dev/null) \
    || echo "could not install chromium: browser tests will be skipped"
fi
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
