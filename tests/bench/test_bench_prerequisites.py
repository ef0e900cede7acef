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


@pytest.mark.parametrize("script, missing, skip_flag", [
    ("scripts/install_browser_does_not_exist.sh", "tools=['no-such-tool-here']", "--no-browsers"),
    # (the C# figures need ONNX Runtime's C library, which sdk_cpp/scripts/fetch_onnxruntime.sh fetches)
    ("scripts/fetch_does_not_exist.sh", "files=['no/such/library.so']", "--no-csharp"),
], ids=["tool", "file"])
def test_what_is_missing_is_named_with_the_script_that_installs_it(script: str, missing: str, skip_flag: str) -> None:
    code = ("import sys; sys.path.insert(0, 'bench'); import _common; "
            f"_common.ensure_installed({script!r}, {missing}, what='the figures', skip_flag={skip_flag!r})")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    line = out.stderr.strip()
    name = missing.split("'")[1]
    assert "\n" not in line and name in line and f"bash {script}" in line and skip_flag in line
