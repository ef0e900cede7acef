"""A model is sent once per version and connection (§7.5): asking again for a version
the connection already got costs a few bytes, for a client that announced 1.1+."""

from __future__ import annotations

import json

from tether.protocol import encode_frame

from .server_process import RawClient, ServerProcess

MODULES = {"a": {"observation_space": {"type": "Box", "shape": [4], "low": -1, "high": 1},
                 "action_space": {"type": "Discrete", "n": 2}},
           "b": {"observation_space": {"type": "Box", "shape": [3], "low": -1, "high": 1},
                 "action_space": {"type": "Discrete", "n": 3}}}


def size(reply: dict) -> int:
    return len(encode_frame(reply))


def test_repeated_get_state_of_a_held_version_costs_a_few_bytes(tmp_path) -> None:
    with ServerProcess(tmp_path) as server:
        raw = RawClient(server.port)
        assert raw.request({"type": "PING", "protocol_version": "1.3"})["type"] == "PONG"
        request = {"type": "GET_STATE"}
        first = raw.request(request)
        assert "onnx_file" in first
        for _ in range(3):
            again = raw.request(request)
            assert "onnx_file" not in again and again["weights_seq_no"] == first["weights_seq_no"]
            assert size(again) < 4 * len(encode_frame(request)), again  # was 838 times the request
        assert "onnx_file" in raw.request({"type": "GET_STATE", "weights_seq_no": 99})  # claims another version
        raw.close()
        fresh = RawClient(server.port)  # a new connection holds nothing yet
        assert fresh.request({"type": "PING", "protocol_version": "1.3"})["type"] == "PONG"
        assert "onnx_file" in fresh.request(request)
        fresh.close()
        plain = RawClient(server.port)  # a plain v1 peer (no protocol_version) always gets the model
        assert all("onnx_file" in plain.request(request) for _ in range(2))
        plain.close()


def test_per_module_form_sends_each_model_once_per_connection(tmp_path) -> None:
    with ServerProcess(tmp_path, "--modules", json.dumps(MODULES),
                       "--policy-mapping", json.dumps([{"pattern": "*", "module": "a"}])) as server:
        raw = RawClient(server.port)
        assert raw.request({"type": "PING", "protocol_version": "1.3"})["type"] == "PONG"
        assert set(raw.request({"type": "GET_STATE", "weights_seq_nos": {}})["models"]) == {"a", "b"}
        assert raw.request({"type": "GET_STATE", "weights_seq_nos": {}})["models"] == {}
        assert set(raw.request({"type": "GET_STATE", "weights_seq_nos": {"b": 5}})["models"]) == {"b"}
        raw.close()
