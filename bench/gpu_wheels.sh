#!/usr/bin/env bash
# The wheels bench/gpu_check.sh carries to a GPU machine that has no network (the lent H200: Python 3.12, torch
# 2.11, transformers 5.17, and no pydantic, datasets, trl or math-verify). Run here, where PyPI is reachable:
#   bash bench/gpu_wheels.sh [DEST=.gpu-wheels] [PYTHON_VERSION=3.12]
# then pass DEST in the device call's carry list. Versions are this project's pins (pyproject.toml) and the
# versions .venv resolved for their dependencies; --no-deps, so nothing the machine already has is replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.gpu-wheels}"
pyver="${2:-3.12}"
pins=(pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
      datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 trl==1.16.0
      math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2)
rm -rf "$dest" && mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  --implementation cp -d "$dest" "${pins[@]}"
du -sh "$dest"
