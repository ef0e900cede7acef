#!/usr/bin/env bash
# Installs the C++ SDK's build tools with apt-get when some are missing and we
# are root (CI containers); otherwise says what is missing and leaves it at that.
# Usage: sdk_cpp/scripts/install_toolchain.sh
set -euo pipefail

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
[[ -f /usr/include/nlohmann/json.hpp ]] || missing+=(nlohmann-json3-dev)
[[ -f /usr/include/gtest/gtest.h ]] || missing+=(libgtest-dev)

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ "$(id -u)" != "0" ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_toolchain.sh: missing ${missing[*]}; install them (apt-get install ${missing[*]})" >&2
  exit 0
fi
echo "Installing ${missing[*]} ..."
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${missing[@]}" || {
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
}
