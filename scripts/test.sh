#!/usr/bin/env bash
# Installs everything and runs the whole test suite. The RLlib interoperability
# tests need RLlib's own RLlink peer in .venv-ray; set TETHER_SKIP_RAY=1 to skip
# installing it (those tests then report that they were skipped and why).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if [ "${TETHER_SKIP_RAY:-0}" != "1" ] && [ -f scripts/install_ray_peer.sh ]; then
  bash scripts/install_ray_peer.sh
fi
exec .venv/bin/python -m pytest -ra "$@"
