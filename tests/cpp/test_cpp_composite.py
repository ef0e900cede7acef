"""The C++ SDK acts on a Dict observation with an action mask against a real server.

``tether serve`` runs with tic-tac-toe's spaces (the Dict that
``examples/tictactoe_client.py --print-space`` prints: an ``action_mask`` leaf
and the board, §8.6; Discrete(9) actions); the server masks with the
``action_mask`` leaf (§11.6). The C++ program (sdk_cpp/tests/tictactoe_masked.cpp,
built with the SDK's normal configuration) sets each leaf with
ObservationLeaves, plays against a random legal opponent and sends its records
as objects of leaves, each a tensor in the body's attachment (§10.9). The
server accepts every batch (no error reaches the client, every step is
delivered and counted by the server) and trains, and no move the client got
was forbidden by its mask: the model the server sent masks the logits inside
its graph, and the client samples only values of nonzero probability.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cpp import background_build
from tests.integration.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
SDK = REPO / "sdk_cpp"
PROGRAM = SDK / "build" / "normal" / "tests" / "tether_tictactoe_masked"
TICTACTOE_SPACE = {"type": "Dict", "spaces": {
    "action_mask": {"type": "Box", "shape": [9], "dtype": "int8", "low": 0, "high": 1},
    "observation": {"type": "Box", "shape": [3, 3, 2], "dtype": "int8", "low": 0, "high": 1}}}


@pytest.fixture(scope="module")
def program() -> Path:
    """The normal configuration's build (started in the background by tests/conftest.py), brought up to date."""
    background_build.wait("normal")
    build = subprocess.run(["bash", str(SDK / "scripts" / "build_and_test.sh"), "--build-only", "normal"],
                           capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    assert PROGRAM.exists(), f"{PROGRAM} was not built"
    return PROGRAM


def test_the_space_is_the_one_the_python_example_prints() -> None:
    printed = subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(REPO / "examples" / "tictactoe_client.py"),
                              "--print-space"], capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert json.loads(printed.stdout) == TICTACTOE_SPACE


@pytest.mark.cpp_build("normal")  # (run last: its build runs in the background meanwhile)
def test_cpp_client_sends_masked_dict_observations_a_real_server_accepts(program: Path, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, "--observation-space", json.dumps(TICTACTOE_SPACE),
                           "--action-space", json.dumps({"type": "Discrete", "n": 9}),
                           "--env-steps-per-sample", "128", "--train-batch-size", "256", "--minibatch-size", "64",
                           "--seed", "0").start()
    try:
        run = subprocess.run([str(program), "--port", str(server.port), "--games", "300", "--seed", "3"],
                             capture_output=True, text=True, timeout=600)
        summary = server.stop()
    finally:
        server.kill()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:] + "\n".join(server.lines[-20:])
    report = json.loads(next(line for line in reversed(run.stdout.splitlines()) if line.startswith("{")))
    print(f"client {report}; server {summary.get('env_steps')} env steps")
    assert report["forbidden_moves"] == 0, report
    assert report["pending_errors"] == 0, report
    # Every step was delivered and accepted: the server counted them all.
    assert report["env_steps_sent"] == report["steps"] > 0, report
    assert summary["env_steps"] == report["steps"], summary
    # It trained on them: the client acted with the masked models it sent back.
    assert report["models_loaded"] >= 2, report
    assert not any("Traceback" in line for line in server.lines), server.lines[-20:]
