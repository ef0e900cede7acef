"""Fixtures of the C++ tests: the example programs, built once per session."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cpp import background_build

REPO = Path(__file__).resolve().parents[2]
SDK = REPO / "sdk_cpp"


@pytest.fixture(scope="session")
def examples() -> Path:
    """Build examples/cpp (started in the background by tests/conftest.py) into
    sdk_cpp/build/examples; the folder holding the binaries."""
    background_build.wait("examples")
    build = subprocess.run(["bash", str(SDK / "scripts" / "build_and_test.sh"), "examples"], capture_output=True,
                           text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    return SDK / "build" / "examples"
