#!/usr/bin/env bash
# Copies the engine-independent C++ SDK into the Unreal plugin's TetherSdk module:
#   sdk_cpp/include/tether        -> Tether/Source/TetherSdk/Public/tether
#   sdk_cpp/src (minus the ONNX Runtime backend: Unreal runs models with NNE)
#                                 -> Tether/Source/TetherSdk/Private/Sdk
#   nlohmann/json's header        -> Tether/Source/TetherSdk/Public/nlohmann
# nlohmann/json comes from NLOHMANN_JSON_INCLUDE (a folder holding nlohmann/json.hpp)
# or the system's (Debian/Ubuntu: nlohmann-json3-dev). Run it once after cloning and
# again after updating the SDK; the copies are not committed.
# Usage: sdk_cpp/unreal/vendor_sdk.sh [PLUGIN_DIR]   (default: sdk_cpp/unreal/Tether)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SDK="$(cd "${HERE}/.." && pwd)"
PLUGIN="${1:-${HERE}/Tether}"
MODULE="${PLUGIN}/Source/TetherSdk"
JSON_INCLUDE="${NLOHMANN_JSON_INCLUDE:-/usr/include}"

if [[ ! -f "${JSON_INCLUDE}/nlohmann/json.hpp" ]]; then
  echo "vendor_sdk.sh: ${JSON_INCLUDE}/nlohmann/json.hpp not found; set NLOHMANN_JSON_INCLUDE to the folder" \
       "that holds nlohmann/json.hpp (or install nlohmann-json3-dev)" >&2
  exit 1
fi

rm -rf "${MODULE}/Public/tether" "${MODULE}/Public/nlohmann" "${MODULE}/Private/Sdk"
mkdir -p "${MODULE}/Public" "${MODULE}/Private/Sdk/platform"
cp -R "${SDK}/include/tether" "${MODULE}/Public/tether"
rm -f "${MODULE}/Public/tether/onnxruntime_backend.h"
for source in "${SDK}"/src/*.cpp "${SDK}"/src/*.h; do
  [[ "$(basename "${source}")" == "onnxruntime_backend.cpp" ]] && continue
  cp "${source}" "${MODULE}/Private/Sdk/"
done
cp "${SDK}"/src/platform/*.cpp "${MODULE}/Private/Sdk/platform/"
cp -R "${JSON_INCLUDE}/nlohmann" "${MODULE}/Public/nlohmann"
echo "vendored the Tether SDK into ${MODULE}"
