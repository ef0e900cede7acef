"""The distribution installs one import name, ``tether``: generic top-level
names such as ``server`` or ``multiagent`` would shadow, or be shadowed by,
other installed packages."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_has_only_the_tether_package(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "--disable-pip-version-check", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = tmp_path.glob("tether-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"tether"}, top_level
    for module in ("tether/sdk/client.py", "tether/protocol/framing.py", "tether/server/cli.py",
                   "tether/server/learner/ppo.py", "tether/server/transport/tcp.py", "tether/server/ingest/pipeline.py",
                   "tether/checker/check_client.py", "tether/multiagent/pettingzoo_adapter.py"):
        assert module in names, f"{module} missing from the wheel"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tether = tether.server.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_installed_names_resolve_outside_the_checkout(tmp_path: Path) -> None:
    """From another directory only tether.* is importable (the editable install maps the folders)."""
    code = ("import importlib.util as u, tether.protocol, tether.sdk, tether.server.cli, tether.checker.check_client,"
            " tether.multiagent.pettingzoo_adapter;"
            "print([n for n in ('server', 'sdk_python', 'multiagent', 'protocol', 'checker') if u.find_spec(n) is not None])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
