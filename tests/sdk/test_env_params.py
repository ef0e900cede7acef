"""Environment parameters in the Python SDK (protocol 1.7, §19), against a scripted server: the
request's env_params_seq, a set swapped in on the engine's thread with its callback, each episode's
values drawn from the set it started with, records that say them (the measure on the last), a
malformed set ignored, and nothing asked of a server older than 1.7."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tether.protocol.errors import InvalidInputError
from tether.sdk import MultiAgentClient, TetherClient

from .scripted_server import answering_server, constant_model, sent_records, single_agent_config, state

SET_1 = {"seq": 1, "lesson": 0, "values": {"speed": 2, "gravity": {"sampler": "uniform", "low": 9, "high": 11}}}
SET_2 = {"seq": 2, "lesson": 1, "values": {"speed": 5, "gravity": {"sampler": "ranges", "ranges": [[1, 2], [4, 5]]}}}


def config(version: str = "1.7") -> dict[str, Any]:
    return single_agent_config(2, {"type": "Discrete", "n": 2}, protocol_version=version, env_steps_per_sample=4)


def with_params(n: int, *sets: Any) -> dict[str, Any]:
    """The n-th SET_STATE: the handshake's carries ``sets[0]``, the next ``sets[1]``..., then none."""
    message = state(0, constant_model(2, [0.0, 0.0]) if n == 0 else None)
    if n < len(sets) and sets[n] is not None:
        message["env_params"] = sets[n]
    return message


def play(client: TetherClient, steps: int = 4) -> str:
    eid = client.start_episode()
    for _ in range(steps):
        client.get_action(eid, np.zeros(2, np.float32))
        client.log_returns(eid, 1.0)
    return eid


def test_a_set_is_asked_for_swapped_in_on_the_engine_thread_and_recorded_per_episode() -> None:
    with answering_server(lambda i: config(), lambda i, n: with_params(n, SET_1, SET_2), lambda i: "1.7") as server:
        client = TetherClient("127.0.0.1", server.port, seed=3, wait_for_weights=True)
        assert client.env_params is not None and client.env_params.seq == 1
        calls: list[tuple[int, str]] = []
        client.on_env_params_changed(lambda p: calls.append((p.seq, threading.current_thread().name)))
        assert calls == [(1, threading.current_thread().name)]  # the set held is given at once
        first = play(client, 6)  # a batch is sent at the 5th step and answered (with SET_2) meanwhile
        values = client.episode_params(first)  # (it keeps the values it started with)
        assert values["speed"] == 2.0 and 9.0 <= values["gravity"] <= 11.0
        client.report_measure(first, 0.5)
        client.report_measure(first, 0.75)  # a later report replaces the earlier one
        client.end_episode(first, np.zeros(2, np.float32))
        second = play(client, 2)
        # The new set came with the batch's answer, was swapped in by this thread's next call, and
        # the episode started afterwards drew from it; the first kept its values.
        assert calls == [(1, threading.current_thread().name), (2, threading.current_thread().name)]
        later = client.episode_params(second)
        assert later["speed"] == 5.0 and (1 <= later["gravity"] <= 2 or 4 <= later["gravity"] <= 5)
        client.end_episode(second, np.zeros(2, np.float32))
        client.flush()
        client.close()
    requests = [m for m in server.messages() if m["type"] in ("GET_STATE", "EPISODES_AND_GET_STATE")]
    assert [m["env_params_seq"] for m in requests][:3] == [0, 1, 2]
    records = sent_records(server)
    by_episode: dict[str, list[dict]] = {}
    for record in records:
        by_episode.setdefault(record["episode_id"], []).append(record)
    first_records, second_records = by_episode[first], by_episode[second]
    assert all(r["env_params"] == {"seq": 1, "values": values} for r in first_records[:-1])
    assert first_records[-1]["env_params"] == {"seq": 1, "values": values, "measure": 0.75}
    assert all(r["env_params"]["seq"] == 2 and "measure" not in r["env_params"] for r in second_records)


def test_a_malformed_set_is_ignored_and_the_held_one_kept() -> None:
    bad = {"seq": 2, "lesson": 0, "values": {"speed": "fast"}}
    with answering_server(lambda i: config(), lambda i, n: with_params(n, SET_1, bad), lambda i: "1.7") as server:
        client = TetherClient("127.0.0.1", server.port, seed=3, wait_for_weights=True)
        eid = play(client)
        client.end_episode(eid, np.zeros(2, np.float32))
        client.flush()
        assert client.env_params.seq == 1
        assert client.episode_params(play(client, 1))["speed"] == 2.0
        client.close()
    requests = [m for m in server.messages() if m["type"] in ("GET_STATE", "EPISODES_AND_GET_STATE")]
    assert all(m["env_params_seq"] == 1 for m in requests[1:])


def test_a_server_older_than_1_7_is_asked_nothing_and_episodes_have_no_values() -> None:
    with answering_server(lambda i: config("1.6"), lambda i, n: with_params(n, SET_1), lambda i: "1.6") as server:
        client = TetherClient("127.0.0.1", server.port, seed=3, wait_for_weights=True)
        eid = play(client)
        client.end_episode(eid, np.zeros(2, np.float32))
        client.flush()
        client.close()
    assert all("env_params_seq" not in m for m in server.messages())
    assert all("env_params" not in r for r in sent_records(server))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e301])
def test_a_measure_that_is_not_a_finite_number_is_refused(value: float) -> None:
    with answering_server(lambda i: config(), lambda i, n: with_params(n, SET_1), lambda i: "1.7") as server:
        client = TetherClient("127.0.0.1", server.port, seed=3)
        eid = client.start_episode()
        with pytest.raises(InvalidInputError) as info:
            client.report_measure(eid, value)
        assert info.value.code == "NON_FINITE_VALUE" and "measure" in str(info.value)
        with pytest.raises(KeyError):
            client.report_measure("no-such-episode", 1.0)
        client.close()


def test_the_multi_agent_client_records_a_set_at_the_top_of_its_records() -> None:
    ma_config = {**config(), "modules": {"m": {"observation_space": {"type": "Box", "shape": [2], "low": -1, "high": 1},
                                                "action_space": {"type": "Discrete", "n": 2},
                                                "onnx_input_names": ["obs"], "onnx_output_names": ["action_dist_inputs"],
                                                "trainable": True}},
                 "policy_mapping": [{"pattern": "*", "module": "m"}], "groups": {}}

    def answer(n: int) -> dict[str, Any]:
        message = {"type": "SET_STATE", "models": {"m": {"weights_seq_no": 0, "onnx_file": state(
            0, constant_model(2, [0.0, 0.0]))["onnx_file"]}} if n == 0 else {}}
        if n == 0:
            message["env_params"] = SET_1
        return message

    with answering_server(lambda i: ma_config, lambda i, n: answer(n), lambda i: "1.7") as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=3)
        eid = client.start_episode()
        values = client.episode_params(eid)
        for _ in range(3):
            client.get_action(eid, {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)})
            client.log_returns(eid, {"a": 1.0, "b": 0.0})
        client.report_measure(eid, 2.0)
        client.end_episode(eid, {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)})
        with pytest.raises(ValueError, match="has ended"):
            client.report_measure(eid, 3.0)  # (not sent yet, but ended: as the other SDKs refuse it)
        client.flush()
        client.close()
    (record,) = sent_records(server)
    assert record["env_params"] == {"seq": 1, "values": values, "measure": 2.0} and set(record["agents"]) == {"a", "b"}


def test_a_new_connection_asks_from_zero_and_a_server_without_parameters_drops_the_set() -> None:
    """The first connection's server has a set; the batch is lost with the connection, and the next
    server (another run) has none: the client asks with 0 again and drops its set (§19.2)."""
    with answering_server(lambda i: config(), lambda i, n: with_params(n, SET_1 if i == 0 else None),
                          lambda i: "1.7", drop_first_batch=True) as server:
        client = TetherClient("127.0.0.1", server.port, seed=3, wait_for_weights=True)
        calls: list = []
        client.on_env_params_changed(calls.append)
        assert [p.seq for p in calls] == [1]
        first = play(client, 6)  # the batch at the 5th step goes down with the first connection
        client.end_episode(first, np.zeros(2, np.float32))
        client.flush()
        assert client.reconnects == 1 and client.env_params is None and calls[-1] is None and len(calls) == 2
        assert client.episode_params(play(client, 1)) == {}
        client.close()
    handshakes = [m for m in server.messages() if m["type"] == "GET_STATE"]
    assert len(handshakes) == 2 and all(m["env_params_seq"] == 0 for m in handshakes)
    batches = server.messages("EPISODES_AND_GET_STATE")
    assert batches[0]["env_params_seq"] == 1
    # (the resent batch's records were cut before the drop: they still say the set they were played with)
    assert all(r["env_params"]["seq"] == 1 for b in batches for r in b["episodes"])


def test_callbacks_run_once_per_call_after_every_event_with_the_newest_set() -> None:
    set_3 = {**SET_2, "seq": 3}
    with answering_server(lambda i: config(), lambda i, n: with_params(n, SET_1, SET_2, set_3),
                          lambda i: "1.7") as server:
        client = TetherClient("127.0.0.1", server.port, seed=3)
        calls: list = []
        client.on_env_params_changed(lambda p: calls.append((p.seq, client.weights_seq_no)))
        for _ in range(2):  # answered with SET_2, then SET_3, on the I/O thread
            client.link.request(lambda: client._state_request(False))
        assert calls == [(1, 0)]  # nothing is applied until the engine's next call
        client.start_episode()  # takes both: one call of the callback, with the newest
        assert calls == [(1, 0), (3, 0)] and client.env_params.seq == 3
        client.close()
