"""Ids a client sends are Unicode text or refused (docs/protocol.md §4.1, §9.2).

A JSON string may escape half of a surrogate pair alone ("\\ud800"), which is
no Unicode text: kept as an agent id it ended up in metric names that no
TensorBoard event file can encode. A real server, with TensorBoard on, refuses
such ids with INVALID_FIELD and goes on training, writing metrics and
checkpoints.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tether.server.checkpoint import load_checkpoint

from .server_process import REPO, RawClient, ServerProcess, wait_until

ENTRY = {"module": "default_policy", "start_step": 0, "obs": [[0.0, 0.1, 0.0, -0.1]] * 3, "actions": [0, 1],
         "rewards": [1.0, 1.0], "action_logp": [-0.69, -0.69], "is_terminated": True, "is_truncated": False}
RECORD = {"obs": [[0.0, 0.0, 0.0, 0.0]] * 6, "actions": [0, 1, 0, 1, 0], "rewards": [1.0] * 5,
          "action_logp": [-0.69] * 5, "is_terminated": True, "is_truncated": False}


def frame_of(message: dict) -> bytes:
    # json.dumps writes a lone surrogate as its \ud800 escape, as a client's JSON library would.
    body = json.dumps(message).encode("ascii")
    return b"%08d" % len(body) + body


def refusal(client: RawClient, message: dict) -> dict:
    client.send_bytes(frame_of(message))
    return client.receive()


def test_lone_surrogate_ids_are_refused_and_training_goes_on(tmp_path) -> None:
    server = ServerProcess(tmp_path, "--train-batch-size", "5", "--checkpoint-every", "1")
    server.cmd.remove("--no-tensorboard")
    with server:
        client = RawClient(server.port)
        finished = {"type": "EPISODES_AND_GET_STATE", "episodes": [
            {"episode_id": "e1", "is_terminated": False, "is_truncated": False, "agents": {"\ud800": ENTRY}}]}
        assert len(frame_of(finished)) < 400
        bad = [
            finished,
            {"type": "EPISODES_AND_GET_STATE", "episodes": [dict(RECORD, episode_id="ep\udc00")]},
            {"type": "EPISODES_AND_GET_STATE", "episodes": [
                {"episode_id": "\udbff", "is_terminated": True, "is_truncated": False, "agents": {"a": ENTRY}}]},
            {"type": "EPISODES_AND_GET_STATE", "episodes": [RECORD], "client_session": "s\ud800", "batch_seq": 1},
            {"type": "MAP_AGENTS", "episode_id": "e", "agent_ids": ["ok", "\udfff"]},
        ]
        for message in bad:
            reply = refusal(client, message)
            assert reply["type"] == "ERROR" and reply["code"] == "INVALID_FIELD", (message, reply)
            assert reply["request"] == message["type"]
        # Nothing was kept: the first good batches make the first updates.
        for _ in range(3):
            assert client.request({"type": "EPISODES_AND_GET_STATE", "episodes": [RECORD]})["type"] == "SET_STATE"
        path = server.logdir / "checkpoint.pt"  # a new run writes one at start; this waits for update 3's
        assert wait_until(lambda: load_checkpoint(path)["modules"]["default_policy"]["weights_seq_no"] == 3, 30)
        client.close()
        summary = server.stop()
    assert summary["updates"] == 3 and summary["env_steps"] == 15, summary
    text = "\n".join(server.lines)
    assert "Traceback" not in text and "failed" not in text.lower(), text

    # Every update's metrics reached the event file.
    script = (
        "import sys; from tensorboard.backend.event_processing.event_accumulator import EventAccumulator as E;"
        "e=E(sys.argv[1]); e.Reload(); print(len(e.Scalars('episode/return_mean')))"
    )
    out = subprocess.run([sys.executable, "-c", script, str(server.logdir)], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.split() == ["3"], out.stderr
