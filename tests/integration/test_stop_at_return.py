"""--stop-at-return cannot be triggered by one frame of made-up episodes: the
target must hold after several consecutive updates while half a window of new
episodes finishes."""

from __future__ import annotations

import time

from .server_process import RawClient, ServerProcess

STEP = {"obs": [[0.0, 0.0, 0.0, 0.0]] * 2, "actions": [0], "rewards": [500.0], "is_terminated": True,
        "is_truncated": False}
LONG = {"obs": [[0.0, 0.0, 0.0, 0.0]] * 101, "actions": [0, 1] * 50, "rewards": [1.0] * 100,
        "is_terminated": False, "is_truncated": False, "episode_id": "long"}


def test_one_frame_of_fake_returns_does_not_end_the_run(tmp_path) -> None:
    with ServerProcess(tmp_path, "--stop-at-return", "450", "--train-batch-size", "200", "--no-force-on-policy",
                       "--max-staleness", "100") as server:
        raw = RawClient(server.port)
        fake = {"type": "EPISODES_AND_GET_STATE", "episodes": [dict(STEP, episode_id=f"f{i}") for i in range(100)]}
        assert raw.request(fake)["type"] == "SET_STATE"
        for _ in range(8):  # 800 more steps: four updates, no episode finishes
            assert raw.request({"type": "EPISODES_AND_GET_STATE", "episodes": [LONG]})["type"] == "SET_STATE"
        time.sleep(1.0)
        assert server.proc.poll() is None, "\n".join(server.lines[-5:])
        raw.close()
        summary = server.stop()
    assert summary["updates"] >= 4 and summary["return_mean"] == 500.0
    assert summary["reached_target_at"] is None
