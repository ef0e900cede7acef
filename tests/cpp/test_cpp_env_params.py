"""The C++ SDK's environment parameters (protocol 1.7, §19) against a real server.

``tether serve`` runs a curriculum of one fixed parameter and one uniform sampler; the C++ CartPole
example (examples/cpp/cartpole.cpp, unchanged: it does not read the parameters) plays a short budget.
Its client asks for the set with every state request (``env_params_seq``), draws each episode's values
and records them with every record (``env_params``). The server refuses a record whose values its set
cannot give (§19.3) and counts the episodes played with the set in its curriculum's summary: a count
above 0, and no batch refused, show that the records carried values the server accepted.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.integration.server_process import ServerProcess

CURRICULUM = {"parameters": {"speed": 2, "gravity": {"sampler": "uniform", "low": 9, "high": 11}}}


def last_json(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert lines, output[-3000:]
    return json.loads(lines[-1])


def test_cpp_records_carry_env_params_the_server_counts(examples: Path, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, "--env", "CartPole-v1", "--seed", "0", "--env-steps-per-sample", "200",
                           "--train-batch-size", "400", "--max-env-steps", "1200", "--checkpoint-every", "0",
                           "--curriculum", json.dumps(CURRICULUM)).start()
    try:
        run = subprocess.run([str(examples / "cartpole"), "--port", str(server.port), "--max-steps", "100000",
                              "--seed", "0", "--reconnect-timeout", "5"], capture_output=True, text=True, timeout=120)
        summary = server.wait(60)
    finally:
        server.kill()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = last_json(run.stdout)
    assert result["stopped_by"] == "training_done", result  # the server's budget ran out (§6.6)
    # No batch refused: every record's env_params was one the set could give (§19.3, check 21).
    refused = [line for line in run.stdout.splitlines() if "server reported" in line and "TRAINING_DONE" not in line]
    assert not refused, refused
    curriculum = summary["curriculum"]
    print(f"C++ cartpole with env_params: {result}; curriculum: {curriculum}")
    assert curriculum["seq"] >= 1, curriculum
    assert curriculum["episodes"] > 0, curriculum  # episodes whose records said which set they played with
    assert summary["env_steps"] >= 1000, summary
