"""sdk_csharp/ is a Unity package a project can add by git URL or local path.

Unity ignores an immutable package's assets that have no .meta file, so every
file and folder it imports has one (sdk_csharp/scripts/write_meta.py), with a
GUID of its own. The core compiles without UnityEngine; the Unity layer is
compiled only inside Unity (UNITY_5_3_OR_NEWER) and the Inference Engine
backend only with that package (a versionDefine).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sdk_csharp"


def test_every_imported_asset_has_a_meta_file_with_its_own_guid() -> None:
    check = subprocess.run([sys.executable, str(PACKAGE / "scripts" / "write_meta.py"), "--check"], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tracked = subprocess.run(["git", "ls-files", "sdk_csharp"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    metas = [REPO / f for f in tracked if f.endswith(".meta")]
    assert len(metas) > 40
    guids = [re.search(r"^guid: ([0-9a-f]{32})$", m.read_text(), re.MULTILINE).group(1) for m in metas]
    assert len(set(guids)) == len(guids)
    # Every tracked asset outside the folders Unity skips has its .meta committed.
    for name in tracked:
        parts = Path(name).relative_to("sdk_csharp").parts
        if name.endswith(".meta") or any(p.endswith("~") or p.startswith(".") for p in parts):
            continue
        assert name + ".meta" in tracked, f"{name} has no committed .meta"


def test_manifest_and_assembly_definitions() -> None:
    manifest = json.loads((PACKAGE / "package.json").read_text())
    assert manifest["name"] == "com.tether.sdk" and re.fullmatch(r"\d+\.\d+\.\d+", manifest["version"])
    assert "com.unity.nuget.newtonsoft-json" in manifest["dependencies"] and manifest["unity"]
    for sample in manifest["samples"]:
        assert (PACKAGE / sample["path"]).is_dir() and list((PACKAGE / sample["path"]).glob("*.cs"))
    assert (PACKAGE / "Documentation~" / "index.md").is_file()
    tests = json.loads((PACKAGE / "Tests" / "Tether.Tests.asmdef").read_text())
    assert tests["defineConstraints"] == ["UNITY_INCLUDE_TESTS"] and "Tether.Runtime" in tests["references"]
    unity = json.loads((PACKAGE / "Runtime" / "Unity" / "Tether.Unity.asmdef").read_text())
    assert {"name": "com.unity.ai.inference", "expression": "2.2.0", "define": "TETHER_INFERENCE_ENGINE"} in unity["versionDefines"]
    assert "Tether.Runtime" in unity["references"]


def test_the_core_has_no_unity_dependency_and_the_unity_layer_compiles_only_inside_unity() -> None:
    for source in (PACKAGE / "Runtime").rglob("*.cs"):
        text = source.read_text()
        if "Unity" in source.relative_to(PACKAGE / "Runtime").parts:
            assert text.count("#if UNITY_5_3_OR_NEWER") == 1 and text.rstrip().endswith("#endif"), source
        else:
            assert "using UnityEngine" not in text and "using Unity." not in text, source
    backend = (PACKAGE / "Runtime" / "Unity" / "InferenceEngineBackend.cs").read_text()
    assert "#if UNITY_5_3_OR_NEWER && TETHER_INFERENCE_ENGINE" in backend
