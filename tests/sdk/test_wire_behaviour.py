"""What the Python SDK puts on the wire, checked against scripted raw-socket
servers: session and sequence numbers, resends, refusals, heartbeats,
timeouts, connection-level errors, TCP keepalive."""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any

import numpy as np
import pytest

from tether.sdk import ServerError, TetherClient, TetherConnectionError, TetherTimeoutError

from ..integration.server_process import wait_until
from .scripted_server import (ScriptedConnection, ScriptedServer, constant_model, silent_after_handshake,
                              single_agent_config, state)

OBS = np.zeros(3, np.float32)
MODEL = constant_model(3, [0.0, 0.0])
DISCRETE2 = {"type": "Discrete", "n": 2}


def answering(config: dict[str, Any], refuse_seq: int | None = None, drop_first_batch: bool = False):
    """A handler that answers every batch with SET_STATE (refusing one seq, or
    closing the first connection after its first batch without answering)."""

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config, state(0, MODEL))
        while (message := conn.receive(timeout=None)) is not None:
            kind = message["type"]
            if kind in ("EPISODES_AND_GET_STATE", "EPISODES") and drop_first_batch and conn.index == 0:
                return  # the answer never comes: the connection is lost
            if kind == "EPISODES_AND_GET_STATE" and message.get("batch_seq") == refuse_seq:
                conn.send({"type": "ERROR", "code": "INVALID_FIELD", "message": "episodes[0]: refused for the test",
                           "request": "EPISODES_AND_GET_STATE"})
            elif kind in ("EPISODES_AND_GET_STATE", "GET_STATE"):
                conn.send(state(0, None))
            elif kind == "PING":
                conn.send({"type": "PONG"})

    return handler


def play(client: TetherClient, steps: int, eid: str | None = None) -> str:
    eid = eid or client.start_episode()
    for _ in range(steps):
        client.get_action(eid, OBS)
        client.log_returns(eid, 1.0)
    return eid


def test_every_batch_carries_the_session_consecutive_seq_and_step_counts() -> None:
    with ScriptedServer(answering(single_agent_config(3, DISCRETE2, env_steps_per_sample=10))) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, wait_for_weights=True)
        client.end_episode(play(client, 45), OBS)
        client.flush()
        client.close()
        batches = server.messages("EPISODES_AND_GET_STATE")
    assert re.fullmatch(r"[0-9a-f]{32}", client.client_session)
    assert [b["batch_seq"] for b in batches] == list(range(1, len(batches) + 1)) and len(batches) >= 4
    assert all(b["client_session"] == client.client_session for b in batches)
    for b in batches:
        steps = sum(len(r["actions"]) for r in b["episodes"])
        assert b["env_steps"] == b["agent_steps"] == steps >= 1
    assert sum(b["env_steps"] for b in batches) == client.env_steps_sent == 45


def test_a_second_client_object_has_its_own_session() -> None:
    with ScriptedServer(answering(single_agent_config(3, DISCRETE2))) as server:
        first = TetherClient("127.0.0.1", server.port)
        second = TetherClient("127.0.0.1", server.port)
        assert first.client_session != second.client_session
        first.close()
        second.close()


def test_unanswered_batch_is_resent_after_reconnect_with_the_same_session_and_seq() -> None:
    with ScriptedServer(answering(single_agent_config(3, DISCRETE2, env_steps_per_sample=10),
                                  drop_first_batch=True)) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, reconnect_timeout_s=10)
        play(client, 12)
        client.flush()  # waits until every batch is answered, across the reconnect
        client.close()
        sent = [(i, m) for i, _, m in server.received if m["type"] == "EPISODES_AND_GET_STATE"]
    assert client.reconnects == 1
    (lost_conn, lost), (again_conn, again) = sent[0], sent[1]
    assert (lost_conn, again_conn) == (0, 1)
    assert again["client_session"] == lost["client_session"] == client.client_session
    assert again["batch_seq"] == lost["batch_seq"] == 1
    assert again["episodes"] == lost["episodes"]
    assert [m["batch_seq"] for _, m in sent[2:]] == list(range(2, len(sent)))


def test_refused_batch_is_raised_on_the_next_call_and_never_resent() -> None:
    with ScriptedServer(answering(single_agent_config(3, DISCRETE2, env_steps_per_sample=10), refuse_seq=1)) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0)
        eid = play(client, 11)  # the 11th action hands the first batch over
        deadline = time.monotonic() + 10
        with pytest.raises(ServerError) as info:
            while time.monotonic() < deadline:
                play(client, 1, eid)
                time.sleep(0.01)
        assert info.value.code == "INVALID_FIELD" and info.value.request == "EPISODES_AND_GET_STATE"
        assert "refused for the test" in str(info.value)
        play(client, 1, eid)  # raised once; the client goes on (the refused episode is no longer sent)
        client.end_episode(play(client, 11), OBS)
        client.flush()
        client.close()
        seqs = [m["batch_seq"] for m in server.messages("EPISODES_AND_GET_STATE")]
    assert seqs.count(1) == 1 and seqs == sorted(seqs) and seqs[-1] >= 2


def test_idle_client_pings_every_heartbeat_interval_and_not_while_a_request_is_outstanding() -> None:
    held = {}

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=5, heartbeat_interval_s=0.2),
                       state(0, MODEL))
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "PING":
                conn.send({"type": "PONG"})
            elif message["type"] == "EPISODES_AND_GET_STATE":
                held["at"] = time.monotonic()
                time.sleep(1.0)  # an update: the client owes nothing and must stay quiet
                held["until"] = time.monotonic()
                conn.send(state(1, None))

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port)
        time.sleep(1.0)
        idle_pings = server.messages("PING")[1:]  # after the handshake's
        play(client, 6)
        time.sleep(1.6)
        client.close()
        pings = [(t, m) for _, t, m in server.received if m["type"] == "PING"][1:]
    assert 3 <= len(idle_pings) <= 7, idle_pings
    assert all(m == {"type": "PING"} for _, m in pings)
    assert not [t for t, _ in pings if held["at"] < t < held["until"]], "PING while the server owed an answer"
    assert [t for t, _ in pings if t > held["until"]], "heartbeats resume after the answer"
    assert client.link.heartbeats_sent == len(pings)


def test_no_heartbeat_when_the_server_does_not_ask_for_one() -> None:
    with ScriptedServer(answering(single_agent_config(3, DISCRETE2))) as server:
        client = TetherClient("127.0.0.1", server.port)
        time.sleep(0.8)
        client.close()
        assert len(server.messages("PING")) == 1  # the handshake's only


def test_get_action_never_blocks_on_a_server_that_stops_answering() -> None:
    """After the handshake the server reads everything and answers nothing
    (a hung server or a half-open connection): the engine keeps acting at full
    speed, unsent batches stay bounded, and close() returns at once."""

    handler = silent_after_handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=50), state(0, MODEL))
    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0)
        durations = []
        started = time.monotonic()
        for step in range(3000):
            if step % 25 == 0:
                eid = client.start_episode()
            t0 = time.perf_counter()
            client.get_action(eid, OBS)
            durations.append(time.perf_counter() - t0)
            client.log_returns(eid, 1.0)
            if step % 25 == 24:
                client.end_episode(eid, OBS)
        elapsed = time.monotonic() - started
        assert wait_until(lambda: len(server.messages("EPISODES_AND_GET_STATE")) == 1)
        t0 = time.monotonic()
        client.close()
        close_s = time.monotonic() - t0
        batches = server.messages("EPISODES_AND_GET_STATE")
    assert len(batches) == 1, "one batch in flight; the rest wait or are dropped"
    assert client.batches_dropped >= 50 and client.env_steps_sent == 0
    assert max(durations) < 0.05 and elapsed < 5, (max(durations), elapsed)
    assert close_s < 2


def test_unanswered_batch_raises_a_timeout_naming_server_request_and_wait() -> None:
    handler = silent_after_handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=5), state(0, MODEL))
    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, update_timeout_s=0.4)
        eid = play(client, 6)
        deadline = time.monotonic() + 5
        with pytest.raises(TetherTimeoutError) as info:
            while time.monotonic() < deadline:
                play(client, 1, eid)
                time.sleep(0.01)
        client.close()
    text = str(info.value)
    assert f"127.0.0.1:{server.port}" in text and "EPISODES_AND_GET_STATE" in text
    assert "0.4 s" in text and "update_timeout_s" in text
    assert info.value.request == "EPISODES_AND_GET_STATE" and info.value.timeout_s == 0.4


def test_handshake_timeout_is_raised_by_the_constructor() -> None:
    def handler(conn: ScriptedConnection) -> None:
        conn.read_until_closed()  # never answers PING

    with ScriptedServer(handler) as server:
        started = time.monotonic()
        with pytest.raises(TetherTimeoutError) as info:
            TetherClient("127.0.0.1", server.port, response_timeout_s=0.3)
        assert time.monotonic() - started < 3
    assert "PING" in str(info.value) and "response_timeout_s" in str(info.value)
    assert f"127.0.0.1:{server.port}" in str(info.value)


def test_connection_level_error_is_reported_with_its_code() -> None:
    def handler(conn: ScriptedConnection) -> None:
        conn.send({"type": "ERROR", "code": "TOO_MANY_CONNECTIONS", "message": "server full (max_connections 1)"})

    with ScriptedServer(handler) as server:
        with pytest.raises(TetherConnectionError) as info:
            TetherClient("127.0.0.1", server.port, reconnect_timeout_s=0.5)
    assert info.value.code == "TOO_MANY_CONNECTIONS"
    assert "TOO_MANY_CONNECTIONS" in str(info.value) and "server full" in str(info.value)
    assert len(server.connections) >= 2, "the refusal is retried until reconnect_timeout_s"


def test_client_timeout_from_the_server_reconnects_and_keeps_the_data() -> None:
    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=5), state(0, MODEL))
        if conn.index == 0:
            time.sleep(0.3)
            conn.send({"type": "ERROR", "code": "CLIENT_TIMEOUT", "message": "no byte for 60 s"})
            return
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                conn.send(state(0, None))

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, when_queue_full="wait")
        play(client, 12)
        client.flush()
        client.close()
    assert client.reconnects == 1 and "CLIENT_TIMEOUT" in client.link.last_disconnect
    assert client.env_steps_sent == 11  # every step but the last, which waits for its next observation


def test_connections_use_tcp_keepalive() -> None:
    with ScriptedServer(answering(single_agent_config(3, DISCRETE2))) as server:
        client = TetherClient("127.0.0.1", server.port)
        sock = client.link._transport.sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        client.close()


def test_queue_bound_follows_the_servers_staleness_and_wait_policy_delivers_everything() -> None:
    """(max_staleness + 1) * train_batch_size agent steps may wait behind the
    batch in flight. With "drop_oldest" the oldest waiting batches are dropped
    and so is the rest of their episodes: the server never gets a fragment of
    an episode whose earlier steps were lost. With "wait" every step arrives."""
    release = {"go": False}

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=10, train_batch_size=20,
                                           max_staleness=1), state(0, MODEL))
        while (message := conn.receive(timeout=None)) is not None:
            while not release["go"]:
                time.sleep(0.01)  # a slow server
            if message["type"] == "EPISODES_AND_GET_STATE":
                conn.send(state(0, None))

    def play_counting(client: TetherClient, steps: int) -> str:
        eid = client.start_episode()
        for i in range(steps):
            client.get_action(eid, np.array([i, 0, 0], np.float32))
            client.log_returns(eid, 1.0)
            if i == 10:  # the first batch is in flight before the queue fills
                assert wait_until(lambda: server.messages("EPISODES_AND_GET_STATE"), 10)
        return eid

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port)
        assert client.link.queue_limit_steps() == 40
        eid = play_counting(client, 101)
        assert client.batches_dropped >= 1 and client.link.episodes_dropped == 1
        release["go"] = True
        client.end_episode(eid, np.array([101, 0, 0], np.float32))
        client.flush()
        client.close()
        records = [r for m in server.messages("EPISODES_AND_GET_STATE") for r in m["episodes"]]
    firsts = [r["obs"][0][0] for r in records]
    lasts = [r["obs"][-1][0] for r in records]
    assert firsts[0] == 0 and firsts[1:] == lasts[:-1], "the chunks sent are the episode's start, without gaps"
    assert not any(r["is_terminated"] for r in records), "the episode's end went with it"
    assert client.env_steps_sent == sum(len(r["actions"]) for r in records) < 50

    release["go"] = False
    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, when_queue_full="wait")
        threading.Timer(0.5, lambda: release.update(go=True)).start()
        started = time.monotonic()
        client.end_episode(play_counting(client, 101), np.zeros(3, np.float32))
        assert time.monotonic() - started > 0.4, "the engine waited for room"
        client.flush()
        client.close()
    assert client.batches_dropped == 0 and client.env_steps_sent == 101


def test_a_batch_over_the_servers_frame_limit_is_refused_not_resent_forever() -> None:
    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=5), state(0, MODEL))
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                if message["batch_seq"] == 1:
                    conn.send({"type": "ERROR", "code": "FRAME_TOO_LARGE", "message": "frame body of 9 bytes exceeds "
                               "the limit"})
                    return
                conn.send(state(0, None))

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, wait_for_weights=True)
        with pytest.raises(ServerError) as info:
            play(client, 6)
        assert info.value.code == "FRAME_TOO_LARGE"
        eid = play(client, 6)
        client.end_episode(eid, OBS)
        client.flush()
        client.close()
        seqs = [m["batch_seq"] for m in server.messages("EPISODES_AND_GET_STATE")]
    assert seqs.count(1) == 1 and seqs[-1] >= 2


def test_a_batch_lost_with_every_connection_is_given_up_after_max_batch_attempts() -> None:
    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(single_agent_config(3, DISCRETE2, env_steps_per_sample=10), state(0, MODEL))
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                if message["batch_seq"] == 1:
                    return  # this batch takes every connection down before its answer
                conn.send(state(0, None))
            elif message["type"] in ("GET_STATE", "PING"):
                conn.send(state(0, None) if message["type"] == "GET_STATE" else {"type": "PONG"})

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, reconnect_timeout_s=10, max_batch_attempts=3)
        eid = play(client, 11)  # the 11th action hands batch 1 over
        deadline = time.monotonic() + 20
        with pytest.raises(TetherConnectionError) as info:
            while time.monotonic() < deadline:
                play(client, 1, eid)
                time.sleep(0.01)
        assert "3 connections" in str(info.value) and "max_batch_attempts" in str(info.value)
        play(client, 5, eid)  # raised once; the client goes on, the given-up episode is not sent again
        client.end_episode(eid, OBS)
        other = play(client, 12)
        client.end_episode(other, OBS)
        client.flush()
        client.close()
        batches = server.messages("EPISODES_AND_GET_STATE")
    seqs = [b["batch_seq"] for b in batches]
    assert seqs.count(1) == 3 and client.reconnects == 3
    later = [r["episode_id"] for b in batches if b["batch_seq"] > 1 for r in b["episodes"]]
    assert eid not in later and other in later


def test_a_refused_episode_id_used_again_is_a_new_episode_and_is_sent() -> None:
    with ScriptedServer(answering(single_agent_config(3, DISCRETE2, env_steps_per_sample=10), refuse_seq=1)) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0)
        eid = play(client, 11, client.start_episode("reused"))
        deadline = time.monotonic() + 10
        with pytest.raises(ServerError):
            while time.monotonic() < deadline:
                play(client, 1, eid)
                time.sleep(0.01)
        client.end_episode(eid, OBS)
        client.end_episode(play(client, 4, client.start_episode("reused")), OBS)  # the id again: a new episode
        client.flush()
        client.close()
        batches = server.messages("EPISODES_AND_GET_STATE")
    resent = [r for b in batches if b["batch_seq"] > 1 for r in b["episodes"] if r["episode_id"] == "reused"]
    assert len(resent) == 1 and len(resent[0]["actions"]) == 4


def test_errors_an_engine_never_reads_are_bounded_newest_kept() -> None:
    sent = 1500
    constructed = threading.Event()

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(single_agent_config(3, DISCRETE2), state(0, MODEL))
        constructed.wait(10)  # (the constructor would raise the first one)
        for i in range(sent):
            conn.send({"type": "ERROR", "code": "INTERNAL", "message": f"unsolicited {i}"})
        conn.read_until_closed()

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port)
        constructed.set()
        wait_until(lambda: any(f"unsolicited {sent - 1}" in str(e[1]) for e in list(client.link.events)), 10)
        events = list(client.link.events)
        assert len(events) == client.link.max_queued_events == 1024
        assert str(events[0][1]).endswith(f"unsolicited {sent - 1024}")  # the oldest went first
        with pytest.raises(ServerError):
            client.start_episode()
        client.close()
