"""The end of a run is said on the wire (§6.6 "End of training"): at max_env_steps (or
stop_at_return) the server writes ERROR TRAINING_DONE with the run's summary to every 1.3
client and closes; the SDK reports it as a normal end (no error, no reconnect) and keeps
acting with its last model. Older clients only see the close; an operator's SIGTERM says
nothing, since that server may come back and its clients must reconnect."""

from __future__ import annotations

import socket
import time

import numpy as np

from tether.sdk import TetherClient
from tether.protocol.framing import FrameDecoder
from tether.protocol.messages import decode_message

from .server_process import RawClient, ServerProcess, read_until_closed


def bodies(data: bytes) -> list[dict]:
    return [decode_message(b)[1] for b in FrameDecoder().feed(data)]



def play_until_training_done(client: TetherClient, seed: int, pause_s: float = 0.0, timeout_s: float = 60.0) -> int:
    """20-step episodes of random 4-float observations until the server says training is done
    (or ``timeout_s``). Returns the steps acted."""
    rng = np.random.default_rng(seed)
    acted = 0
    deadline = time.monotonic() + timeout_s
    while client.training_done is None and time.monotonic() < deadline:
        eid = client.start_episode()
        for _ in range(20):
            client.get_action(eid, rng.normal(size=4).astype(np.float32))
            client.log_returns(eid, 1.0)
            acted += 1
        client.end_episode(eid, np.zeros(4, np.float32))
        if pause_s:
            time.sleep(pause_s)
    return acted


def test_the_sdk_hears_training_done_with_the_summary_and_stops_without_an_error(tmp_path) -> None:
    with ServerProcess(tmp_path, "--max-env-steps", "600", "--env-steps-per-sample", "100",
                       "--train-batch-size", "200", "--minibatch-size", "100") as server:
        # A 1.2 peer and a v1 peer: they are only closed.
        old = RawClient(server.port)
        assert old.request({"type": "PING", "protocol_version": "1.2"})["type"] == "PONG"
        v1 = RawClient(server.port)
        assert v1.request({"type": "PING"})["type"] == "PONG"
        client = TetherClient("127.0.0.1", server.port, seed=1)
        acted = play_until_training_done(client, seed=0, pause_s=0.001)
        summary = client.training_done
        assert summary is not None, "the client was never told that training is done"
        assert summary["reason"] == "max_env_steps" and summary["env_steps"] >= 600
        assert summary["updates"] >= 1 and summary["agent_steps_trained"] >= 200
        assert summary["weights_seq_no"] == summary["updates"]
        # A normal end: the engine goes on acting with the last model, nothing raises, flush returns.
        eid = client.start_episode()
        for _ in range(30):
            client.get_action(eid, np.full(4, 0.1, np.float32))
        client.end_episode(eid, np.zeros(4, np.float32))
        client.flush()
        assert client.link.reconnects == 0, "told that training is done, the client must not reconnect"
        client.close()
        assert bodies(read_until_closed(old.sock)) == [] and bodies(read_until_closed(v1.sock)) == []
        final = server.wait(30)
    assert final["env_steps"] >= 600


def test_an_operators_sigterm_is_no_goodbye(tmp_path) -> None:
    with ServerProcess(tmp_path) as server:
        raw = RawClient(server.port)
        assert raw.request({"type": "PING", "protocol_version": "1.3"})["type"] == "PONG"
        server.stop()
        assert bodies(read_until_closed(raw.sock)) == []


def test_over_a_websocket_the_sdk_hears_training_done_too(tmp_path) -> None:
    """The goodbye and the close arrive together: the SDK reads the ERROR first, ends normally."""
    with ServerProcess(tmp_path, "--max-env-steps", "400", "--env-steps-per-sample", "100", "--ws-port", "0",
                       "--train-batch-size", "200", "--minibatch-size", "100") as server:
        line = next(line for line in server.lines if "ws://" in line)
        url = line[line.index("ws://"):].split()[0]
        client = TetherClient(url, seed=2, wait_for_weights=True)
        play_until_training_done(client, seed=1)
        assert client.training_done is not None and client.training_done["reason"] == "max_env_steps"
        client.flush()
        assert client.link.reconnects == 0 and client.link.fatal is None
        client.close()
        server.wait(30)


def test_a_goodbye_during_the_handshake_ends_the_connect_and_requests_say_training_is_done() -> None:
    from tether.sdk import TetherConnectionError

    from ..sdk.scripted_server import ScriptedServer

    def handler(conn) -> None:
        message = conn.receive()
        assert message is not None and message["type"] == "PING"
        conn.send({"type": "PONG", "protocol_version": "1.3"})
        conn.send({"type": "ERROR", "code": "TRAINING_DONE", "message": "done",
                   "summary": {"reason": "stop_at_return", "updates": 3}})
        # As a server says goodbye: no more writing, and what the client already sent is read (a close
        # with unread bytes resets the connection, which can destroy the goodbye before it is read).
        conn.sock.shutdown(socket.SHUT_WR)
        while conn.receive(timeout=5.0) is not None:
            pass

    with ScriptedServer(handler) as server:
        try:
            TetherClient("127.0.0.1", server.port, reconnect_timeout_s=5.0)
            raise AssertionError("a client whose server's run is done cannot start")
        except TetherConnectionError as exc:
            assert exc.code == "TRAINING_DONE", exc
        time.sleep(0.3)
        assert len(server.connections) == 1, "told that training is done, the client must not connect again"
