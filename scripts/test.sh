#!/usr/bin/env bash
# Installs everything and runs the whole test suite. The RLlib interoperability
# tests need RLlib's own RLlink peer in .venv-ray; set TETHER_SKIP_RAY=1 to skip
# installing it (those tests then report that they were skipped and why).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# The C++ SDK's toolchain (cmake, g++, nlohmann-json, GoogleTest) from the distribution's
# packages when missing, and ONNX Runtime's C library and headers (sdk_cpp/third_party/).
bash sdk_cpp/scripts/install_toolchain.sh
bash sdk_cpp/scripts/fetch_onnxruntime.sh
# The C# SDK's toolchain (mono's mcs, NUnit 2.6, Newtonsoft.Json) from the distribution's packages when missing.
bash sdk_csharp/scripts/install_toolchain.sh
# Chromium and its WebDriver (the console's and the browser CartPole's tests) from the
# distribution's packages when missing, and onnxruntime-web (examples/browser/vendor/, ignored by git).
bash scripts/install_browser.sh
bash examples/browser/fetch_onnxruntime_web.sh
if [ "${TETHER_SKIP_RAY:-0}" != "1" ] && [ -f scripts/install_ray_peer.sh ]; then
  bash scripts/install_ray_peer.sh
fi
exec .venv/bin/python -m pytest -ra "$@"
