"""A configured auth token is enforced; the SDK raises a typed error with the server's message."""

from __future__ import annotations

import pytest

from tether.sdk import AuthenticationError, TetherClient

from .server_process import RawClient, ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("auth"), "--auth-token", "s3cret") as proc:
        yield proc


@pytest.mark.parametrize("token", [None, "wrong"], ids=["missing", "wrong"])
def test_sdk_raises_authentication_error(server, token) -> None:
    with pytest.raises(AuthenticationError) as info:
        TetherClient("127.0.0.1", server.port, auth_token=token, reconnect_timeout_s=2)
    assert info.value.code == "AUTH_FAILED"
    assert ("missing" if token is None else "wrong") in info.value.message


def test_requests_before_auth_are_refused_and_right_token_works(server) -> None:
    raw = RawClient(server.port)
    reply = raw.request({"type": "GET_STATE"})
    assert reply["code"] == "AUTH_FAILED" and "onnx_file" not in reply
    client = TetherClient("127.0.0.1", server.port, auth_token="s3cret")
    assert client.weights_seq_no == 0 and client.policy is not None
    client.close()
    raw.close()
