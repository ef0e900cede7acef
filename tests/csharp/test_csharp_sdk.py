"""The C# SDK (sdk_csharp/) builds with mono's mcs and passes its NUnit tests.

sdk_csharp/scripts/build_and_test.sh compiles the core (C# 7.2, XML docs
required on public members), runs nunit-console and prints "N passed, N
failed"; this test reads that line, so a run with no tests, or with one
failing, fails here with the runner's output.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "sdk_csharp" / "scripts" / "build_and_test.sh"
TAIL_LINES = 80


def test_csharp_sdk_builds_and_passes_its_tests() -> None:
    result = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", timeout=600)
    tail = "\n".join(result.stdout.splitlines()[-TAIL_LINES:])
    counts = re.findall(r"^(\d+) passed, (\d+) failed$", result.stdout, re.MULTILINE)
    if result.returncode != 0 or not counts:
        pytest.fail(f"build_and_test.sh exited {result.returncode}; last {TAIL_LINES} lines:\n{tail}")
    passed, failed = map(int, counts[-1])
    assert failed == 0 and passed >= 44, tail
    # Every claimed conformance file ran all its cases.
    ran = dict(re.findall(r"\[ conformance \] (\S+): (\d+) cases run, 0 failed", result.stdout))
    claimed = {"framing.json", "messages.json", "spaces.json", "logp.json", "policy_mapping.json", "session.json",
               "client_pairing.json", "episodes.json", "multi_agent_episodes.json", "groups.json", "value_obs.json", "tensors.json",
               "composite.json", "recurrent.json", "logged.json", "demonstrations.json", "rewards.json",
               "env_params.json", "run_ids.json", "rank_addresses.json", "offline_policy.json", "agent_modules.json",
               "cuts.json"}
    assert set(ran) == claimed, tail
    # ...and those are every client-side vector file (the rest need a live server).
    server_side = {"connection.json", "counting.json", "exactly_once.json", "map_agents.json",
                   "multi_agent_sessions.json", "set_state.json"}
    assert {p.name for p in (REPO / "tests" / "conformance").glob("*.json")} == claimed | server_side
