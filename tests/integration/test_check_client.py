"""``tether check-client`` against real client processes: the Python SDK's
program and a reference client must pass every check; clients with one
deliberate defect must fail exactly the checks that cover it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^(\w+)\s+(PASS|FAIL)\s+(.*)$")
ALL_ROWS = {"handshake", "records_valid", "engine_gets_clipped_action", "raw_box_samples", "logp_from_served_model",
            "batch_ids", "error_reply", "model_swap", "drop_reconnect", "resend_same_seq", "duplicate_reply",
            "garbage_reconnect", "connection_error", "heartbeat"}


def run_check(client: list[str], timeout: float = 90.0) -> tuple[int, dict[str, tuple[str, str]], str, str]:
    """Start the checker on a free port, run ``client --port P`` against it; (exit status, rows, outputs)."""
    checker = subprocess.Popen([sys.executable, "-m", "tether.server.cli", "check-client", "--port", "0",
                                "--timeout", "60"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    assert checker.stdout is not None
    first = checker.stdout.readline()
    match = re.search(r"listening on [\d.]+:(\d+)", first)
    assert match, first
    program = subprocess.run([sys.executable, *client, "--port", match.group(1)], cwd=REPO, capture_output=True,
                             text=True, timeout=timeout)
    out, _ = checker.communicate(timeout=timeout)
    rows = {m.group(1): (m.group(2), m.group(3)) for m in map(ROW.match, out.splitlines()) if m and m.group(1) != "check"}
    return checker.returncode, rows, out, program.stdout + program.stderr


def test_reference_client_passes_every_check() -> None:
    status, rows, out, _ = run_check(["tests/integration/raw_check_client.py"])
    assert set(rows) == ALL_ROWS, out
    assert all(result == "PASS" for result, _ in rows.values()), out
    assert status == 0


def test_python_sdk_client_passes_every_check() -> None:
    status, rows, out, client_out = run_check(["examples/check_client_python.py"])
    assert set(rows) == ALL_ROWS, out
    failed = {name: reason for name, (result, reason) in rows.items() if result == "FAIL"}
    assert not failed, out + "\n--- client ---\n" + client_out[-3000:]
    assert status == 0
    assert "INVALID_FIELD" in client_out  # the refusal was surfaced (printed by the program or logged by the SDK)


@pytest.mark.parametrize(("defect", "failing"), [
    ("reuse-seq", {"batch_ids", "error_reply", "duplicate_reply", "connection_error"}),
    ("no-reconnect", {"batch_ids", "model_swap", "drop_reconnect", "resend_same_seq", "duplicate_reply", "garbage_reconnect",
                      "connection_error", "heartbeat"}),
    ("clip-record", {"raw_box_samples", "logp_from_served_model"}),
    ("no-heartbeat", {"heartbeat"}),
    ("stale-claim", {"model_swap"}),
    ("revert", {"model_swap"}),
])
def test_broken_client_fails_the_right_checks(defect: str, failing: set[str]) -> None:
    status, rows, out, _ = run_check(["tests/integration/raw_check_client.py", "--defect", defect])
    assert set(rows) == ALL_ROWS, out
    failed = {name for name, (result, _) in rows.items() if result == "FAIL"}
    assert failed == failing, out
    assert status == len(failing)
