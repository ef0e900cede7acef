"""log_action (protocol 1.6, §10.1, §12.4, §15): steps whose actions the policy did not choose, recorded
beside sampled ones and marked ``logged_runs``; checked locally like the server checks them; refused
against a server older than 1.6, and let go (never sent unmarked) when a batch goes to one after a
reconnect; a model with memory advanced by them; recorded to a demonstration file while playing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tether.protocol.demonstrations import read_demonstrations
from tether.protocol.errors import InvalidInputError, NotReadyError
from tether.sdk import MultiAgentClient, TetherClient

from .scripted_server import (ScriptedConnection, ScriptedServer, answering_server, constant_model, sent_records,
                             single_agent_config, state)
from .test_recurrent_state import MODEL, NAMES, OBS_SPACE, STATES, episode_obs, run_model

LOGITS = [0.0, 1.0, 2.0]


def serving(config: dict[str, Any], set_state: dict[str, Any], version: str = "1.6",
            later_version: str | None = None, drop_first_batch: bool = False) -> ScriptedServer:
    """Answers every batch with a SET_STATE; connections after the first claim ``later_version``."""
    return answering_server(lambda i: config, lambda i, n: set_state,
                            lambda i: version if i == 0 or later_version is None else later_version, drop_first_batch)


def discrete_config(steps: int = 100) -> dict[str, Any]:
    return single_agent_config(2, {"type": "Discrete", "n": 3}, protocol_version="1.6", env_steps_per_sample=steps)


def test_logged_steps_are_marked_with_their_own_actions_and_no_behaviour_logp() -> None:
    with serving(discrete_config(), state(0, constant_model(2, LOGITS))) as server:
        client = TetherClient("127.0.0.1", server.port, seed=3)
        eid = client.start_episode()
        calls = ["sample", "log", "log", "sample", "log"]
        for t, call in enumerate(calls):
            obs = np.array([t / 10, -t / 10], np.float32)
            if call == "log":
                client.log_action(eid, obs, 0)
            else:
                client.get_action(eid, obs)
            client.log_returns(eid, 1.0)
        client.end_episode(eid, np.zeros(2, np.float32))
        client.flush()
        client.close()
    (record,) = sent_records(server)
    assert record["logged_runs"] == [[1, 2], [4, 1]]
    assert [record["actions"][t] for t in (1, 2, 4)] == [0, 0, 0]
    assert [record["action_logp"][t] for t in (1, 2, 4)] == [0.0, 0.0, 0.0]
    # The model was still evaluated at logged steps: their dist inputs are its output.
    np.testing.assert_allclose(record["action_dist_inputs"], [LOGITS] * 5, atol=1e-6)
    assert record["rewards"] == [1.0] * 5


@pytest.mark.parametrize("action, code", [(3, "ACTION_OUT_OF_SPACE"), (1.5, "ACTION_OUT_OF_SPACE"),
                                          ([0, 1], "ACTION_OUT_OF_SPACE"), (float("nan"), "NON_FINITE_VALUE"),
                                          ("left", "ACTION_OUT_OF_SPACE")])
def test_a_logged_action_outside_the_space_is_refused_and_nothing_recorded(action: Any, code: str) -> None:
    with serving(discrete_config(), state(0, constant_model(2, LOGITS))) as server:
        client = TetherClient("127.0.0.1", server.port, seed=3)
        eid = client.start_episode()
        with pytest.raises(InvalidInputError) as info:
            client.log_action(eid, np.zeros(2, np.float32), action)
        assert info.value.code == code and "logged action" in str(info.value)
        assert client._episodes[eid].pending_steps == 0 and client._pending_steps == 0
        client.close()


def test_a_server_older_than_1_6_is_never_sent_logged_steps() -> None:
    """Refused at the call while the server is 1.5; a batch cut on a 1.6 server and sent again after a
    reconnect to a 1.5 server goes without its logged record (counted), its sampled records kept."""
    with serving(discrete_config(), state(0, constant_model(2, LOGITS)), version="1.5") as server:
        client = TetherClient("127.0.0.1", server.port, seed=3)
        eid = client.start_episode()
        with pytest.raises(NotReadyError, match="1.6"):
            client.log_action(eid, np.zeros(2, np.float32), 1)
        assert client._episodes[eid].pending_steps == 0
        client.close()
    config = discrete_config(steps=4)
    with serving(config, state(0, constant_model(2, LOGITS)), later_version="1.5", drop_first_batch=True) as server:
        client = TetherClient("127.0.0.1", server.port, seed=3, reconnect_timeout_s=10)
        logged, sampled = client.start_episode(), client.start_episode()
        for t in range(3):
            client.log_action(logged, np.zeros(2, np.float32), 2)
            client.get_action(sampled, np.zeros(2, np.float32))
        client.end_episode(logged, np.zeros(2, np.float32))
        client.end_episode(sampled, np.zeros(2, np.float32))
        client.flush()
        client.close()
    first, resent = server.messages("EPISODES_AND_GET_STATE")[:2]
    assert first["batch_seq"] == resent["batch_seq"]  # (the same batch, sent again)
    logged_in_first = sum(len(r["actions"]) for r in first["episodes"] if r.get("logged_runs"))
    assert logged_in_first >= 1 and client.link.logged_steps_dropped >= logged_in_first
    assert resent["episodes"] == [r for r in first["episodes"] if not r.get("logged_runs")]
    assert resent["env_steps"] == first["env_steps"] - logged_in_first


def test_a_logged_step_advances_the_recurrent_state() -> None:
    config = {"type": "SET_CONFIG", "env_steps_per_sample": 100, "force_on_policy": True, "protocol_version": "1.6",
              "observation_space": OBS_SPACE, "action_space": {"type": "Discrete", "n": 2}, **NAMES,
              "recurrent_state": STATES}
    obs = episode_obs(5, seed=2)
    with serving(config, state(0, MODEL)) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1)
        eid = client.start_episode()
        client.log_action(eid, obs[0], 1)
        client.log_action(eid, obs[1], 0)
        client.get_action(eid, obs[2])
        client.log_action(eid, obs[3], 1)
        client.end_episode(eid, obs[4])
        client.flush()
        client.close()
    (record,) = sent_records(server)
    dists, _ = run_model(obs[:4])
    # Each step's dist inputs are the model's for the state advanced over every step before it, logged or not.
    np.testing.assert_allclose(record["action_dist_inputs"], np.stack(dists), atol=1e-5)
    assert record["logged_runs"] == [[0, 2], [3, 1]] and record["state_in"]["state_in_h"] == [0.0] * 3


def ma_config() -> dict[str, Any]:
    box = {"type": "Box", "shape": [2], "low": -1.0, "high": 1.0}
    module = {"observation_space": box, "action_space": {"type": "Discrete", "n": 3}, "onnx_input_names": ["obs"],
              "onnx_output_names": ["action_dist_inputs"], "trainable": True}
    team = {**module, "observation_space": {"type": "Box", "shape": [4], "low": -1.0, "high": 1.0},
            "action_space": {"type": "MultiDiscrete", "nvec": [3, 3]}}
    return {"type": "SET_CONFIG", "env_steps_per_sample": 100, "force_on_policy": True, "protocol_version": "1.6",
            "modules": {"solo": module, "team": team},
            "policy_mapping": [{"pattern": "a_*", "module": "solo"}, {"pattern": "pair", "module": "team"}],
            "groups": {"pair": {"members": ["g_0", "g_1"], "reward": "sum"}}}


def ma_state() -> dict[str, Any]:
    return {"type": "SET_STATE", "models": {
        "solo": {"weights_seq_no": 0, "onnx_file": state(0, constant_model(2, LOGITS))["onnx_file"]},
        "team": {"weights_seq_no": 0, "onnx_file": state(0, constant_model(4, LOGITS * 2))["onnx_file"]}}}


def test_a_frame_mixes_logged_and_policy_agents_and_groups_log_their_joint_action(tmp_path: Path) -> None:
    with serving(ma_config(), ma_state()) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1)
        demo = client.record_demonstrations(tmp_path / "play.jsonl")
        eid = client.start_episode("ma")
        zero = np.zeros(2, np.float32)
        frame = {"a_0": zero, "a_1": zero, "g_0": zero, "g_1": zero}
        with pytest.raises(InvalidInputError, match="member of group 'pair'"):
            client.log_action(eid, frame, {"g_0": 1})
        with pytest.raises(InvalidInputError, match="no observation"):
            client.log_action(eid, frame, {"a_9": 1})
        with pytest.raises(InvalidInputError, match="outside the action space"):
            client.log_action(eid, frame, {"pair": [0, 3]})
        for t in range(3):
            actions = client.log_action(eid, frame, {"a_0": 2, "pair": [1, 0]} if t != 1 else {"a_0": 2})
            assert actions["a_0"] == 2 and (t == 1 or (actions["g_0"], actions["g_1"]) == (1, 0))
            client.log_returns(eid, {"a_0": 1.0, "a_1": 1.0, "g_0": 0.5, "g_1": 0.5})
        client.end_episode(eid, frame)
        client.flush()
        assert demo.episodes_written == 3
        client.close()
    (record,) = sent_records(server)
    entries = record["agents"]
    assert entries["a_0"]["logged_runs"] == [[0, 3]] and entries["a_0"]["actions"] == [2, 2, 2]
    assert "logged_runs" not in entries["a_1"]
    assert entries["pair"]["logged_runs"] == [[0, 1], [2, 1]] and entries["pair"]["actions"][0] == [1, 0]
    # The demonstration file holds every actor's whole episode, logged steps marked, in its module's spaces.
    demos = read_demonstrations(tmp_path / "play.jsonl")
    by_agent = {e.agent_id: e for e in demos.episodes}
    assert sorted(by_agent) == ["a_0", "a_1", "pair"] and sorted(demos.modules) == ["solo", "team"]
    assert by_agent["a_0"].chunk.logged.tolist() == [True] * 3 and by_agent["a_1"].chunk.logged is None
    assert by_agent["pair"].module == "team" and by_agent["pair"].chunk.rewards.tolist() == [1.0] * 3


def test_a_single_agent_client_records_its_episodes_while_it_plays(tmp_path: Path) -> None:
    with serving(discrete_config(), state(0, constant_model(2, LOGITS))) as server:
        client = TetherClient("127.0.0.1", server.port, seed=3)
        before = client.start_episode("before")  # running when recording starts: not whole, never written
        client.get_action(before, np.zeros(2, np.float32))
        client.record_demonstrations(tmp_path / "play.jsonl")
        client.get_action(before, np.zeros(2, np.float32))
        client.end_episode(before, np.zeros(2, np.float32))
        for episode in range(2):
            eid = client.start_episode()
            for t in range(4):
                obs = np.array([episode, t], np.float32) / 10
                if t % 2:
                    client.log_action(eid, obs, 1)
                else:
                    client.get_action(eid, obs)
                client.log_returns(eid, 0.25)
            client.end_episode(eid, np.zeros(2, np.float32), truncated=episode == 1)
        running = client.start_episode()
        client.get_action(running, np.zeros(2, np.float32))
        client.close()  # (the running episode has one step: nothing of it is written)
    lines = [json.loads(line) for line in (tmp_path / "play.jsonl").read_text().splitlines()]
    assert lines[0]["format"] == "tether-demonstrations" and list(lines[0]["modules"]) == ["default_policy"]
    assert [line["logged_runs"] for line in lines[1:]] == [[[1, 1], [3, 1]]] * 2
    assert [(line["is_terminated"], line["is_truncated"]) for line in lines[1:]] == [(True, False), (False, True)]
    assert lines[2]["obs"][1] == pytest.approx([0.1, 0.1]) and lines[1]["rewards"] == [0.25] * 4


def masked_model() -> bytes:
    """A model of a Dict observation (action_mask, position) whose logits ignore both (0, 1, 2)."""
    from onnx import TensorProto, helper

    init = [helper.make_tensor("W1", TensorProto.FLOAT, [3, 3], [0.0] * 9),
            helper.make_tensor("W2", TensorProto.FLOAT, [2, 3], [0.0] * 6),
            helper.make_tensor("B", TensorProto.FLOAT, [3], LOGITS)]
    nodes = [helper.make_node("MatMul", ["action_mask", "W1"], ["a"]),
             helper.make_node("MatMul", ["position", "W2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Add", ["c", "B"], ["action_dist_inputs"])]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("action_mask", TensorProto.FLOAT, ["n", 3]),
                                                helper.make_tensor_value_info("position", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("action_dist_inputs", TensorProto.FLOAT, ["n", 3])],
                              initializer=init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_logged_action_the_mask_forbids_is_refused_and_nothing_recorded() -> None:
    from tether.protocol.onnx_codec import encode_onnx

    space = {"type": "Dict", "spaces": {"action_mask": {"type": "Box", "shape": [3], "low": 0, "high": 1},
                                        "position": {"type": "Box", "shape": [2], "low": -1, "high": 1}}}
    config = {**discrete_config(), "observation_space": space, "action_mask": "action_mask",
              "onnx_input_names": ["action_mask", "position"]}
    with serving(config, {"type": "SET_STATE", "weights_seq_no": 0, "onnx_file": encode_onnx(masked_model())}) as server:
        client = TetherClient("127.0.0.1", server.port, seed=3)
        eid = client.start_episode()
        obs = {"action_mask": np.array([1, 0, 1], np.float32), "position": np.zeros(2, np.float32)}
        with pytest.raises(InvalidInputError) as info:
            client.log_action(eid, obs, 1)
        assert info.value.code == "ACTION_MASKED" and "action_mask" in str(info.value)
        assert client._episodes[eid].pending_steps == 0
        client.log_action(eid, obs, 2)
        client.log_action(eid, obs, 0)
        client.end_episode(eid, obs)
        client.flush()
        client.close()
    (record,) = sent_records(server)
    assert record["logged_runs"] == [[0, 2]] and record["actions"] == [2, 0]


def test_a_demo_writer_on_its_own_refuses_what_the_reader_would(tmp_path: Path) -> None:
    """Without a client nothing checked the steps: the writer does, so one bad step never makes the
    whole file unreadable; numpy scalars (a Gymnasium space's samples) are written as numbers."""
    from tether.protocol.spaces import Discrete, box
    from tether.sdk.demonstrations import DemoWriter

    path = tmp_path / "d.jsonl"
    with DemoWriter(path, {"default_policy": (box(-1, 1, (2,)), Discrete(3))}) as writer:
        writer.step("e", "default_agent", "default_policy", np.zeros(2), np.int64(2))
        for obs, action, code in [([0.0, 0.0], 3, "ACTION_OUT_OF_SPACE"), ([0.0, float("nan")], 1, "NON_FINITE_VALUE"),
                                  ([0.0, 0.0, 0.0], 1, "OBS_SHAPE_MISMATCH")]:
            with pytest.raises(InvalidInputError) as info:
                writer.step("e", "default_agent", "default_policy", obs, action)
            assert info.value.code == code
        with pytest.raises(InvalidInputError):
            writer.end("e", "default_agent", [0.0])  # (refused: the episode goes on)
        writer.end("e", "default_agent", [0.5, 0.5])
    demos = read_demonstrations(path)
    assert len(demos.episodes) == 1 and demos.episodes[0].chunk.actions.tolist() == [2]


def test_a_reconnect_that_adds_a_module_closes_the_demonstration_file(tmp_path: Path) -> None:
    """The file's header names the modules of the connection it was started on: an agent of a module a
    later connection adds cannot be written in it, so the file is closed (its running episodes written
    truncated) rather than the agent's get_action failing."""
    first = {**ma_config(), "env_steps_per_sample": 2}
    later = {**first, "modules": {**first["modules"], "extra": first["modules"]["solo"]},
             "policy_mapping": [*first["policy_mapping"], {"pattern": "x_*", "module": "extra"}]}
    later_state = {"type": "SET_STATE", "models": {**ma_state()["models"], "extra": ma_state()["models"]["solo"]}}

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(first if conn.index == 0 else later, ma_state() if conn.index == 0 else later_state,
                       version="1.6")
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "PING":
                conn.send({"type": "PONG"})
            elif message["type"] in ("EPISODES_AND_GET_STATE", "GET_STATE"):
                if conn.index == 0:
                    return  # (the connection is lost with the first batch)
                conn.send(later_state)

    with ScriptedServer(handler) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1, reconnect_timeout_s=10)
        writer = client.record_demonstrations(tmp_path / "play.jsonl")
        eid = client.start_episode("ma")
        zero = np.zeros(2, np.float32)
        for _ in range(4):
            client.log_action(eid, {"a_0": zero}, {"a_0": 1})
        client.flush()
        client.get_action(eid, {"a_0": zero, "x_0": zero})  # (applies the new connection first)
        assert client._demos is None and writer._file.closed
        client.end_episode(eid)
        client.close()
    demos = read_demonstrations(tmp_path / "play.jsonl")
    assert [e.agent_id for e in demos.episodes] == ["a_0"] and demos.episodes[0].chunk.is_truncated


def test_a_logged_box_action_beyond_float32_is_refused() -> None:
    """A Box action is read as float32 by the server (§10.6 check 13): 1e39 is finite as a double but
    would arrive as an infinity and cost the whole batch, so it is refused at the call."""
    from tether.protocol.logged_actions import checked_logged_action
    from tether.protocol.spaces import Discrete, box

    with pytest.raises(InvalidInputError) as info:
        checked_logged_action(box(-1, 1, (2,)), [1e39, 0.0])
    assert info.value.code == "NON_FINITE_VALUE"
    assert checked_logged_action(box(-1, 1, (2,)), [5.0, -3e38]).tolist() == pytest.approx([5.0, -3e38])
    with pytest.raises(InvalidInputError) as info:
        checked_logged_action(Discrete(3), 1e39)
    assert info.value.code == "ACTION_OUT_OF_SPACE"  # (as the server answers: a Discrete action is read as a double)


def test_a_reward_beyond_float32_is_refused_by_the_writer_and_the_file_stays_readable(tmp_path: Path) -> None:
    from tether.protocol.spaces import Discrete, box
    from tether.sdk.demonstrations import DemoWriter

    with DemoWriter(tmp_path / "d.jsonl", {"default_policy": (box(-1, 1, (2,)), Discrete(2))}) as writer:
        writer.step("e", "default_agent", "default_policy", [0.0, 0.0], 1)
        writer.add_reward("e", "default_agent", 3e38)
        with pytest.raises(InvalidInputError, match="float32"):
            writer.add_reward("e", "default_agent", 1e38)
        writer.end("e", "default_agent", [0.0, 0.0])
    (episode,) = read_demonstrations(tmp_path / "d.jsonl").episodes
    assert episode.chunk.rewards.tolist() == [pytest.approx(3e38, rel=1e-6)]


REWARD_CASES = json.loads((Path(__file__).resolve().parents[1] / "conformance" / "rewards.json").read_text())["cases"]


@pytest.mark.parametrize("case", REWARD_CASES, ids=lambda c: c["name"])
def test_reward_vectors_through_a_multi_agent_client(case: dict[str, Any]) -> None:
    """rewards.json (§10.5) played by a MultiAgentClient: one agent acts ("act") and is given rewards;
    the call that would take its step beyond float32 is refused and adds nothing, and the record sent
    carries each step's sum."""
    with serving(ma_config(), ma_state()) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1)
        eid = client.start_episode("ma")
        obs = {"a_0": np.array([0.5, -0.5], np.float32)}
        refused = []
        for index, call in enumerate(case["calls"]):
            if call == "act":
                client.get_action(eid, obs)
                continue
            try:
                client.log_returns(eid, {"a_0": call})
            except InvalidInputError as exc:
                assert exc.code == "NON_FINITE_VALUE" and "float32" in str(exc)
                refused.append(index)
        client.end_episode(eid, obs)
        client.flush()
        client.close()
    assert refused == case["refused"]
    (record,) = sent_records(server)
    rewards = record["agents"]["a_0"]["rewards"]
    assert len(rewards) == len(case["step_rewards"])
    for got, want in zip(rewards, case["step_rewards"]):
        assert got == pytest.approx(want, rel=1e-9), (rewards, case["step_rewards"])
