#!/usr/bin/env bash
# Prove every documented install profile resolves with pip's resolver (metadata only, nothing installed):
# base CPU (with its lock), CPU vLLM (with its lock), GPU (vllm + deepspeed), LMDeploy's own environment.
# Each takes about 1-2 minutes here (PyPI metadata); the whole script is bounded by PROFILE_TIMEOUT per profile.
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
case "$py" in */*) py="$(realpath -s "$py")" ;; esac  # a path stays valid after the cd below; a venv's link is kept
# resolve from a copy of the tracked files: preparing the project's metadata writes grpo_studio.egg-info, which
# the installs CI runs beside this check write too
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$src" 2>/dev/null || true
else
  cp -r pyproject.toml requirements app backend "$src"/
fi
cd "$src"
limit="${PROFILE_TIMEOUT:-600}"
fail=0
check() {
  local name="$1"; shift
  local t0=$SECONDS
  if timeout "$limit" "$py" -m pip install --dry-run --ignore-installed --quiet "$@" >"/tmp/profile-$name.log" 2>&1; then
    echo "profile $name: resolves ($((SECONDS - t0)) s)"
  else
    echo "profile $name: DOES NOT RESOLVE ($((SECONDS - t0)) s)"; grep -v '^WARNING' "/tmp/profile-$name.log" | tail -15
    fail=1
  fi
}
check base -c requirements/cpu.lock ".[test,bench]"
check cpu-vllm -c requirements/cpu-vllm.lock ".[cpu-vllm]"
check gpu ".[gpu]"
check lmdeploy -r requirements/lmdeploy.txt
exit "$fail"
