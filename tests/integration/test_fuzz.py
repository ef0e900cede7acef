"""Seeded fuzzing of a real server while a real CartPole client trains.

bench/fuzz.py sends 10,000 mutated and random frames on four connections
(see its docstring for the mutations) and checks, after each one, that the
server answered or closed the connection in time. The server must print no
traceback, answer no INTERNAL, exit only when told, and store exactly the good
client's steps plus those of the fuzz messages it accepted.
"""

from __future__ import annotations

import json
import subprocess
import sys

from .server_process import REPO


def test_fuzzed_frames_never_crash_hang_or_lose_steps() -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "fuzz.py"), "--frames", "10000", "--seed", "5",
                          "--hang-s", "10"], cwd=REPO, capture_output=True, text=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["frames"] == 10000
    assert result["crashes"] == 0, result["internal_errors"]
    assert result["hangs"] == 0 and result["tracebacks"] == 0, out.stderr[-3000:]
    assert result["lost_steps"] == 0, result
    assert result["good_client_steps"] > 0 and result["good_client_reconnects"] == 0, result
    assert result["refused"] > 5_000, "most mutated frames must be refused with an ERROR"
    assert out.returncode == 0
