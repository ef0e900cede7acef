#!/usr/bin/env bash
# Creates .venv-ray at the repository root: a separate virtual environment with
# RLlib's own RLlink v1 implementation (ray[rllib]==2.48.0), used as the peer in
# tests/interop/ (Tether server <-> RLlib's client, Tether SDK <-> RLlib's server).
#
#   bash scripts/install_ray_peer.sh          # install, or do nothing if present
#   PYTHON=python3.11 bash scripts/install_ray_peer.sh
#
# torch is pinned to 2.13.0 so that pip takes the local CPU wheel; an open range
# would pull a CUDA build of several GB. onnxruntime is not a dependency of
# ray[rllib], but RLlib's tcp_client_inference_env_runner module imports it, so
# it is installed too (same range as Tether's SDK).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-ray"
PYTHON="${PYTHON:-python3}"
PACKAGES=("ray[rllib]==2.48.0" "pillow" "torch==2.13.0" "onnx" "onnxscript" "onnxruntime>=1.31,<1.32")

# Succeeds when every package is installed at the version the tests need.
check_installed() {
    "$VENV/bin/python" - <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

want = {"ray": "2.48.0", "torch": "2.13.0", "pillow": None, "onnx": None, "onnxscript": None,
        "onnxruntime": None, "gymnasium": None}
try:
    for name, pinned in want.items():
        found = version(name)
        if pinned is not None and found.split("+")[0] != pinned:
            sys.exit(f"{name} {found} installed, {pinned} needed")
except PackageNotFoundError as exc:
    sys.exit(f"{exc} is not installed")
EOF
}

if [ -x "$VENV/bin/python" ] && check_installed 2>/dev/null; then
    echo "[install_ray_peer] $VENV already has ray[rllib]==2.48.0, torch==2.13.0, onnx, onnxscript, onnxruntime, pillow: nothing to do"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "[install_ray_peer] creating virtual environment $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
else
    echo "[install_ray_peer] $VENV exists but is incomplete; installing what is missing"
fi

echo "[install_ray_peer] pip install ${PACKAGES[*]}"
"$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q "${PACKAGES[@]}"

if ! check_installed; then
    echo "[install_ray_peer] installation finished but the check above failed" >&2
    exit 1
fi
echo "[install_ray_peer] done: $("$VENV/bin/python" -c 'import ray, torch; print(f"ray {ray.__version__}, torch {torch.__version__}")')"
echo "[install_ray_peer] run the interop tests with: .venv/bin/python -m pytest -m ray tests/interop"
