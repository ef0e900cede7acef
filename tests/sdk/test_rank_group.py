"""**[1.9]** A client of a server group (§6.7): the PONG names every rank (``ranks``) and may ask the
client to move to a less loaded one (``redirect``); a client whose rank goes away reconnects to the
others in the reconnect order, with its unanswered batch, its client_session and its batch_seq. Two
scripted servers over real TCP play the ranks. The C++ SDK's sdk_cpp/tests/test_rank_group.cpp and
the C# SDK's sdk_csharp/Tests/RankGroupTests.cs play the same scenarios; tests/integration/
test_scale_out.py gives a fleet one address of a real two-rank group."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable

import numpy as np

from tether.sdk import TetherClient

from .scripted_server import ScriptedConnection, ScriptedServer, constant_model, play_steps, single_agent_config, state

DISCRETE2 = {"type": "Discrete", "n": 2}
CONFIG = single_agent_config(3, DISCRETE2, protocol_version="1.9")
MODEL = constant_model(3, [-5.0, 5.0])


def rank(pong: Callable[[ScriptedConnection], dict[str, Any]], lose_first_batch: threading.Event | None = None
         ) -> ScriptedServer:
    """A rank whose PONG adds ``pong(conn)``; it answers every batch, or, given ``lose_first_batch``, its
    first connection closes at its first batch (unanswered) once the event is set."""

    def handler(conn: ScriptedConnection) -> None:
        message = conn.receive()
        assert message is not None and message["type"] == "PING", message
        conn.send({"type": "PONG", "protocol_version": "1.9", "run_id": "run-a", **pong(conn)})
        while (message := conn.receive(timeout=None)) is not None:
            kind = message["type"]
            if kind == "PING":
                conn.send({"type": "PONG"})
            elif kind == "GET_CONFIG":
                conn.send(CONFIG)
            elif kind == "GET_STATE":
                conn.send(state(1, MODEL))
            elif kind == "EPISODES_AND_GET_STATE":
                if lose_first_batch is not None and conn.index == 0:
                    lose_first_batch.wait(10)
                    return
                conn.send(state(1, None))

    return ScriptedServer(handler)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def addr(server: ScriptedServer | int) -> str:
    return f"127.0.0.1:{server if isinstance(server, int) else server.port}"


def play(client: TetherClient, steps: int) -> None:
    episode = client.start_episode()
    play_steps(client, episode, range(steps))
    client.end_episode(episode, np.zeros(3, np.float32))


def client_of(server: ScriptedServer) -> TetherClient:
    return TetherClient("127.0.0.1", server.port, seed=1, reconnect_timeout_s=10, response_timeout_s=5,
                        update_timeout_s=5, wait_for_weights=False, when_queue_full="wait")


def pings(server: ScriptedServer) -> list[dict[str, Any]]:
    return server.messages("PING")


def test_a_redirect_is_followed_before_anything_but_ping_is_sent() -> None:
    b = rank(lambda conn: {})
    a = rank(lambda conn: {"ranks": [addr(a), addr(b)], "redirect": addr(b)})
    with a, b:
        client = client_of(a)
        play(client, 25)
        client.flush()
        assert client.redirects == 1 and client.server_address == addr(b)
        client.close()
    assert not a.errors and not b.errors, (a.errors, b.errors)
    assert [m["type"] for m in a.messages()] == ["PING"], "only PING went to the rank that redirected"
    assert "redirected" not in pings(a)[0]
    assert pings(b)[0]["redirected"] is True
    assert sum(len(r["actions"]) for m in b.messages("EPISODES_AND_GET_STATE") for r in m["episodes"]) == 25
    assert client.link.connections == 1 and client.link.reconnects == 0, "a redirect is no reconnect"


def test_an_unreachable_redirect_brings_the_client_back_saying_it_was_redirected() -> None:
    nobody = free_port()
    a = rank(lambda conn: {"ranks": [addr(a), addr(nobody)], "redirect": addr(nobody)})
    with a:
        client = client_of(a)
        play(client, 12)
        client.flush()
        assert client.redirects == 0 and client.server_address == addr(a)
        client.close()
    assert not a.errors, a.errors
    first, second = pings(a)[:2]
    assert "redirected" not in first and second["redirected"] is True
    assert [m["type"] for m in a.messages()][:2] == ["PING", "PING"], "the first connection sent only PING"
    assert len(a.messages("EPISODES_AND_GET_STATE")) >= 1


def test_a_redirect_on_a_redirected_connection_is_ignored() -> None:
    a = rank(lambda conn: {"redirect": addr(b)})
    b = rank(lambda conn: {"redirect": addr(a)})
    with a, b:
        client = client_of(a)
        play(client, 12)
        client.flush()
        assert client.redirects == 1 and client.server_address == addr(b)
        client.close()
    assert not a.errors and not b.errors, (a.errors, b.errors)
    assert len(pings(a)) == 1 and len(pings(b)) == 1, "no loop between the two ranks"


def test_a_rank_that_goes_away_is_replaced_by_another_with_the_unanswered_batch() -> None:
    lose = threading.Event()
    b = rank(lambda conn: {"ranks": [addr(a), addr(b)]})
    a = rank(lambda conn: {"ranks": [addr(a), addr(b)]}, lose_first_batch=lose)
    with b:
        client = client_of(a)
        episode = client.start_episode()
        play_steps(client, episode, range(12))  # the 11th step cuts batch 1, lost with rank A, which then goes away
        deadline = time.monotonic() + 5
        while not a.messages("EPISODES_AND_GET_STATE") and time.monotonic() < deadline:
            time.sleep(0.01)
        a.close()  # stops listening: the client's retry of A is refused
        lose.set()
        deadline = time.monotonic() + 10
        while client.link.connections < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.server_address == addr(b) and client.link.connections == 2
        play_steps(client, episode, range(12, 20))
        client.end_episode(episode, np.zeros(3, np.float32))
        client.flush()
        client.close()
    assert not b.errors, b.errors
    lost = a.messages("EPISODES_AND_GET_STATE")[0]
    on_b = b.messages("EPISODES_AND_GET_STATE")
    assert on_b[0]["episodes"] == lost["episodes"]
    assert (on_b[0]["client_session"], on_b[0]["batch_seq"]) == (lost["client_session"], lost["batch_seq"])
    assert client.other_run_steps_dropped == 0, "one run across the group"
    assert sum(len(r["actions"]) for m in on_b for r in m["episodes"]) == 20
