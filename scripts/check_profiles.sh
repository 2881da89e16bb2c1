#!/usr/bin/env bash
# Prove every documented install profile resolves with pip's resolver (metadata only, nothing installed):
# base CPU (with its lock), CPU vLLM (with its lock), GPU (vllm + deepspeed), LMDeploy's own environment.
# Each takes about 1-2 minutes here (PyPI metadata); the whole script is bounded by PROFILE_TIMEOUT per profile.
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
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
