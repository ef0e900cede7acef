#!/usr/bin/env bash
# Fetches ONNX Runtime's CPU C library and headers for Linux x64 into
# sdk_cpp/third_party/onnxruntime/{include,lib}, laid out like ONNX Runtime's
# official release archives, so a user's own download works the same way
# (point ONNXRUNTIME_ROOT at it).
#
# Debian has no onnxruntime package, the PyPI wheel has no headers and npm's
# onnxruntime-node has no headers; the Unity plugin com.github.asus4.onnxruntime
# ships both (ORT 1.29.0). Idempotent: does nothing if the library is already there.
#
# Usage: sdk_cpp/scripts/fetch_onnxruntime.sh [DEST]   (DEST defaults to sdk_cpp/third_party/onnxruntime)
set -euo pipefail

PACKAGE="com.github.asus4.onnxruntime"
VERSION="0.4.9"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${1:-${SCRIPT_DIR}/../third_party/onnxruntime}"
mkdir -p "${DEST}"
DEST="$(cd "${DEST}" && pwd)"

if [[ -f "${DEST}/include/onnxruntime_c_api.h" && -e "${DEST}/lib/libonnxruntime.so" ]]; then
  echo "ONNX Runtime already in ${DEST}"
  exit 0
fi

if [[ "$(uname -s)" != "Linux" || "$(uname -m)" != "x86_64" ]]; then
  echo "fetch_onnxruntime.sh: only Linux x86_64 is fetched here; download an ONNX Runtime release" >&2
  echo "archive for your platform and pass -DONNXRUNTIME_ROOT=<its folder>" >&2
  exit 1
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_onnxruntime.sh: npm is needed to fetch ${PACKAGE}@${VERSION}" >&2
  exit 1
fi

WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT
echo "Fetching ${PACKAGE}@${VERSION} (about 150 MB) ..."
(cd "${WORK}" && npm pack --silent "${PACKAGE}@${VERSION}" >/dev/null)
HEADERS='package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers'
tar xzf "${WORK}/${PACKAGE}-${VERSION}.tgz" -C "${WORK}" package/Plugins/Linux/x64 "${HEADERS}"

mkdir -p "${DEST}/include" "${DEST}/lib"
cp "${WORK}/${HEADERS}"/*.h "${DEST}/include/"
# The plugin ships libonnxruntime.so whose soname is libonnxruntime.so.1; lay it
# out as a release archive does: the versioned file plus .so.1 and .so links.
PLUGIN="${WORK}/package/Plugins/Linux/x64"
if [[ ! -f "${PLUGIN}/libonnxruntime.so" ]]; then
  echo "fetch_onnxruntime.sh: no libonnxruntime.so in the package" >&2
  exit 1
fi
cp "${PLUGIN}/libonnxruntime.so" "${DEST}/lib/libonnxruntime.so.1.29.0"
if [[ -f "${PLUGIN}/libonnxruntime_providers_shared.so" ]]; then
  cp "${PLUGIN}/libonnxruntime_providers_shared.so" "${DEST}/lib/"
fi
ln -sf libonnxruntime.so.1.29.0 "${DEST}/lib/libonnxruntime.so.1"
ln -sf libonnxruntime.so.1 "${DEST}/lib/libonnxruntime.so"
echo "ONNX Runtime ${VERSION} plugin (ORT 1.29.0) installed in ${DEST} (include/, lib/)"
