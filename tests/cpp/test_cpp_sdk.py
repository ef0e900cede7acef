"""The C++ SDK (sdk_cpp/) builds and passes its own tests in every configuration.

Each test runs sdk_cpp/scripts/build_and_test.sh CONFIG, which installs missing
toolchain packages (as root), fetches ONNX Runtime's C library if needed,
configures sdk_cpp/build/CONFIG, builds with -j2 and runs ctest. The builds
take minutes: the suite starts them in the background while the Python tests
run (tests/conftest.py), and each test first waits for its own.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cpp import background_build

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "sdk_cpp" / "scripts" / "build_and_test.sh"
TAIL_LINES = 80
TIMEOUT_S = 1800


def _run(config: str) -> None:
    assert shutil.which("bash") is not None, "bash is needed to run build_and_test.sh"
    background_build.wait(config)
    result = subprocess.run(
        ["bash", str(SCRIPT), config],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        timeout=TIMEOUT_S,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-TAIL_LINES:])
        pytest.fail(f"build_and_test.sh {config} exited {result.returncode}; last {TAIL_LINES} lines:\n{tail}")


@pytest.mark.cpp_build("normal")
def test_normal_build_passes() -> None:
    _run("normal")


@pytest.mark.cpp_build("noexcept")
def test_noexcept_build_passes() -> None:
    _run("noexcept")


@pytest.mark.slow
@pytest.mark.cpp_build("asan")
def test_asan_ubsan_build_passes() -> None:
    _run("asan")


@pytest.mark.slow
@pytest.mark.cpp_build("tsan")
def test_tsan_build_passes() -> None:
    _run("tsan")
