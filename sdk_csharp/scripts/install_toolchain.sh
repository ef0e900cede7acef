#!/usr/bin/env bash
# Installs what the C# SDK builds and tests with, from the distribution's
# packages, when it is missing: mono's C# compiler (mcs, C# 7.2 as Unity
# accepts), NUnit 2.6 and its console runner, and Newtonsoft.Json.
set -euo pipefail
missing=()
command -v mcs >/dev/null 2>&1 || missing+=(mono-mcs)
command -v nunit-console >/dev/null 2>&1 || missing+=(nunit-console)
pkg-config --exists nunit 2>/dev/null || missing+=(libnunit-cil-dev)
pkg-config --exists newtonsoft-json 2>/dev/null || missing+=(libnewtonsoft-json-cil-dev)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "sdk_csharp: installing ${missing[*]}" >&2
sudo_=""
if [ "$(id -u)" != "0" ]; then sudo_="sudo"; fi
$sudo_ apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
