"""Every benchmark installs what it needs through the project's own scripts or exits with one line
naming the script to run - never an ImportError or a build tool's traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHES = sorted(p.name for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("bench", BENCHES)
def test_without_the_projects_environment_a_bench_names_the_install_script(bench: str) -> None:
    # -S: no site-packages, so neither tether nor numpy is importable, as with a bare interpreter.
    out = subprocess.run([sys.executable, "-S", str(REPO / "bench" / bench), "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.stdout[-500:], out.stderr[-2000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "bash scripts/install.sh" in lines[0] and "Traceback" not in out.stderr, out.stderr


def test_a_missing_tool_is_named_with_the_script_that_installs_it() -> None:
    code = ("import sys; sys.path.insert(0, 'bench'); import _common; "
            "_common.ensure_installed('scripts/install_browser_does_not_exist.sh', tools=['no-such-tool-here'], "
            "what='the browsers', skip_flag='--no-browsers')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "\n" not in line and "no-such-tool-here" in line and "bash scripts/install_browser_does_not_exist.sh" in line
    assert "--no-browsers" in line


def test_a_missing_file_is_named_with_the_script_that_fetches_it() -> None:
    # (the C# figures need ONNX Runtime's C library, which sdk_cpp/scripts/fetch_onnxruntime.sh fetches)
    code = ("import sys; sys.path.insert(0, 'bench'); import _common; "
            "_common.ensure_installed('scripts/fetch_does_not_exist.sh', files=['no/such/library.so'], "
            "what='the C# SDK figures', skip_flag='--no-csharp')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "\n" not in line and "no/such/library.so" in line and "bash scripts/fetch_does_not_exist.sh" in line
    assert "--no-csharp" in line
