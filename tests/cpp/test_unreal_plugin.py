"""The Unreal plugin (sdk_cpp/unreal/Tether) as far as it can be checked without Unreal.

Its two source folders compile only inside Unreal (they include engine
headers). What is checked here: the plugin descriptor and module rules agree
with each other and with the folders; the plugin builds the way Unreal builds
(no exceptions, no RTTI) and its code uses neither; and the SDK as
sdk_cpp/unreal/vendor_sdk.sh copies it into the TetherSdk module compiles and
links with those flags, without ONNX Runtime (Unreal runs models with NNE).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNREAL = REPO / "sdk_cpp" / "unreal"
PLUGIN = UNREAL / "Tether"
# What Unreal's compiler settings for the TetherSdk module amount to on Linux (Build.cs).
UNREAL_FLAGS = ["-std=c++17", "-fno-exceptions", "-fno-rtti", "-DJSON_NOEXCEPTION=1", "-DTETHER_NO_EXCEPTIONS=1",
                "-O0", "-Wall", "-Werror=return-type"]


def plugin_sources() -> list[Path]:
    return sorted(p for p in PLUGIN.rglob("*") if p.suffix in {".h", ".cpp", ".cs"} and "Sdk" not in p.parts[-2:-1])


def test_descriptor_modules_and_rules_agree() -> None:
    descriptor = json.loads((PLUGIN / "Tether.uplugin").read_text())
    assert descriptor["FileVersion"] == 3
    names = [m["Name"] for m in descriptor["Modules"]]
    assert names == ["TetherSdk", "Tether"]
    assert {"Name": "NNERuntimeORT", "Enabled": True} in descriptor["Plugins"]
    for name in names:
        rules = (PLUGIN / "Source" / name / f"{name}.Build.cs").read_text()
        assert re.search(rf"public class {name} : ModuleRules", rules), name
        assert re.search(rf"public {name}\(ReadOnlyTargetRules Target\) : base\(Target\)", rules), name
        assert "bEnableExceptions = false;" in rules and "bUseRTTI = false;" in rules, name
        modules = [p for p in (PLUGIN / "Source" / name).rglob("*.cpp") if f"IMPLEMENT_MODULE(FDefaultModuleImpl, {name})"
                   in p.read_text()]
        assert len(modules) == 1, f"{name} needs exactly one IMPLEMENT_MODULE"
    tether_rules = (PLUGIN / "Source" / "Tether" / "Tether.Build.cs").read_text()
    assert '"TetherSdk"' in tether_rules and '"NNE"' in tether_rules


def test_plugin_code_uses_no_exceptions_or_rtti() -> None:
    forbidden = re.compile(r"\b(try|catch|throw|dynamic_cast|typeid)\b")
    for path in plugin_sources():
        code = re.sub(r"//.*", "", path.read_text())
        assert not forbidden.search(code), f"{path.relative_to(REPO)}: {forbidden.search(code).group(0)}"


def test_unreal_classes_are_declared_for_the_reflection_system() -> None:
    header = (PLUGIN / "Source" / "Tether" / "Public" / "TetherAgentComponent.h").read_text()
    assert '#include "TetherAgentComponent.generated.h"' in header
    assert header.rstrip().endswith("};")
    assert "class TETHER_API UTetherAgentComponent : public UActorComponent" in header
    assert "GENERATED_BODY()" in header
    for method in ("StartEpisode", "GetAction", "LogAction", "LogReward", "EndEpisode", "IsConnected"):
        assert re.search(rf"UFUNCTION\(BlueprintCallable[^)]*\)\s+\w[\w<>:&\s]*\b{method}\(", header), method
    backend = (PLUGIN / "Source" / "Tether" / "Public" / "TetherNNEBackend.h").read_text()
    assert "public tether::InferenceBackend" in backend


def test_vendored_sdk_compiles_and_links_as_unreal_builds_it(tmp_path: Path) -> None:
    compiler = shutil.which("g++")
    assert compiler is not None, "g++ is needed (scripts/test.sh installs the C++ toolchain)"
    plugin = tmp_path / "Tether"
    shutil.copytree(PLUGIN, plugin)
    vendored = subprocess.run(["bash", str(UNREAL / "vendor_sdk.sh"), str(plugin)], capture_output=True, text=True)
    assert vendored.returncode == 0, vendored.stderr
    module = plugin / "Source" / "TetherSdk"
    assert not (module / "Public" / "tether" / "onnxruntime_backend.h").exists()
    sources = sorted((module / "Private" / "Sdk").rglob("*.cpp"))
    expected = {p.name for p in (REPO / "sdk_cpp" / "src").rglob("*.cpp")} - {"onnxruntime_backend.cpp"}
    assert {p.name for p in sources} == expected

    # Unreal compiles a module as unity files (adaptive unity build: its .cpp files included into a
    # few translation units), so the SDK must compile that way too; two halves, one per core, parse
    # nlohmann/json twice instead of once per file. (sdk_cpp's normal build compiles each file on
    # its own, which keeps every file's includes honest: tests/cpp/test_cpp_sdk.py.)
    halves = [sources[: len(sources) // 2], sources[len(sources) // 2:]]

    def compile_unity(index: int) -> tuple[Path, subprocess.CompletedProcess]:
        unity = tmp_path / f"Module.TetherSdk.{index}.cpp"
        unity.write_text("".join(f'#include "{source}"\n' for source in halves[index]))
        obj = tmp_path / f"Module.TetherSdk.{index}.o"
        return obj, subprocess.run([compiler, *UNREAL_FLAGS, "-fPIC", "-I", str(module / "Public"), "-I",
                                    str(module / "Private" / "Sdk"), "-c", str(unity), "-o", str(obj)],
                                   capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_unity, range(len(halves))))
    for (obj, result), half in zip(results, halves):
        assert result.returncode == 0, f"{[s.name for s in half]}:\n{result.stderr[-3000:]}"
    # Every symbol the SDK needs is defined by the SDK itself (and the C++ runtime).
    linked = subprocess.run([compiler, "-shared", "-fno-exceptions", "-fno-rtti", "-Wl,--no-undefined", "-o",
                             str(tmp_path / "libtethersdk.so"), *(str(o) for o, _ in results), "-lpthread"],
                            capture_output=True, text=True)
    assert linked.returncode == 0, linked.stderr[-3000:]
