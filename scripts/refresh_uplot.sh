#!/usr/bin/env bash
# Refreshes the console's vendored uPlot (server/console/page/vendor/) from its
# npm package, pinned here. Run it after changing the version; commit the result.
set -euo pipefail
version="1.6.32"
here="$(cd "$(dirname "$0")/.." && pwd)"
dest="$here/server/console/page/vendor"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "uplot@$version" > /dev/null && tar -xzf "uplot-$version.tgz")
mkdir -p "$dest"
cp "$work/package/dist/uPlot.iife.min.js" "$work/package/dist/uPlot.min.css" "$dest/"
cp "$work/package/LICENSE" "$dest/uPlot.LICENSE.txt"
echo "uPlot $version" > "$dest/VERSION.txt"
echo "vendored uPlot $version into $dest"
