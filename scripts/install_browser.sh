#!/usr/bin/env bash
# Chromium and its WebDriver from the distribution's packages, when missing: the
# console's browser tests drive a real headless browser.
set -euo pipefail
if command -v chromium > /dev/null && command -v chromedriver > /dev/null; then
  exit 0
fi
if [ "$(id -u)" != "0" ] && ! command -v sudo > /dev/null; then
  echo "install_browser: chromium and chromium-driver are missing and this user cannot install packages" >&2
  exit 1
fi
run() { if [ "$(id -u)" = "0" ]; then "$@"; else sudo "$@"; fi; }
echo "installing chromium chromium-driver"
run apt-get update -qq
DEBIAN_FRONTEND=noninteractive run apt-get install -y -qq chromium chromium-driver > /dev/null
