"""One valid-looking batch cannot destroy a run. While a real CartPole client
trains against a real server, a frame claims action_logp -1000 (refused with
ACTION_LOGP_MISMATCH) and a real SDK client reports rewards of 3e38 (its data
is left out of the update, which is published on the good client's data). The
good client still reaches a return a random policy does not, and the weights
stay finite."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import torch

from tether.sdk import TetherClient
from tether.server.checkpoint import load_checkpoint

from .server_process import REPO, RawClient, ServerProcess, wait_until

TARGET = 100.0


def random_policy_mean(episodes: int = 50) -> float:
    env, rng, total = gym.make("CartPole-v1"), np.random.default_rng(0), 0.0
    for i in range(episodes):
        env.reset(seed=i)
        done = False
        while not done:
            _, r, term, trunc, _ = env.step(int(rng.integers(2)))
            total += r
            done = term or trunc
    return total / episodes


def test_poison_is_refused_or_left_out_while_a_good_client_learns(tmp_path) -> None:
    random_mean = random_policy_mean()
    assert random_mean < TARGET / 3
    server = ServerProcess(tmp_path, "--train-batch-size", "1000", "--env-steps-per-sample", "250", "--seed", "0",
                           "--stop-at-return", str(TARGET), "--max-env-steps", "200000").start()
    good = subprocess.Popen([sys.executable, str(REPO / "tests/integration/stoppable_client.py"), "--port",
                             str(server.port), "--stop-file", str(tmp_path / "never")], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: any("update    1 " in line for line in server.lines), 60), "\n".join(server.lines)
        # 1. Behaviour logp no served model can have produced.
        raw = RawClient(server.port)
        obs = [[0.01 * i, 0.0, 0.0, 0.0] for i in range(4)]
        reply = raw.request({"type": "EPISODES_AND_GET_STATE", "weights_seq_no": 1, "episodes": [
            {"obs": obs, "actions": [0, 1, 0], "rewards": [1.0] * 3, "action_logp": [-0.69, -1000.0, -0.69],
             "is_terminated": False, "is_truncated": False}]})
        assert reply["type"] == "ERROR" and reply["code"] == "ACTION_LOGP_MISMATCH", reply
        assert "action_logp[1]" in reply["message"]
        raw.close()
        # 2. Rewards that overflow the returns, from a real SDK client with genuine logp.
        poison = TetherClient("127.0.0.1", server.port, seed=1)
        eid = poison.start_episode()
        for _ in range(250):
            poison.get_action(eid, np.zeros(4, np.float32))
            poison.log_returns(eid, 3e38)
        poison.end_episode(eid, np.zeros(4, np.float32))
        poison.flush()
        poison.close()
        summary = server.wait(240)
    finally:
        good.kill()
        server.kill()
    log = "\n".join(server.lines)
    assert summary["updates_discarded"] == 0, log[-3000:]
    assert "agent steps left out, from client(s) #" in log, log[-3000:]
    assert summary["reached_target_at"] is not None and summary["return_mean"] >= TARGET, log[-3000:]
    state = load_checkpoint(server.logdir / "checkpoint.pt")
    tensors = [t for t in state["modules"]["default_policy"]["learner"]["model"].values()]
    assert tensors and all(torch.isfinite(t).all() for t in tensors)
