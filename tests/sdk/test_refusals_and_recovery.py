"""What the Python SDK does around refusals, slow answers and server-side
errors that do not end the connection, against scripted raw-socket servers:
backpressure never loses a cut batch, a refused batch takes the rest of its
episodes with it, the off-policy acknowledgement may wait for an update, a
server at its connection limit gets a pause of at least 1 s, and an ERROR
answering a heartbeat or an acknowledging GET_STATE is reported, not fatal."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tether.sdk import ServerError, TetherClient

from .scripted_server import ScriptedConnection, ScriptedServer, constant_model, single_agent_config, state

MODEL = constant_model(3, [0.0, 0.0])
DISCRETE2 = {"type": "Discrete", "n": 2}


def refusing(refuse_seq: int, answer_after_s: float = 0.0, **config_extra):
    config = single_agent_config(3, DISCRETE2, **config_extra)

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config, state(0, MODEL))
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                time.sleep(answer_after_s)
                if message["batch_seq"] == refuse_seq:
                    conn.send({"type": "ERROR", "code": "INVALID_FIELD", "message": "refused for the test",
                               "request": "EPISODES_AND_GET_STATE"})
                else:
                    conn.send(state(0, None))
            elif message["type"] == "GET_STATE":
                conn.send(state(0, None))

    return handler


def act(client: TetherClient, eid: str, obs: np.ndarray, refusals: list[ServerError]) -> None:
    """get_action, called again after it raised the refusal of an earlier batch."""
    while True:
        try:
            client.get_action(eid, obs)
            return
        except ServerError as exc:
            refusals.append(exc)


def test_waiting_for_room_never_loses_the_batch_it_cut_when_a_refusal_arrives() -> None:
    """Whole episodes of 5 steps, two per batch; the server answers slowly and
    refuses seq 1 while the engine waits for room: every episode but the two
    of the refused batch arrives, each whole."""
    with ScriptedServer(refusing(1, answer_after_s=0.3, env_steps_per_sample=10)) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, max_queued_steps=10, when_queue_full="wait")
        refusals: list[ServerError] = []
        played = []
        for e in range(10):
            eid = client.start_episode()
            played.append(eid)
            for t in range(5):
                act(client, eid, np.array([e, t, 0], np.float32), refusals)
                client.log_returns(eid, 1.0)
            client.end_episode(eid, np.array([e, 5, 0], np.float32))
        try:
            client.flush()
        except ServerError as exc:
            refusals.append(exc)
        client.flush()
        client.close()
        batches = server.messages("EPISODES_AND_GET_STATE")
    assert [r.code for r in refusals] == ["INVALID_FIELD"]
    refused = {r["episode_id"] for b in batches if b["batch_seq"] == 1 for r in b["episodes"]}
    delivered = [r for b in batches if b["batch_seq"] != 1 for r in b["episodes"]]
    assert len(refused) == 2 and client.batches_dropped == 0
    assert sorted(r["episode_id"] for r in delivered) == sorted(set(played) - refused)
    assert all(len(r["actions"]) == 5 and r["is_terminated"] for r in delivered)
    assert client.env_steps_sent == 40


def test_a_refused_batch_takes_the_rest_of_its_episode_with_it() -> None:
    with ScriptedServer(refusing(1, env_steps_per_sample=10)) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, wait_for_weights=True)
        refusals: list[ServerError] = []
        long_one = client.start_episode()
        for t in range(40):
            act(client, long_one, np.array([t, 0, 0], np.float32), refusals)
        assert len(refusals) == 1
        client.end_episode(long_one, np.zeros(3, np.float32))
        later = client.start_episode()
        for t in range(12):
            act(client, later, np.array([t, 1, 0], np.float32), refusals)
        client.end_episode(later, np.zeros(3, np.float32))
        client.flush()
        client.close()
        batches = server.messages("EPISODES_AND_GET_STATE")
    assert [r["episode_id"] for r in batches[0]["episodes"]] == [long_one]
    after = [r for b in batches[1:] for r in b["episodes"]]
    assert all(r["episode_id"] != long_one for r in after), "a fragment of the refused episode was sent"
    assert sum(len(r["actions"]) for r in after if r["episode_id"] == later) == 12


def test_off_policy_acknowledgement_may_take_an_update_not_a_response_timeout() -> None:
    """The GET_STATE behind EPISODES is answered once the EPISODES got room in
    the server's pool: it is bounded by update_timeout_s."""
    config = single_agent_config(3, DISCRETE2, env_steps_per_sample=10, force_on_policy=False)

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config, state(0, MODEL))
        after_episodes = False
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES":
                after_episodes = True
            elif message["type"] == "GET_STATE":
                if after_episodes:
                    time.sleep(1.0)  # the pool is full until an update ends
                conn.send(state(0, None))

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, response_timeout_s=0.4, update_timeout_s=10)
        eid = client.start_episode()
        for t in range(11):
            client.get_action(eid, np.array([t, 0, 0], np.float32))
        client.end_episode(eid, np.zeros(3, np.float32))
        client.flush()
        client.close()
        sent = server.messages("EPISODES")
    assert client.reconnects == 0 and len(sent) == 2 and client.env_steps_sent == 11


def test_a_server_at_its_connection_limit_gets_at_least_one_second() -> None:
    config = single_agent_config(3, DISCRETE2)

    def handler(conn: ScriptedConnection) -> None:
        if conn.index == 0:
            conn.receive()
            conn.send({"type": "ERROR", "code": "TOO_MANY_CONNECTIONS", "message": "at the limit of 1 connection"})
            return
        conn.handshake(config, state(0, MODEL))
        conn.read_until_closed()

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, reconnect_timeout_s=10)
        client.close()
        with server.lock:
            pings = [(i, t) for i, t, m in server.received if m["type"] == "PING"]
    assert [i for i, _ in pings] == [0, 1]
    assert pings[1][1] - pings[0][1] >= 1.0


def test_an_error_answering_a_heartbeat_is_reported_and_the_link_goes_on() -> None:
    config = single_agent_config(3, DISCRETE2, env_steps_per_sample=5, heartbeat_interval_s=0.1)

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config, state(0, MODEL))
        heartbeats = 0
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "PING":
                heartbeats += 1
                if heartbeats == 1:
                    conn.send({"type": "ERROR", "code": "INTERNAL", "message": "heartbeat failed", "request": "PING"})
                else:
                    conn.send({"type": "PONG"})
            elif message["type"] == "EPISODES_AND_GET_STATE":
                conn.send(state(0, None))

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, max_queued_steps=1000)
        time.sleep(0.5)
        with pytest.raises(ServerError) as info:
            client.refresh_weights()
        assert info.value.code == "INTERNAL"
        eid = client.start_episode()
        for t in range(12):
            client.get_action(eid, np.array([t, 0, 0], np.float32))
        client.end_episode(eid, np.zeros(3, np.float32))
        client.flush()
        client.close()
    assert client.link.fatal is None and client.reconnects == 0 and client.env_steps_sent == 12


def test_an_error_answering_the_off_policy_get_state_is_reported_and_the_batch_counts() -> None:
    config = single_agent_config(3, DISCRETE2, env_steps_per_sample=5, force_on_policy=False)

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config, state(0, MODEL))
        acknowledged = 0
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "GET_STATE":
                acknowledged += 1
                if acknowledged == 1:
                    conn.send({"type": "ERROR", "code": "INTERNAL", "message": "state failed", "request": "GET_STATE"})
                else:
                    conn.send(state(0, None))

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=0, max_queued_steps=1000)
        eid = client.start_episode()
        errors: list[ServerError] = []
        for t in range(12):
            act(client, eid, np.array([t, 0, 0], np.float32), errors)
        # (the error surfaces at whichever call comes after its answer: the episode's end on a slow
        # machine, which raises it before ending anything, so it is called again)
        for call in (lambda: client.end_episode(eid, np.zeros(3, np.float32)), client.flush):
            while True:
                try:
                    call()
                    break
                except ServerError as exc:
                    errors.append(exc)
        client.close()
        sent = server.messages("EPISODES")
    assert [e.code for e in errors] == ["INTERNAL"]
    assert client.link.fatal is None and client.reconnects == 0
    assert [m["batch_seq"] for m in sent] == list(range(1, len(sent) + 1))
    assert sum(len(r["actions"]) for m in sent for r in m["episodes"]) == 12
