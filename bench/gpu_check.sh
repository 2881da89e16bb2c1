#!/usr/bin/env bash
# One prepared GPU check, at most 10 minutes, installing nothing from a network (see bench/gpu_check.py):
# the trainer in bf16 with the transformers engine, a random-initialised Qwen2.5-1.5B-sized model against
# TRL on the same GPU, and vLLM where this machine's venv has it. Run it from the repo root with the
# project's venv present:   bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
[ -x "$py" ] || py=python3
nvidia-smi --query-gpu=index,name,memory.total --format=csv || { echo "no GPU visible"; exit 1; }
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 590 "$py" -m bench.gpu_check
