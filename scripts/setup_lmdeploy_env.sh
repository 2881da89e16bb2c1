#!/usr/bin/env bash
# LMDeploy's own environment (.venv-lmdeploy, or $LMDEPLOY_VENV) for rollout workers on a CUDA machine:
#   bash scripts/setup_lmdeploy_env.sh
#   python -m backend.train --config ... --set rollout.engine=lmdeploy --set rollout.worker_python=.venv-lmdeploy/bin/python
# It cannot share the trainer's venv: lmdeploy 0.18 pins torch<=2.12.1, torchvision<=0.27.1, peft<=0.14.0.
# The worker runs this project's code from the checkout (PYTHONPATH), so only lmdeploy's own needs go here.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LMDEPLOY_VENV:-.venv-lmdeploy}"
py="${PYTHON:-python3}"
if ! command -v nvidia-smi >/dev/null; then
  echo "LMDeploy needs a CUDA GPU (nvidia-smi not found); its wheel will install but not run here" >&2
fi
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q -r requirements/lmdeploy.txt
"$venv/bin/python" -c "import lmdeploy; print('lmdeploy', lmdeploy.__version__)"
