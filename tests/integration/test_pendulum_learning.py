"""Continuous actions learn end to end: Pendulum-v1 through a real ``tether serve``
and a real client process (examples/pendulum_client.py, the SDK's TetherClient).

The records carry the raw Gaussian sample and its log-density while the env
gets the sample clipped into [-2, 2]; a biased gradient, a broken Box head or a
Box ONNX export that does not match the learner shows up here as a policy that
does not beat random play.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .server_process import REPO, ServerProcess

CLIENT = REPO / "examples" / "pendulum_client.py"
TARGET = -400.0
EVAL_EPISODES = 20


def play(policy: str, seed: int) -> list[float]:
    """Episode returns of a policy.onnx (sampled, as in training) or of "random" torques."""
    out = subprocess.run([sys.executable, str(CLIENT), "--evaluate", policy, "--episodes", str(EVAL_EPISODES),
                          "--seed", str(seed)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["returns"]


@pytest.mark.slow
def test_pendulum_learns_what_random_play_cannot_reach(tmp_path) -> None:
    random_returns = play("random", seed=123)
    server = ServerProcess(tmp_path, "--config", str(REPO / "examples/configs/pendulum.toml"), "--seed", "0",
                           "--stop-at-return", str(TARGET), "--max-env-steps", "160000").start()
    client = subprocess.Popen([sys.executable, str(CLIENT), "--port", str(server.port), "--seed", "0",
                               "--reconnect-timeout", "2"], cwd=REPO, stdout=subprocess.DEVNULL)
    try:
        summary = server.wait(timeout=300)
    finally:
        client.kill()
        server.kill()
    assert summary["reached_target_at"] is not None, (summary, server.lines[-5:])
    assert summary["return_mean"] >= TARGET

    trained_returns = play(str(server.logdir / "policy.onnx"), seed=123)
    trained = sum(trained_returns) / len(trained_returns)
    # The same starting states for both; random torques score about -1200 a
    # episode and their best of 20 stays far below what the trained policy
    # averages.
    assert trained >= TARGET, (trained, trained_returns)
    assert trained > max(random_returns) + 200, (trained, random_returns)


def test_pendulum_bench_prints_its_contract_keys() -> None:
    """A budget too small to learn: one JSON object with the named keys, the
    target not reached (exit code 1), both returns measured."""
    out = subprocess.run([sys.executable, str(REPO / "bench" / "e2e_pendulum.py"), "--max-env-steps", "2000",
                          "--eval-episodes", "2"], cwd=REPO, capture_output=True, text=True, timeout=240)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout + out.stderr[-3000:]
    result = json.loads(lines[0])
    assert set(result) >= {"env_steps_to_-300", "time_to_-300_s", "return_final"}
    assert out.returncode == 1 and result["reached"] is False
    assert result["env_steps_to_-300"] is None and result["time_to_-300_s"] is None
    assert result["return_final"] < -300 and result["return_random"] < -300
