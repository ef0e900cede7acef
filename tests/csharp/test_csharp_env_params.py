"""The C# SDK's environment parameters (protocol 1.7, §19) against a real server.

``tether serve`` runs a curriculum of one fixed parameter and one uniform sampler; the C# CartPole
example (examples/csharp/CartPole.cs, unchanged: it does not read the parameters) plays a short
budget. Its client asks for the set with every state request (``env_params_seq``), draws each
episode's values and records them with every record (``env_params``). The server refuses a record
whose values its set cannot give (§19.3) and counts the episodes played with the set in its
curriculum's summary: a count above 0, and no batch refused (the example would stop with an error),
show that the records carried values the server accepted.

The example is built by sdk_csharp/scripts/build_and_test.sh --build-only into a folder of this
test's own, and run under mono.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
ORT_LIB = REPO / "sdk_cpp" / "third_party" / "onnxruntime" / "lib"
CURRICULUM = {"parameters": {"speed": 2, "gravity": {"sampler": "uniform", "low": 9, "high": 11}}}


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("csharp-build")
    done = subprocess.run(["bash", str(REPO / "sdk_csharp" / "scripts" / "build_and_test.sh"), "--build-only"], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, TETHER_CSHARP_BUILD_DIR=str(build)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return build / "examples" / "cartpole.exe"


def last_json(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert lines, output[-3000:]
    return json.loads(lines[-1])


def test_csharp_records_carry_env_params_the_server_counts(cartpole: Path, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, "--env", "CartPole-v1", "--seed", "0", "--env-steps-per-sample", "200",
                           "--train-batch-size", "400", "--max-env-steps", "1200", "--checkpoint-every", "0",
                           "--curriculum", json.dumps(CURRICULUM)).start()
    try:
        run = subprocess.run(["mono", str(cartpole), "--port", str(server.port), "--max-steps", "100000", "--seed", "0",
                              "--reconnect-timeout", "5"], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, LD_LIBRARY_PATH=str(ORT_LIB)))
        summary = server.wait(60)
    finally:
        server.kill()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = last_json(run.stdout)
    # The server's budget ran out (§6.6); a refused batch (a record's env_params the set cannot give,
    # §19.3 check 21) would have stopped the example with an error instead.
    assert result["stopped_by"] == "training_done", (result, run.stderr[-3000:])
    curriculum = summary["curriculum"]
    print("curriculum:", curriculum)
    assert curriculum["seq"] >= 1, curriculum
    assert curriculum["episodes"] > 0, curriculum  # episodes whose records said which set they played with
    assert summary["env_steps"] >= 1000, summary
