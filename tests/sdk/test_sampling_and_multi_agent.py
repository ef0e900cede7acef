"""Sampling and multi-agent rules of the Python SDK, against scripted servers:
one sampler per client across model swaps, raw Box samples in records with
clipped actions for the engine, counting env and agent steps, agents and
groups leaving."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import pytest

from tether.sdk import MultiAgentClient, ServerError, TetherClient
from tether.protocol.errors import InvalidInputError, MessageError, TetherTimeoutError
from tether.protocol.distributions import log_prob
from tether.protocol.spaces import space_from_json

from ..integration.server_process import wait_until
from .scripted_server import (ScriptedConnection, ScriptedServer, constant_model, silent_after_handshake,
                              single_agent_config, state)
from .test_wire_behaviour import answering

UNIFORM_1000 = constant_model(3, [0.0] * 1000)
BOX2 = {"type": "Box", "shape": [2], "low": -1.0, "high": 1.0}
# mean (5, -5), log std (0, 0): nearly every raw sample lies outside the box.
OUTSIDE_BOX = constant_model(3, [5.0, -5.0, 0.0, 0.0])


def new_model_every_batch(conn: ScriptedConnection) -> None:
    conn.handshake(single_agent_config(3, {"type": "Discrete", "n": 1000}, env_steps_per_sample=10),
                   state(0, UNIFORM_1000))
    version = 0
    while (message := conn.receive(timeout=None)) is not None:
        if message["type"] == "EPISODES_AND_GET_STATE":
            version += 1
            conn.send(state(version, UNIFORM_1000))


def first_draws_after_swaps(seed: int) -> list[tuple[int, ...]]:
    """With uniform logits over 1000 actions, an action reveals the sampler's draw."""
    with ScriptedServer(new_model_every_batch) as server:
        client = TetherClient("127.0.0.1", server.port, seed=seed, wait_for_weights=True)
        eid = client.start_episode()
        draws: list[tuple[int, ...]] = []
        policy, current = client.policy, []
        while len(draws) < 4:
            action = client.get_action(eid, np.zeros(3, np.float32))
            if client.policy is not policy:
                policy, current = client.policy, []
            current.append(action)
            if len(current) == 3:
                draws.append(tuple(current))
        client.close()
    return draws


def test_a_seeded_client_keeps_one_sampler_across_model_swaps() -> None:
    draws = first_draws_after_swaps(seed=0)
    assert len(set(draws)) == len(draws), f"the same exploration noise after every swap: {draws}"
    assert first_draws_after_swaps(seed=0) == draws, "a seed makes a client reproducible"


def play_box(server_version: str) -> tuple[np.ndarray, list[dict]]:
    """30 steps of a Box(2) client against a server of ``server_version`` whose model
    puts nearly every raw sample outside the box: (engine actions, records sent)."""
    config = single_agent_config(3, BOX2, env_steps_per_sample=20)

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config, state(0, OUTSIDE_BOX), version=server_version)
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                conn.send(state(0, None))

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1)
        eid = client.start_episode()
        engine_actions = [client.get_action(eid, np.zeros(3, np.float32)) for _ in range(30)]
        client.end_episode(eid, np.zeros(3, np.float32))
        client.flush()
        client.close()
        records = [r for m in server.messages("EPISODES_AND_GET_STATE") for r in m["episodes"]]
    return np.asarray(engine_actions), records


def assert_logp_of_recorded_actions(records: list[dict], recorded: np.ndarray) -> None:
    space = space_from_json(BOX2)
    logps = [lp for r in records for lp in r["action_logp"]]
    dists = [d for r in records for d in r["action_dist_inputs"]]
    np.testing.assert_allclose(logps, [log_prob(space, d, a) for d, a in zip(dists, recorded)], rtol=1e-5)


def test_engine_gets_clipped_box_actions_and_records_keep_the_raw_sample() -> None:
    engine, records = play_box("1.3")
    assert engine.shape == (30, 2) and engine.min() >= -1.0 and engine.max() <= 1.0
    raw = np.asarray([a for r in records for a in r["actions"]], np.float64)
    assert raw.shape == (30, 2) and (raw[:, 0] > 1.0).mean() > 0.9 and (raw[:, 1] < -1.0).mean() > 0.9
    np.testing.assert_allclose(np.clip(raw, -1, 1), engine, atol=1e-6)
    assert_logp_of_recorded_actions(records, raw)


def test_a_server_older_than_1_3_gets_clipped_box_actions_in_records() -> None:
    """A 1.2 server refuses Box actions outside the box (ACTION_OUT_OF_SPACE):
    against it the record carries the clipped action and the density there."""
    engine, records = play_box("1.2")
    recorded = np.asarray([a for r in records for a in r["actions"]], np.float64)
    np.testing.assert_allclose(recorded, engine, atol=1e-6)
    assert recorded.min() >= -1.0 and recorded.max() <= 1.0
    assert_logp_of_recorded_actions(records, recorded)


# -- multi-agent ------------------------------------------------------------------

BOX3 = {"type": "Box", "shape": [3], "low": -10.0, "high": 10.0}
BOX6 = {"type": "Box", "shape": [6], "low": -10.0, "high": 10.0}


def multi_agent_config(solo_action: dict[str, Any], env_steps_per_sample: int = 1000) -> dict[str, Any]:
    names = {"onnx_input_names": ["obs"], "onnx_output_names": ["action_dist_inputs"]}
    return {
        "type": "SET_CONFIG", "env_steps_per_sample": env_steps_per_sample, "force_on_policy": True,
        "modules": {"solo": {"observation_space": BOX3, "action_space": solo_action, **names},
                    "pair": {"observation_space": BOX6, "action_space": {"type": "MultiDiscrete", "nvec": [2, 2]},
                             **names}},
        "policy_mapping": [{"agent_id": "team", "module": "pair"}, {"pattern": "*", "module": "solo"}],
        "groups": {"team": {"members": ["a", "b"], "reward": "sum"}},
    }


def multi_agent_server(solo_action: dict[str, Any], solo_model: bytes, env_steps_per_sample: int = 1000):
    models = {"solo": {"weights_seq_no": 0, "onnx_file": state(0, solo_model)["onnx_file"]},
              "pair": {"weights_seq_no": 0, "onnx_file": state(0, constant_model(6, [0.0] * 4))["onnx_file"]}}

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(multi_agent_config(solo_action, env_steps_per_sample), {"type": "SET_STATE", "models": models})
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] in ("EPISODES_AND_GET_STATE", "GET_STATE"):
                conn.send({"type": "SET_STATE", "models": {}})

    return ScriptedServer(handler)


def obs(*agents: str) -> dict[str, np.ndarray]:
    return {a: np.full(3, i, np.float32) for i, a in enumerate(agents)}


def agent_entries(server: ScriptedServer) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(agent, entry, record) for m in server.messages("EPISODES_AND_GET_STATE") for record in m["episodes"]
            for agent, entry in record["agents"].items()]


def test_group_leaves_as_a_whole_and_its_members_cannot_act_again() -> None:
    with multi_agent_server({"type": "Discrete", "n": 2}, constant_model(3, [0.0, 0.0])) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=0)
        eid = client.start_episode()
        for _ in range(3):
            client.get_action(eid, obs("a", "b", "x"))
        b_latest = obs("a", "b", "x")["b"]
        client.end_agents(eid, {"a": np.full(3, 7.0, np.float32)})  # ends the group; b uses its latest obs
        with pytest.raises(ValueError, match="already left"):
            client.get_action(eid, {"b": np.zeros(3), "x": np.zeros(3)})
        with pytest.raises(ValueError, match="already left"):
            client.get_action(eid, {"a": np.zeros(3), "b": np.zeros(3)})
        client.get_action(eid, obs("x"))
        client.end_agents(eid, {"x": np.zeros(3, np.float32)})
        with pytest.raises(ValueError, match="already left"):
            client.get_action(eid, obs("x"))
        client.end_episode(eid, {})
        client.flush()
        client.close()
        entries = agent_entries(server)
    team = [e for agent, e, _ in entries if agent == "team"]
    assert len(team) == 1 and team[0]["is_terminated"] and len(team[0]["actions"]) == 3
    np.testing.assert_allclose(team[0]["obs"][-1], np.concatenate([np.full(3, 7.0), b_latest]))
    x = [e for agent, e, _ in entries if agent == "x"]
    assert len(x) == 1 and x[0]["is_terminated"] and len(x[0]["actions"]) == 4
    assert all(agent != "a" and agent != "b" for agent, _, _ in entries)


def test_a_last_step_is_held_back_until_the_agent_acts_again_or_leaves() -> None:
    """Batches are cut while agent p waits between its actions: its last step
    stays behind, so its end can still be flagged (no 0-step entry ever)."""
    with multi_agent_server({"type": "Discrete", "n": 2}, constant_model(3, [0.0, 0.0]),
                            env_steps_per_sample=4) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=0, wait_for_weights=True)
        eid = client.start_episode()
        client.get_action(eid, obs("p", "q"))
        for _ in range(12):
            client.get_action(eid, obs("q"))  # p does not act: batches are cut meanwhile
        client.end_agents(eid, {"p": np.ones(3, np.float32)})
        client.end_episode(eid, {})
        client.flush()
        client.close()
        entries = agent_entries(server)
        batches = server.messages("EPISODES_AND_GET_STATE")
    assert len(batches) >= 3
    assert all(len(e["actions"]) >= 1 and len(e["obs"]) == len(e["actions"]) + 1 for _, e, _ in entries)
    p = [e for agent, e, _ in entries if agent == "p"]
    assert len(p) == 1 and p[0]["is_terminated"] and len(p[0]["actions"]) == 1
    # Env steps count get_action calls, agent steps count actions.
    assert sum(b["env_steps"] for b in batches) == 13
    assert sum(b["agent_steps"] for b in batches) == 14 == client.agent_steps_sent
    for b in batches:
        assert b["agent_steps"] == sum(len(e["actions"]) for r in b["episodes"] for e in r["agents"].values())


def test_multi_agent_box_actions_are_clipped_for_the_engine_and_raw_in_records() -> None:
    with multi_agent_server(BOX2, OUTSIDE_BOX) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=0)
        eid = client.start_episode()
        engine = [client.get_action(eid, obs("u"))["u"] for _ in range(10)]
        client.end_episode(eid, {})
        client.flush()
        client.close()
        raw = np.asarray([a for agent, e, _ in agent_entries(server) for a in e["actions"]])
    assert np.abs(np.asarray(engine)).max() <= 1.0
    assert raw.shape == (10, 2) and (raw[:, 0] > 1.0).mean() > 0.8
    np.testing.assert_allclose(np.clip(raw, -1, 1), engine, atol=1e-6)


def test_multi_agent_client_sends_the_session_and_sequence_too() -> None:
    with multi_agent_server({"type": "Discrete", "n": 2}, constant_model(3, [0.0, 0.0]),
                            env_steps_per_sample=5) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=0, wait_for_weights=True)
        eid = client.start_episode()
        for _ in range(20):
            client.get_action(eid, obs("u", "v"))
        client.end_episode(eid, {})
        client.flush()
        client.close()
        batches = server.messages("EPISODES_AND_GET_STATE")
    assert [b["batch_seq"] for b in batches] == list(range(1, len(batches) + 1)) and len(batches) >= 3
    assert {b["client_session"] for b in batches} == {client.client_session}
    assert all("weights_seq_nos" in b for b in batches)


def test_multi_agent_get_action_does_not_wait_for_a_batch_answer() -> None:
    def handler(conn: ScriptedConnection) -> None:
        models = {m: {"weights_seq_no": 0, "onnx_file": state(0, constant_model(d, [0.0] * k))["onnx_file"]}
                  for m, d, k in (("solo", 3, 2), ("pair", 6, 4))}
        conn.handshake(multi_agent_config({"type": "Discrete", "n": 2}, 5), {"type": "SET_STATE", "models": models})
        conn.read_until_closed()  # never answers

    with ScriptedServer(handler) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=0)
        worst = 0.0
        for step in range(500):
            if step % 10 == 0:
                eid = client.start_episode()
            t0 = time.perf_counter()
            client.get_action(eid, obs("u", "v"))
            worst = max(worst, time.perf_counter() - t0)
            if step % 10 == 9:
                client.end_episode(eid, {})
            if client.link.busy and not server.messages("EPISODES_AND_GET_STATE"):
                # The first batch goes out (and is never answered) before the rest pile up:
                # on a loaded machine the queue could otherwise drop every batch unsent.
                assert wait_until(lambda: len(server.messages("EPISODES_AND_GET_STATE")) == 1)
        assert wait_until(lambda: len(server.messages("EPISODES_AND_GET_STATE")) == 1)
        client.close()
    assert worst < 0.05 and client.batches_dropped > 10


def test_a_group_action_that_does_not_split_into_its_members_is_refused() -> None:
    """A group module whose action has 3 parts for 2 members: the client refuses it (as the C++ and C#
    clients do) instead of handing member "b" a short action."""
    names = {"onnx_input_names": ["obs"], "onnx_output_names": ["action_dist_inputs"]}
    config = {"type": "SET_CONFIG", "env_steps_per_sample": 1000, "force_on_policy": True,
              "modules": {"pair": {"observation_space": BOX6, "action_space": {"type": "MultiDiscrete", "nvec": [2, 2, 2]},
                                   **names}},
              "policy_mapping": [{"agent_id": "team", "module": "pair"}],
              "groups": {"team": {"members": ["a", "b"], "reward": "sum"}}}
    models = {"pair": {"weights_seq_no": 0, "onnx_file": state(0, constant_model(6, [0.0] * 6))["onnx_file"]}}

    handler = silent_after_handshake(config, {"type": "SET_STATE", "models": models})

    with ScriptedServer(handler) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=0)
        eid = client.start_episode()
        with pytest.raises(InvalidInputError, match="does not split into 2 equal parts"):
            client.get_action(eid, obs("a", "b"))
        # Refused before anything of the frame was recorded or sampled.
        assert client._pending_steps == 0 and client._episodes[eid].t == 0
        assert all(not actor.recorder.actions for actor in client._episodes[eid].actors.values())
        client.close()


def test_rules_naming_a_module_set_config_does_not_describe_are_refused_at_connect() -> None:
    """A SET_CONFIG whose policy_mapping names a module not in "modules": the client refuses it at the
    handshake with INVALID_FIELD naming the module (as the C++ and C# clients do), not at a later frame; of
    two unknown modules, the first in sorted order (in every SDK)."""
    names = {"onnx_input_names": ["obs"], "onnx_output_names": ["action_dist_inputs"]}
    config = {"type": "SET_CONFIG", "env_steps_per_sample": 1000, "force_on_policy": True,
              "modules": {"pair": {"observation_space": BOX6, "action_space": {"type": "Discrete", "n": 2}, **names}},
              "policy_mapping": [{"pattern": "a_*", "module": "pair"}, {"pattern": "x_*", "choose_from": ["pair", "zebra", "ghost"]}]}
    with ScriptedServer(silent_after_handshake(config, {"type": "SET_STATE", "models": {}})) as server:
        with pytest.raises(MessageError, match="policy_mapping names module 'ghost'") as refused:
            MultiAgentClient("127.0.0.1", server.port, seed=0, reconnect_timeout_s=2)
    assert refused.value.code.value == "INVALID_FIELD"


def mapping_server(on_map_agents: Callable[[ScriptedConnection, dict[str, Any]], bool]) -> ScriptedServer:
    """A multi-agent server of one module "solo" that maps with its own function ("policy_mapping":
    null); ``on_map_agents`` answers each MAP_AGENTS, or returns False to close the connection."""
    box = {"type": "Box", "shape": [2], "low": -1.0, "high": 1.0}
    module = {"observation_space": box, "action_space": {"type": "Discrete", "n": 2}, "onnx_input_names": ["obs"],
              "onnx_output_names": ["action_dist_inputs"], "trainable": True}
    config = {"type": "SET_CONFIG", "env_steps_per_sample": 100, "force_on_policy": True, "protocol_version": "1.3",
              "modules": {"solo": module}, "policy_mapping": None, "groups": {}}
    models = {"type": "SET_STATE", "models": {"solo": {"weights_seq_no": 0, "onnx_file": state(
        0, constant_model(2, [0.0, 0.0]))["onnx_file"]}}}

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config, models)
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "MAP_AGENTS" and not on_map_agents(conn, message):
                return
            if message["type"] == "GET_STATE":
                conn.send({"type": "SET_STATE", "models": {}})

    return ScriptedServer(handler)


def test_a_map_agents_lost_with_its_connection_is_sent_again_on_the_next() -> None:
    """§6.5: a request whose connection ends before its answer is sent again, unchanged, on the next
    connection (as the C++ and C# SDKs do): the caller gets the answer, not a connection error."""
    def first_two_lost(conn: ScriptedConnection, message: dict[str, Any]) -> bool:
        if conn.index < 2:
            return False  # (closed unanswered: lost with the connection)
        conn.send({"type": "AGENT_MODULES", "modules": {a: "solo" for a in message["agent_ids"]}})
        return True

    with mapping_server(first_two_lost) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1, reconnect_timeout_s=5.0)
        try:
            episode = client.start_episode("e")
            assert client.map_agents(episode, ["a_0", "a_1"]) == {"a_0": "solo", "a_1": "solo"}
        finally:
            client.close()
        asked = server.messages("MAP_AGENTS")
        assert len(asked) == 3 and all(m == asked[0] for m in asked), asked
        assert len(server.connections) == 3 and not server.errors


def test_a_map_agents_lost_on_every_connection_times_out_once_the_call_waited_response_timeout_s() -> None:
    """The wait for a request is bounded across reconnects (§6.6), as in the C++ and C# SDKs: a server that
    drops the connection at every MAP_AGENTS makes the call fail after response_timeout_s, not wait forever."""
    with mapping_server(lambda conn, message: False) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1, reconnect_timeout_s=5.0, response_timeout_s=2.0)
        try:
            episode = client.start_episode("e")
            started = time.monotonic()
            with pytest.raises(TetherTimeoutError, match="MAP_AGENTS"):
                client.map_agents(episode, ["a_0"])
            assert 1.9 < time.monotonic() - started < 8
        finally:
            client.close()
        assert len(server.messages("MAP_AGENTS")) >= 2  # (sent again on each new connection meanwhile)


@pytest.mark.parametrize("code", ["BAD_HEADER", "FRAME_TOO_LARGE"])
def test_a_map_agents_whose_bytes_the_server_refused_fails_and_is_not_sent_again(code: str) -> None:
    """The server refused the request's bytes (a connection-level ERROR, §6.6): sent again they would be
    refused again, so the call fails with that code at once, as in the C++ and C# SDKs."""
    def refused(conn: ScriptedConnection, message: dict[str, Any]) -> bool:
        conn.send({"type": "ERROR", "code": code, "message": "refused for the test"})
        return False

    with mapping_server(refused) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1, reconnect_timeout_s=5.0)
        try:
            episode = client.start_episode("e")
            started = time.monotonic()
            with pytest.raises(ServerError) as raised:
                client.map_agents(episode, ["a_0"])
            assert raised.value.code == code and time.monotonic() - started < 10
        finally:
            client.close()
        assert len(server.messages("MAP_AGENTS")) == 1
