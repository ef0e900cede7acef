"""The protocol core type-checks cleanly (it is the reference other SDKs port)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# protocol/ never imports torch, but spaces.to_gymnasium imports gymnasium, whose
# wrappers (numpy_to_torch) import it, and mypy then reads some 1,400 torch modules:
# about 12 s of a 19.5 s check with no cache (as in CI's fresh checkout). Skipped,
# torch's names are Any inside gymnasium's torch wrappers only; every type protocol/
# uses (its own, numpy's, gymnasium's spaces, the standard library's) is still read and
# checked. Same findings with and without the skip, also on a copy of protocol/ with
# errors put in against numpy's and gymnasium's types; 6-8 s instead of 19.5 s.
MYPY_CONFIG = """\
[mypy]
ignore_missing_imports = True

[mypy-torch.*]
follow_imports = skip
"""


def test_protocol_core_is_mypy_clean(tmp_path: Path) -> None:
    config = tmp_path / "mypy.ini"
    config.write_text(MYPY_CONFIG)
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config), "protocol"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
