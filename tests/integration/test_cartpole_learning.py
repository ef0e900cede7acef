"""The README demo learns CartPole: mean return of the last 100 episodes >= 450,
with one client and with four client processes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .server_process import REPO, free_port


@pytest.mark.slow
@pytest.mark.parametrize("clients", [1, 4])
def test_demo_reaches_450(tmp_path, clients: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tether.server.cli", "demo", "--clients", str(clients), "--port", str(free_port()),
         "--logdir", str(tmp_path), "--max-env-steps", "300000"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    out = proc.stdout + proc.stderr
    reached = re.search(r"reached mean return ([\d.]+) after (\d+) env steps", out)
    assert proc.returncode == 0 and reached, out[-3000:]
    assert float(reached.group(1)) >= 450
    learned = re.search(r"learned policy's return .*: ([\d.]+)", out)
    assert learned and float(learned.group(1)) >= 450, out[-3000:]
    assert (tmp_path / "policy.onnx").exists() and (tmp_path / "checkpoint.pt").exists()
