#!/usr/bin/env bash
# Set up this checkout on a fresh machine: torch (the CPU build where there is no NVIDIA GPU,
# so pip does not pull a multi-GB CUDA build), then the workbench and its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "$PY" -m pip install -q torch
  else
    "$PY" -m pip install -q torch==2.13.0
  fi
fi
"$PY" -m pip install -q -e '.[test,plots]'  # plots: the plot tests run in CI too
# SASS for the compile tests (optional: without it they check PTX and cubin only)
"$PY" -m pip install -q nvidia-cuda-nvdisasm || echo "bootstrap: nvdisasm not installed; SASS checks skipped"
echo "bootstrap: ok ($("$PY" -c 'import torch, cutlass; print("torch", torch.__version__)'))"
