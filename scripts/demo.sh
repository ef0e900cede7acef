#!/usr/bin/env bash
# Installs Tether and runs the demo: a server and example CartPole client(s)
# learning until the mean return of the last 100 episodes reaches 450.
# Extra arguments go to `tether demo` (e.g. --clients 4).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/tether demo "$@"
