"""Each update takes at most train_batch_size agent steps and the pool stays
bounded, however fast data arrives: a sender that finds the pool full waits."""

from __future__ import annotations

import re
import threading

from .server_process import RawClient, ServerProcess

STEPS = 500


def record(steps: int) -> dict:
    return {"obs": [[0.0, 0.0, 0.0, 0.0]] * (steps + 1), "actions": [0, 1] * (steps // 2), "rewards": [1.0] * steps,
            "is_terminated": False, "is_truncated": False}


def test_updates_and_pool_are_bounded_under_a_flood(tmp_path) -> None:
    batch, messages = 2000, 60
    with ServerProcess(tmp_path, "--train-batch-size", str(batch), "--no-force-on-policy", "--max-staleness", "100",
                       "--num-epochs", "4") as server:
        raw = RawClient(server.port, timeout=120)
        # One writer floods EPISODES (no response) as fast as the socket takes them.
        sender = threading.Thread(target=lambda: [raw.send({"type": "EPISODES", "episodes": [record(STEPS)]})
                                                  for _ in range(messages)])
        sender.start()
        sender.join(120)
        assert raw.request({"type": "PING"})["type"] == "PONG"  # everything sent before it was read
        raw.close()
        summary = server.stop()
    sizes = [int(m.group(1)) for line in server.lines if (m := re.search(r"update +\d+ \| batch +(\d+)", line))]
    assert summary["agent_steps"] == messages * STEPS
    assert sizes and all(size == batch for size in sizes), sizes
    assert summary["agent_steps_trained"] == summary["updates"] * batch
    assert summary["pool_steps_max"] <= 2 * batch + STEPS
