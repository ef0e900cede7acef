"""Exactly-once batches (protocol 1.3): a batch resent with the same
client_session and batch_seq is answered as if new and stored once, on the
same connection, after a reconnect, and after a restart with --resume."""

from __future__ import annotations

from .server_process import RawClient, ServerProcess

RECORD = {"obs": [[0.0, 0.1, 0.0, -0.1]] * 4, "actions": [0, 1, 0], "rewards": [1.0] * 3,
          "is_terminated": False, "is_truncated": False}
FLAGS = ("--no-force-on-policy", "--train-batch-size", "100000")


def batch(seq: int | None, session: str | None = "s-1", **extra) -> dict:
    msg = {"type": "EPISODES_AND_GET_STATE", "episodes": [dict(RECORD, episode_id="e1")], **extra}
    if session is not None:
        msg["client_session"] = session
    if seq is not None:
        msg["batch_seq"] = seq
    return msg


def test_duplicates_are_stored_once_across_reconnect_and_resume(tmp_path) -> None:
    with ServerProcess(tmp_path, *FLAGS, name="first") as server:
        raw = RawClient(server.port)
        assert raw.request(batch(1))["type"] == "SET_STATE"
        again = raw.request(batch(1))
        assert again["type"] == "SET_STATE" and "onnx_file" in again  # answered as if new
        raw.close()
        raw = RawClient(server.port)  # a reconnect resends what it got no answer for
        assert raw.request(batch(1))["type"] == "SET_STATE"
        assert raw.request(batch(2))["type"] == "SET_STATE"
        # Malformed ids are refused before anything else; a refused batch does not advance the counter.
        assert raw.request(batch(None))["code"] == "INVALID_FIELD"
        assert raw.request(batch(3, session=None))["code"] == "INVALID_FIELD"
        assert raw.request(batch(0))["code"] == "INVALID_FIELD"
        assert raw.request(batch(True))["code"] == "INVALID_FIELD"
        assert raw.request(batch(3, session="x" * 129))["code"] == "INVALID_FIELD"
        bad = batch(3)
        bad["episodes"][0]["actions"] = [0, 1, 7]
        assert raw.request(bad)["code"] == "ACTION_OUT_OF_SPACE"
        assert raw.request(batch(3))["type"] == "SET_STATE"  # seq 3 after its refusal: stored
        # EPISODES duplicates get no answer either; the PING shows the connection is in step.
        raw.send(dict(batch(3), type="EPISODES"))
        assert raw.request({"type": "PING"})["type"] == "PONG"
        assert raw.request(batch(1, session="s-2"))["type"] == "SET_STATE"  # sessions count apart
        raw.close()
        first = server.stop()
    assert first["agent_steps"] == 4 * 3 and first["batches_duplicate"] == 3

    checkpoint = server.logdir / "checkpoint.pt"
    with ServerProcess(tmp_path, *FLAGS, "--resume", str(checkpoint), name="second") as server:
        raw = RawClient(server.port)
        assert raw.request(batch(3))["type"] == "SET_STATE"  # stored before the restart: duplicate
        assert raw.request(batch(4))["type"] == "SET_STATE"
        raw.close()
        second = server.stop()
    assert second["agent_steps"] == first["agent_steps"] + 3
