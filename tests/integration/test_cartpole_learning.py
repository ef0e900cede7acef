"""The README demo learns CartPole: mean return of the last 100 episodes >= 450,
with one client, where random play, measured here, stays far below. (Several
client processes pool into one module in every multi-client test; the demo with
two runs in tests/bench/test_bench_smoke.py.)"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .server_process import REPO, free_port


def random_returns(episodes: int, seed: int) -> list[float]:
    """CartPole-v1 returns of uniformly random actions."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


@pytest.mark.slow
@pytest.mark.parametrize("clients", [1])
def test_demo_reaches_450(tmp_path, clients: int) -> None:
    best_random = max(random_returns(100, seed=clients))  # about 22 on average, rarely above 100
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
    assert float(reached.group(1)) > best_random + 200, (reached.group(1), best_random)
    assert (tmp_path / "policy.onnx").exists() and (tmp_path / "checkpoint.pt").exists()
    # The end is said on the wire (§6.6): every client stops on it, none takes it for a lost connection.
    assert out.count('"stopped_by": "training_done"') == clients, out[-3000:]
    assert "reconnecting" not in out, out[-3000:]
