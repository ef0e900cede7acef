#!/usr/bin/env bash
# Fetches onnxruntime-web (pinned) from npm into examples/browser/vendor/ (ignored by
# git: its WebAssembly files are large): the UMD script and the wasm it loads.
set -euo pipefail
version="1.30.0"
here="$(cd "$(dirname "$0")" && pwd)"
dest="$here/vendor"
if [ -f "$dest/VERSION.txt" ] && [ "$(cat "$dest/VERSION.txt")" = "onnxruntime-web $version" ]; then
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "onnxruntime-web@$version" > /dev/null && tar -xzf "onnxruntime-web-$version.tgz")
mkdir -p "$dest"
cp "$work/package/dist/ort.wasm.min.js" "$work/package/dist/ort-wasm-simd-threaded.wasm" \
   "$work/package/dist/ort-wasm-simd-threaded.mjs" "$dest/"
cp "$work/package/README.md" "$dest/README.onnxruntime-web.md"  # its licence: MIT (package.json)
echo "onnxruntime-web $version" > "$dest/VERSION.txt"
echo "fetched onnxruntime-web $version into $dest"
