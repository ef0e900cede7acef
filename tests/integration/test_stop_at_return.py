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


def test_made_up_returns_of_one_client_do_not_end_a_run_another_client_is_still_below_target(tmp_path) -> None:
    """Three frames of made-up 20-step episodes of return 500 fill the whole window, for
    more than three updates; an honest client's episodes (return 20) keep the run going.
    Once the honest client reaches the target too, the run ends."""
    def episodes(prefix: str, count: int, reward: float) -> list[dict]:
        return [{"obs": [[0.0] * 4] * 21, "actions": [0, 1] * 10, "rewards": [reward] * 20, "is_terminated": True,
                 "is_truncated": False, "episode_id": f"{prefix}{i}"} for i in range(count)]

    with ServerProcess(tmp_path, "--stop-at-return", "450", "--train-batch-size", "1000", "--no-force-on-policy",
                       "--max-staleness", "100", "--num-epochs", "1") as server:
        honest, attacker = RawClient(server.port), RawClient(server.port)
        sent = 0

        def honest_batch(reward: float) -> None:
            nonlocal sent
            sent += 1
            reply = honest.request({"type": "EPISODES_AND_GET_STATE", "episodes": episodes(f"h{sent}-", 5, reward),
                                    "client_session": "honest", "batch_seq": sent})
            assert reply["type"] == "SET_STATE"

        honest_batch(1.0)
        for frame in range(3):  # 300 made-up episodes, 6000 steps: six updates with the honest batches
            fake = {"type": "EPISODES_AND_GET_STATE", "episodes": episodes(f"f{frame}-", 100, 25.0),
                    "client_session": "attacker", "batch_seq": frame + 1}
            assert attacker.request(fake)["type"] == "SET_STATE"
            honest_batch(1.0)
        time.sleep(1.0)
        assert server.proc.poll() is None, "\n".join(server.lines[-5:])  # the old rule ended the run here
        for _ in range(100):  # the honest client reaches the target (its own last 100 episodes), then three updates
            if server.proc.poll() is not None:
                break
            try:
                honest_batch(25.0)
                attacker.request({"type": "PING"})  # the attacker stays connected but sends no more data
            except (ConnectionError, OSError):
                break
        summary = server.wait(30)
    assert summary["reached_target_at"] is not None and summary["updates"] >= 9
