#!/usr/bin/env bash
# Builds the C# SDK's core with mono's mcs (C# 7.2, as Unity accepts; XML docs
# required on every public member) and runs its NUnit tests. Prints
# "N passed, N failed" last; exits non-zero when a test failed or none ran.
#
#   bash sdk_csharp/scripts/build_and_test.sh [--build-only]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/.." && pwd)"
out="${TETHER_CSHARP_BUILD_DIR:-$here/.build}"  # hidden: Unity does not import it when the package is added from this folder
mkdir -p "$out"
newtonsoft="$(pkg-config --libs newtonsoft-json | tr ' ' '\n' | sed -n 's/^-r://p' | head -1)"
nunit_framework="$(pkg-config --libs nunit | tr ' ' '\n' | sed -n 's/^-r://p' | grep 'nunit.framework.dll$')"
cp -f "$newtonsoft" "$nunit_framework" "$out/"

runtime_sources=()
while IFS= read -r -d '' f; do runtime_sources+=("$f"); done < <(find "$here/Runtime" -name '*.cs' -not -path '*/Unity/*' -print0 | sort -z)
test_sources=()
while IFS= read -r -d '' f; do test_sources+=("$f"); done < <(find "$here/Tests" -name '*.cs' -print0 | sort -z)

# CS1591: a public member without an XML doc comment is an error.
mcs -nologo -langversion:7.2 -target:library -optimize+ -debug:portable -warnaserror+:CS1591 \
  -doc:"$out/Tether.Runtime.xml" -out:"$out/Tether.Runtime.dll" \
  -r:System.Numerics.dll -r:"$out/Newtonsoft.Json.dll" "${runtime_sources[@]}"
mcs -nologo -langversion:7.2 -target:library -debug:portable -out:"$out/Tether.Tests.dll" \
  -r:System.Numerics.dll -r:"$out/Newtonsoft.Json.dll" -r:"$out/nunit.framework.dll" -r:"$out/Tether.Runtime.dll" \
  "${test_sources[@]}"
# The Unity layer compiles only inside Unity; here it is type-checked against the few
# UnityEngine declarations it uses (tests/csharp/unity_api), XML docs required.
mcs -nologo -langversion:7.2 -target:library -out:"$out/UnityEngineSurface.dll" "$repo/tests/csharp/unity_api/UnityEngineSurface.cs"
mcs -nologo -langversion:7.2 -target:library -define:UNITY_5_3_OR_NEWER -warnaserror+:CS1591 \
  -doc:"$out/Tether.Unity.xml" -out:"$out/Tether.Unity.check.dll" \
  -r:System.Numerics.dll -r:"$out/Newtonsoft.Json.dll" -r:"$out/Tether.Runtime.dll" -r:"$out/UnityEngineSurface.dll" \
  "$here"/Runtime/Unity/*.cs
mcs -nologo -langversion:7.2 -target:library -out:"$out/Tether.Samples.check.dll" \
  -r:"$out/Tether.Runtime.dll" -r:"$out/UnityEngineSurface.dll" -r:"$out/Tether.Unity.check.dll" \
  "$here"/Samples~/*/*.cs
# The example programs (examples/csharp/*.cs, one program each, with what they share in Shared/).
mkdir -p "$out/examples"
for example in "$repo"/examples/csharp/*.cs; do
  name="$(basename "$example" .cs | tr 'A-Z' 'a-z')"
  mcs -nologo -langversion:7.2 -target:exe -optimize+ -out:"$out/examples/$name.exe" \
    -r:System.Numerics.dll -r:"$out/Newtonsoft.Json.dll" -r:"$out/Tether.Runtime.dll" "$example" \
    "$repo"/examples/csharp/Shared/*.cs
done
cp -f "$out/Tether.Runtime.dll" "$out/Newtonsoft.Json.dll" "$out/examples/"
# The latency benchmark's program (bench/act_latency.py runs it).
mcs -nologo -langversion:7.2 -target:exe -optimize+ -out:"$out/act_latency.exe" \
  -r:System.Numerics.dll -r:"$out/Newtonsoft.Json.dll" -r:"$out/Tether.Runtime.dll" "$here/Bench~/ActLatency.cs"
if [ "${1:-}" = "--build-only" ]; then
  exit 0
fi

export TETHER_CONFORMANCE_DIR="$repo/tests/conformance"
# The native ONNX Runtime library the repo fetches (sdk_cpp/scripts/fetch_onnxruntime.sh).
export LD_LIBRARY_PATH="$repo/sdk_cpp/third_party/onnxruntime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
set +e
(cd "$out" && nunit-console Tether.Tests.dll -nologo -labels -xml=TestResult.xml)
rc=$?
set -e
python3 - "$out/TestResult.xml" "$rc" <<'PY'
import sys
import xml.etree.ElementTree as ET

path, rc = sys.argv[1], int(sys.argv[2])
try:
    cases = ET.parse(path).getroot().iter("test-case")
except (OSError, ET.ParseError) as exc:
    print(f"sdk_csharp: no test results ({exc}); nunit-console exited {rc}")
    print("0 passed, 1 failed")
    sys.exit(1)
passed = failed = 0
for case in cases:
    if case.get("executed") != "True":
        continue
    if case.get("success") == "True":
        passed += 1
    else:
        failed += 1
        print(f"FAILED {case.get('name')}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed or passed == 0 or rc != 0 else 0)
PY
