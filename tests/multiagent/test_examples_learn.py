"""The multi-agent examples reach their stated results (real server and client processes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..integration.server_process import REPO


def bench(script: str, *args: str, timeout: float = 900) -> dict:
    out = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, capture_output=True,
                         text=True, timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert lines, out.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.mark.slow
def test_grouped_two_step_game_reaches_the_optimum() -> None:
    """The two agents grouped into one reach the QMIX paper's optimum 8 (not the safe 7)."""
    result = bench("e2e_two_step.py", "--max-env-steps", "40000")
    assert result["reached"], result
    assert result["return_mean_final"] >= 7.95
    assert result["env_steps_to_8"] <= 20_000
