"""Client and server connections joined by an in-memory 'network' (no sockets)."""

from __future__ import annotations

import pytest

from tether.protocol import (
    ClientConnection,
    ErrorCode,
    LocalProtocolError,
    MessageType,
    Refusal,
    Request,
    ServerConnection,
    encode_frame,
    server_error_from_message,
)
from tether.protocol.errors import AuthenticationError, RemoteProtocolError, VersionMismatchError


def exchange(client: ClientConnection, server: ServerConnection, message: dict) -> list:
    """Send one request through both sides; answer it the way a server would."""
    events = server.receive_data(client.send(message))
    wire = b""
    for event in events:
        if isinstance(event, Refusal):
            wire += encode_frame(event.to_message())
        elif event.kind is MessageType.PING:
            wire += encode_frame(server.pong())
        elif event.kind is MessageType.GET_CONFIG:
            wire += encode_frame({"type": "SET_CONFIG", "env_steps_per_sample": 10, "force_on_policy": True})
        elif event.kind in (MessageType.GET_STATE, MessageType.EPISODES_AND_GET_STATE):
            wire += encode_frame({"type": "SET_STATE", "weights_seq_no": 0, "onnx_file": ""})
    return client.receive_data(wire)


def test_handshake_pairs_responses_with_requests() -> None:
    client, server = ClientConnection(), ServerConnection()
    ((req, pong),) = exchange(client, server, {"type": "PING", "protocol_version": "1.2", "client_name": "unit"})
    assert req is MessageType.PING and pong["type"] == "PONG" and pong["protocol_version"] == "1.9"
    assert server.client_name == "unit"
    ((req, cfg),) = exchange(client, server, {"type": "GET_CONFIG"})
    assert req is MessageType.GET_CONFIG and cfg["env_steps_per_sample"] == 10
    assert not client.awaiting_response


def test_episodes_has_no_response_but_errors_reach_the_client() -> None:
    client, server = ClientConnection(), ServerConnection()
    (event,) = server.receive_data(client.send({"type": "EPISODES", "episodes": []}))
    assert isinstance(event, Request) and not client.awaiting_response
    err = {"type": "ERROR", "code": "INVALID_FIELD", "message": "bad", "request": "EPISODES"}
    ((req, msg),) = client.receive_data(encode_frame(err))
    assert req is None and msg["code"] == "INVALID_FIELD"


def test_auth_failure_is_typed_and_connection_survives() -> None:
    client, server = ClientConnection(), ServerConnection(auth_token="tok")
    ((_, msg),) = exchange(client, server, {"type": "PING", "auth_token": "nope"})
    error = server_error_from_message(msg)
    assert isinstance(error, AuthenticationError) and error.request == "PING" and "wrong auth_token" in error.message
    ((_, pong),) = exchange(client, server, {"type": "PING", "auth_token": "tok"})
    assert pong["type"] == "PONG"


def test_major_version_mismatch_is_refused_with_both_versions_named() -> None:
    client, server = ClientConnection(), ServerConnection()
    ((_, msg),) = exchange(client, server, {"type": "PING", "protocol_version": "2.3"})
    error = server_error_from_message(msg)
    assert isinstance(error, VersionMismatchError)
    assert "2.3" in error.message and "1.9" in error.message


def test_client_refuses_to_send_a_response_type() -> None:
    with pytest.raises(LocalProtocolError):
        ClientConnection().send({"type": "SET_STATE"})
    with pytest.raises(LocalProtocolError):
        ClientConnection().send({"type": "NOPE"})


def test_client_rejects_unsolicited_and_mismatched_responses() -> None:
    client = ClientConnection()
    with pytest.raises(RemoteProtocolError):
        client.receive_data(encode_frame({"type": "PONG"}))
    client = ClientConnection()
    client.send({"type": "GET_CONFIG"})
    with pytest.raises(RemoteProtocolError):
        client.receive_data(encode_frame({"type": "PONG"}))


def test_several_frames_in_one_read_and_split_frames() -> None:
    server = ServerConnection()
    data = encode_frame({"type": "PING"}) + encode_frame({"type": "GET_CONFIG"})
    events = server.receive_data(data[:5]) + server.receive_data(data[5:30]) + server.receive_data(data[30:])
    assert [e.kind for e in events] == [MessageType.PING, MessageType.GET_CONFIG]


def test_framing_error_frame_names_the_code() -> None:
    server = ServerConnection(max_frame_bytes=10)
    with pytest.raises(Exception) as info:
        server.receive_data(b"00000011{}")
    frame = ServerConnection.framing_error_frame(info.value)
    assert b'"FRAME_TOO_LARGE"' in frame and frame[:8].isdigit()
    assert ErrorCode.FRAME_TOO_LARGE.closes_connection and not ErrorCode.INVALID_JSON.closes_connection


def test_a_client_name_with_a_lone_surrogate_is_recorded_escaped() -> None:
    server = ServerConnection()
    body = b'{"type": "PING", "client_name": "engine-\\ud800"}'  # JSON may escape half a surrogate pair
    (event,) = server.receive_data(b"%08d" % len(body) + body)
    assert event.kind is MessageType.PING
    assert server.client_name == "engine-\\ud800"
    server.client_name.encode("utf-8")  # writable to any log
