"""The protocol core type-checks cleanly (it is the reference other SDKs port)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_protocol_core_is_mypy_clean() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "protocol"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
