#!/usr/bin/env bash
# One prepared GPU check, under 8 minutes, installing nothing from a network (bench/gpu_check.py): a random
# model of Qwen2.5-1.5B's shape at 1,024-token completions, our trainer and TRL's, memory by phase and s/step.
#   bash bench/gpu_check.sh [bench.gpu_check options, e.g. --device cpu --shape small --tokens 32]
# The interpreter: $PYTHON, else .venv/bin/python, else python3. Where it lacks the floor's modules, the wheels
# carried in .gpu-wheels (bench/gpu_wheels.sh; or $GPU_WHEELS) are installed into .gpu-site (or $GPU_SITE) first.
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-}"
[ -n "$py" ] || { [ -x .venv/bin/python ] && py=.venv/bin/python; } || py=python3
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
wheels="${GPU_WHEELS:-.gpu-wheels}" site="${GPU_SITE:-$PWD/.gpu-site}"
if ! "$py" -c "import pydantic, datasets" 2>/dev/null; then
  [ -d "$wheels" ] || { echo "$py lacks pydantic/datasets and no $wheels was carried (bash bench/gpu_wheels.sh)"; exit 2; }
  [ -d "$site" ] || "$py" -m pip install --quiet --no-index --no-deps --target "$site" "$wheels"/*.whl || exit 2
  export PYTHONPATH="$site:$PYTHONPATH"
fi
case " $* " in *" --device cpu "*|*" --floor "*) ;; *) nvidia-smi --query-gpu=index,name,memory.total --format=csv || true ;; esac
timeout 470 "$py" -m bench.gpu_check "$@"
