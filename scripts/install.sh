#!/usr/bin/env bash
# Creates .venv in the repository and installs Tether with the server and test
# extras. Safe to run again: it only installs what is missing or changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[install] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
# torch is pinned to 2.13.0 in pyproject.toml: on a CPU machine that resolves to
# the CPU wheel; an unpinned torch would pull several GB of CUDA packages.
echo "[install] installing tether[server,multiagent,test] into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[server,multiagent,test]'
# MinAtar for bench/e2e_minatar.py: its game code needs numpy only; its optional
# plotting dependencies (matplotlib, pandas, seaborn) are left out.
if ! .venv/bin/python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("minatar") is None)'; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps 'minatar==1.0.15'
fi
echo "[install] done: $(.venv/bin/python -c 'import torch, onnxruntime; print("torch", torch.__version__, "| onnxruntime", onnxruntime.__version__)')"
