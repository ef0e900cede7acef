"""**[1.8]** A reconnect that reaches another server run (PONG run_id, §6.5, §7.2): a server
restarted without resuming counts weights versions from 0 again, so steps acted with the old run's
weights claim versions that name other weights there, and their action_logp no model of the new
run explains (its check refuses their whole message, ACTION_LOGP_MISMATCH). Every SDK therefore
drops them: the batch cut before the reconnect and not answered is not sent again, the steps not
cut yet go at the reconnect, both are counted (``other_run_steps_dropped``), and the episodes go
on. The same run (a resumed server) keeps the rules of §6.5: the batch is sent again, nothing is
dropped. The C++ SDK's sdk_cpp/tests/test_another_run.cpp and the C# SDK's
sdk_csharp/Tests/AnotherRunTests.cs play the same scenarios."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from tether.sdk import MultiAgentClient, TetherClient

from .scripted_server import ScriptedConnection, ScriptedServer, constant_model, play_steps, single_agent_config, state
from .test_reconnect_new_spaces import config as ma_config
from .test_reconnect_new_spaces import frame, models, unique_batches

DISCRETE2 = {"type": "Discrete", "n": 2}


def handshake(conn: ScriptedConnection, run_id: str | None, cfg: dict[str, Any], set_state: dict[str, Any]) -> None:
    """PING, GET_CONFIG, GET_STATE answered, the PONG naming ``run_id``."""
    for _ in range(3):
        message = conn.receive()
        assert message is not None, "client closed during the handshake"
        kind = message["type"]
        if kind == "PING":
            conn.send({"type": "PONG", "protocol_version": "1.8", **({"run_id": run_id} if run_id else {})})
        elif kind == "GET_CONFIG":
            conn.send(cfg)
        else:
            assert kind == "GET_STATE", kind
            conn.send(set_state)


def restarting_server(second_run: str | None, cfg: dict[str, Any], first_state: dict[str, Any],
                      second_state: dict[str, Any], answer: dict[str, Any]) -> tuple[ScriptedServer, threading.Event]:
    """Run "run-a" loses the first batch with its connection once ``release`` is set; the next
    connection reaches ``second_run`` and answers every request with ``answer``."""
    release = threading.Event()

    def handler(conn: ScriptedConnection) -> None:
        first = conn.index == 0
        handshake(conn, "run-a" if first else second_run, cfg, first_state if first else second_state)
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE" and first:
                release.wait(10)
                return  # lost with the connection, unanswered
            if message["type"] in ("EPISODES_AND_GET_STATE", "GET_STATE"):
                conn.send(answer)
            elif message["type"] == "PING":
                conn.send({"type": "PONG"})

    return ScriptedServer(handler), release


def wait_for_reconnect(client: Any) -> None:
    deadline = time.monotonic() + 5
    while client.link.connections < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.link.connections == 2


@pytest.mark.parametrize("second_run", ["run-b", "run-a", None])
def test_single_agent_steps_of_another_run_are_dropped_and_the_episode_goes_on(second_run: str | None) -> None:
    """Batch 1 (steps 0-9) is lost with run-a's connection; steps 10 and 11 are recorded, not cut.
    Reaching run-b, neither is sent (12 steps counted) and the episode's next chunk starts at step
    12, claiming run-b's version; reaching run-a again (resumed), or a server that names no run,
    batch 1 goes again and steps 10 and 11 are kept."""
    cfg = single_agent_config(3, DISCRETE2, protocol_version="1.8")
    model = constant_model(3, [-5.0, 5.0])
    server, release = restarting_server(second_run, cfg, state(3, model), state(0, model), state(0, None))
    with server:
        client = TetherClient("127.0.0.1", server.port, seed=5, reconnect_timeout_s=5, response_timeout_s=5,
                              update_timeout_s=5, wait_for_weights=False)
        a = client.start_episode("a")
        play_steps(client, a, range(12))  # the 11th cuts batch 1 (steps 0-9), lost with the connection
        release.set()
        wait_for_reconnect(client)
        play_steps(client, a, range(12, 30))
        assert client.end_episode(a, np.full(3, -1, np.float32)) == 30.0
        client.flush()  # no error: nothing was refused
        client.close()
        batches = unique_batches(server)
        on_second = [m for i, _, m in server.received if i == 1 and m["type"] == "EPISODES_AND_GET_STATE"]
    assert not server.errors, server.errors
    if second_run == "run-b":
        assert client.other_run_steps_dropped == 12 and client.link.other_run_steps_dropped == 10
        assert all(batch["batch_seq"] != 1 for batch in on_second), "batch 1 was not sent to run-b"
        later = [r for batch in batches[1:] for r in batch["episodes"]]
        assert later[0]["obs"][0][0] == 12.0, "steps 10 and 11 were dropped"
        assert sum(len(r["actions"]) for r in later) == 18
        assert all(batch["weights_seq_no"] == 0 for batch in batches[1:]), "run-b's version is claimed"
    else:
        assert client.other_run_steps_dropped == 0
        assert on_second[0]["batch_seq"] == 1, "batch 1 goes again to the same run"
        assert sum(len(r["actions"]) for batch in batches for r in batch["episodes"]) == 30
        assert batches[1]["episodes"][0]["obs"][0][0] == 10.0


def test_a_drop_while_the_cutting_step_waits_leaves_that_step_whole() -> None:
    """The batch cut at step 10 waits for its answer (wait_for_weights): its connection goes
    unanswered and the client reaches run-b within that same call, taking in run-b's connection
    (and dropping the steps not cut yet) while the step that cut the batch is still being acted. The
    step's observation, lent to the cut, went with the dropped steps: the step is acted and recorded
    once, and every step from 10 on reaches run-b in order (the C++ SDK once took the observation
    back a second time and ended the game)."""
    cfg = single_agent_config(3, DISCRETE2, protocol_version="1.8")
    model = constant_model(3, [-5.0, 5.0])
    server, release = restarting_server("run-b", cfg, state(3, model), state(0, model), state(0, None))
    release.set()  # batch 1's connection goes at once
    with server:
        client = TetherClient("127.0.0.1", server.port, seed=5, reconnect_timeout_s=5, response_timeout_s=5,
                              update_timeout_s=5, wait_for_weights=True)
        a = client.start_episode("a")
        play_steps(client, a, range(30))  # the 11th cuts batch 1 and waits through the reconnect to run-b
        assert client.end_episode(a, np.full(3, -1, np.float32)) == 30.0
        client.flush()
        client.close()
        on_second = [m for i, _, m in server.received if i == 1 and m["type"] == "EPISODES_AND_GET_STATE"]
    assert not server.errors, server.errors
    assert client.other_run_steps_dropped == 10  # batch 1 (the link's); nothing recorded was not cut then
    firsts = [r["obs"][i][0] for batch in on_second for r in batch["episodes"] for i in range(len(r["actions"]))]
    assert firsts == [float(t) for t in range(10, 30)], firsts


def test_multi_agent_steps_of_another_run_are_dropped_in_every_module() -> None:
    """Both modules' steps not cut yet go at the reconnect to run-b (a_0's and b_0's), and the batch
    lost with run-a's connection is not sent; the episode goes on, each agent from its next frame."""
    cfg = ma_config(2)
    server, release = restarting_server("run-b", cfg, models(cfg, ("m", "n"), seq=4), models(cfg, ("m", "n")),
                                        {"type": "SET_STATE", "models": {}})
    with server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=5, reconnect_timeout_s=5, response_timeout_s=5,
                                  update_timeout_s=5, wait_for_weights=False, when_queue_full="wait")
        eid = client.start_episode("e")
        for t in range(7):  # 5 steps of each agent sendable at the 6th frame: batch 1, lost
            client.get_action(eid, frame(t, "a_0", "b_0"))
            client.log_returns(eid, {"a_0": 1.0, "b_0": 1.0})
        release.set()
        wait_for_reconnect(client)
        for t in range(7, 30):
            client.get_action(eid, frame(t, "a_0", "b_0"))
            client.log_returns(eid, {"a_0": 1.0, "b_0": 1.0})
        client.end_episode(eid)
        client.flush()
        client.close()
        batches = unique_batches(server)
    assert not server.errors, server.errors
    sent_first = sum(len(entry["actions"]) for r in batches[0]["episodes"] for entry in r["agents"].values())
    later = [r for batch in batches[1:] for r in batch["episodes"]]
    assert client.link.other_run_steps_dropped == sent_first > 0
    assert client.other_run_steps_dropped == 2 * 7  # (batch 1's, and every step after it recorded before the sync)
    for record in later:
        for agent, entry in record["agents"].items():
            assert all(row[0] >= 7 for row in entry["obs"]), (agent, "steps acted with run-a's models went")
    assert all(batch["weights_seq_nos"] == {"m": 0, "n": 0} for batch in batches[1:])
    assert sum(len(entry["actions"]) for r in later for entry in r["agents"].values()) == 2 * 23


def test_steps_dropped_for_other_spaces_of_another_run_count_as_another_runs() -> None:
    """Run-b also observes 4 values, not 3: the steps not cut yet are dropped by the rule for other spaces
    (the model goes until run-b's arrives) and still counted as another run's: 12, as without the change."""
    first = single_agent_config(3, DISCRETE2, protocol_version="1.8")
    second = single_agent_config(4, DISCRETE2, protocol_version="1.8")
    release = threading.Event()

    def handler(conn: ScriptedConnection) -> None:
        first_connection = conn.index == 0
        handshake(conn, "run-a" if first_connection else "run-b", first if first_connection else second,
                  state(3, constant_model(3, [-5.0, 5.0])) if first_connection else state(0, constant_model(4, [-5.0, 5.0])))
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE" and first_connection:
                release.wait(10)
                return
            if message["type"] in ("EPISODES_AND_GET_STATE", "GET_STATE"):
                conn.send(state(0, None))

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=5, reconnect_timeout_s=5, response_timeout_s=5,
                              update_timeout_s=5, wait_for_weights=False)
        a = client.start_episode("a")
        play_steps(client, a, range(12))
        release.set()
        wait_for_reconnect(client)
        play_steps(client, a, range(12, 30), width=4)
        client.end_episode(a, np.full(4, -1, np.float32))
        client.flush()
        client.close()
        batches = unique_batches(server)
    assert client.other_run_steps_dropped == 12 and client.link.other_run_steps_dropped == 10
    later = [r for batch in batches[1:] for r in batch["episodes"]]
    assert later[0]["obs"][0] == [12.0] * 4 and sum(len(r["actions"]) for r in later) == 18
