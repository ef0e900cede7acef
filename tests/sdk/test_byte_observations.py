"""Byte-box observations (protocol 1.4, §8.1, §10.9) in the Python SDK: images go to the model as
bytes in their own shape, and to a 1.4 server as one uint8 tensor per record or agent entry, its
bytes in the body's binary attachment (§4.3; as JSON numbers to an older server); a value that is
not an integer 0-255 is refused locally, by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tether.protocol.errors import ErrorCode, InvalidInputError
from tether.protocol.spaces import space_from_json
from tether.protocol.tensors import decode_tensor
from tether.sdk import MultiAgentClient, TetherClient
from tether.server.learner import PPOHyperparams, PPOLearner

from .scripted_server import ScriptedConnection, ScriptedServer, state

IMAGE = {"type": "Box", "shape": [2, 3, 1], "dtype": "uint8", "low": 0, "high": 255}
TWO = {"type": "Discrete", "n": 2}


def image_model() -> bytes:
    """A real exported model of the byte box: input uint8 [batch, 2, 3, 1]."""
    return PPOLearner(space_from_json(IMAGE), space_from_json(TWO), PPOHyperparams(), seed=0,
                      onnx_input_name="obs").export_onnx()


def images(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (2, 3, 1)).astype(np.uint8) for _ in range(n)]


def single_config() -> dict[str, Any]:
    return {"type": "SET_CONFIG", "env_steps_per_sample": 5, "force_on_policy": True, "observation_space": IMAGE,
            "action_space": TWO, "onnx_input_names": ["obs"], "onnx_output_names": ["action_dist_inputs"]}


def play_single(version: str) -> tuple[list[np.ndarray], list[dict]]:
    model = image_model()

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(single_config(), state(0, model), version=version)
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                conn.send(state(0, None))

    seen = images(13)
    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1, when_queue_full="wait")
        assert client.policy is not None and client.policy.feeds.single.dtype == np.uint8
        eid = client.start_episode()
        for obs in seen[:-1]:
            assert client.get_action(eid, obs) in (0, 1)
            client.log_returns(eid, 1.0)
        client.end_episode(eid, seen[-1])
        client.flush()
        stats = (client.env_steps_sent, client.batches_dropped, getattr(client, "_pending_steps", None),
                 client.link.training_done, client._held_steps, client.link.steps_per_batch)
        client.close()
        records = [r for m in server.messages("EPISODES_AND_GET_STATE") for r in m["episodes"]]
        assert not server.errors, (stats, server.errors)
        assert sum(len(r["actions"]) for r in records) == len(seen) - 1, (stats, server.messages())
    return seen, records


def observations(records: list[dict]) -> np.ndarray:
    """Every record's observations, the overlap of consecutive chunks dropped."""
    out = []
    for i, record in enumerate(records):
        obs = decode_tensor(record["obs"]) if isinstance(record["obs"], dict) else np.asarray(record["obs"])
        out.extend(obs if i == 0 else obs[1:])
    return np.asarray(out)


def test_a_1_4_server_gets_uint8_tensors_of_the_images() -> None:
    seen, records = play_single("1.4")
    assert records and all(isinstance(r["obs"], dict) and "offset" in r["obs"] for r in records)
    first = decode_tensor(records[0]["obs"])
    assert first.dtype == np.uint8 and first.shape[1:] == (2, 3, 1)
    np.testing.assert_array_equal(observations(records), np.asarray(seen))


def test_an_older_server_gets_json_integers() -> None:
    seen, records = play_single("1.3")
    assert records and all(isinstance(r["obs"], list) for r in records)
    np.testing.assert_array_equal(observations(records), np.asarray(seen, np.float64))


@pytest.mark.parametrize("bad", [0.5, 256, -1])
def test_a_value_that_is_no_byte_is_refused_locally(bad: float) -> None:
    model = image_model()

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(single_config(), state(0, model), version="1.4")
        conn.read_until_closed()

    with ScriptedServer(handler) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1, when_queue_full="wait")
        eid = client.start_episode()
        obs = np.zeros((2, 3, 1))
        obs[1, 2, 0] = bad
        with pytest.raises(InvalidInputError) as caught:
            client.get_action(eid, obs)
        assert caught.value.code == ErrorCode.OBS_DTYPE_MISMATCH.value and "observation[5]" in str(caught.value)
        assert client.get_action(eid, np.zeros((2, 3, 1), np.uint8)) in (0, 1)  # nothing of the bad one was kept
        client.close()


def test_a_multi_agent_module_of_images_sends_a_tensor_per_entry() -> None:
    model = image_model()
    config = {"type": "SET_CONFIG", "env_steps_per_sample": 4, "force_on_policy": True, "protocol_version": "1.4",
              "modules": {"eyes": {"observation_space": IMAGE, "action_space": TWO, "onnx_input_names": ["obs"],
                                   "onnx_output_names": ["action_dist_inputs"]},
                          "plain": {"observation_space": {"type": "Box", "shape": [2], "low": -1, "high": 1},
                                    "action_space": TWO, "onnx_input_names": ["obs"],
                                    "onnx_output_names": ["action_dist_inputs"]}},
              "policy_mapping": [{"pattern": "cam_*", "module": "eyes"}, {"pattern": "*", "module": "plain"}]}
    plain = PPOLearner(space_from_json(config["modules"]["plain"]["observation_space"]), space_from_json(TWO),
                       PPOHyperparams(), seed=0, onnx_input_name="obs").export_onnx()
    from tether.protocol.onnx_codec import encode_onnx

    models = {"type": "SET_STATE", "weights_seq_nos": {"eyes": 0, "plain": 0},
              "models": {"eyes": {"weights_seq_no": 0, "onnx_file": encode_onnx(model)},
                         "plain": {"weights_seq_no": 0, "onnx_file": encode_onnx(plain)}}}

    def handler(conn: ScriptedConnection) -> None:
        conn.handshake(config, models, version="1.4")
        while (message := conn.receive(timeout=None)) is not None:
            if message["type"] == "EPISODES_AND_GET_STATE":
                conn.send({"type": "SET_STATE", "weights_seq_nos": {"eyes": 0, "plain": 0}, "models": {}})

    seen = images(7)
    with ScriptedServer(handler) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1, when_queue_full="wait")
        eid = client.start_episode()
        for obs in seen[:-1]:
            client.get_action(eid, {"cam_1": obs, "walker": np.zeros(2, np.float32)})
            client.log_returns(eid, {"cam_1": 1.0, "walker": 0.0})
        # A value that is no byte is refused in a final observation and in compute_actions too, as by
        # get_action (and by the C++ and C# clients), before anything of the call is kept.
        not_a_byte = np.asarray(seen[-1], np.float64)
        not_a_byte.flat[3] = 0.5
        for call in (lambda: client.end_agents(eid, {"cam_1": not_a_byte}),
                     lambda: client.end_episode(eid, {"cam_1": not_a_byte, "walker": np.zeros(2, np.float32)}),
                     lambda: client.compute_actions({"cam_1": not_a_byte})):
            with pytest.raises(InvalidInputError) as caught:
                call()
            assert caught.value.code == ErrorCode.OBS_DTYPE_MISMATCH.value and "'cam_1'" in str(caught.value)
        assert client.compute_actions({"cam_1": seen[0]})["cam_1"] in (0, 1)
        client.end_episode(eid, {"cam_1": seen[-1], "walker": np.zeros(2, np.float32)})
        client.flush()
        client.close()
        entries = [r["agents"] for m in server.messages("EPISODES_AND_GET_STATE") for r in m["episodes"]]
    cams = [e["cam_1"] for e in entries if "cam_1" in e]
    assert cams and all(isinstance(c["obs"], dict) and c["obs"]["dtype"] == "uint8" for c in cams)
    assert all(isinstance(e["walker"]["obs"], list) for e in entries if "walker" in e)  # a float module: numbers
    np.testing.assert_array_equal(observations(cams), np.asarray(seen))
