"""The connection layer's pieces without a network: frame limits before and
after authentication, token handling, options, answer reuse, keepalive."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tether.sdk.protocol import Refusal, Request, ServerConnection, encode_frame
from tether.sdk.protocol.errors import ErrorCode, FramingError
from tether.server.cli import build_parser
from tether.server.config import ServerConfig, config_from_args
from tether.server.module_setup import build_layout
from tether.server.tcp_server import TetherServer, enable_keepalive
from tether.server.trainer import Trainer


def parse(argv: list[str]) -> ServerConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_small_frame_limit_until_authenticated() -> None:
    server = ServerConnection(auth_token="tok", pre_auth_max_frame_bytes=100)
    big = encode_frame({"type": "GET_CONFIG", "pad": "x" * 200})
    with pytest.raises(FramingError) as info:
        server.receive_data(big)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    # PING and a large request in one write: the PING is applied before the next header is read.
    server = ServerConnection(auth_token="tok", pre_auth_max_frame_bytes=100)
    events = server.receive_data(encode_frame({"type": "PING", "auth_token": "tok"}) + big)
    assert [type(e) for e in events] == [Request, Request]


@pytest.mark.parametrize("token", ["nope", "\ud800", 7])
def test_a_wrong_token_is_refused_and_closes(token) -> None:
    server = ServerConnection(auth_token="s3cret")
    (event,) = server.receive_data(_frame(token))
    assert isinstance(event, Refusal) and event.error.code is ErrorCode.AUTH_FAILED and event.closes_connection
    assert "s3cret" not in event.error.message


def _frame(token) -> bytes:
    import json

    body = json.dumps({"type": "PING", "auth_token": token}).encode()  # escapes a lone surrogate as \ud800
    return b"%08d" % len(body) + body


def test_missing_token_keeps_the_connection() -> None:
    (event,) = ServerConnection(auth_token="tok").receive_data(encode_frame({"type": "PING"}))
    assert isinstance(event, Refusal) and not event.closes_connection


def test_token_from_environment_or_file_and_never_in_to_dict(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TETHER_AUTH_TOKEN", "from-env")
    assert parse([]).auth_token == "from-env"
    assert parse(["--auth-token", "flag"]).auth_token == "flag"
    path = tmp_path / "token"
    path.write_text("  from-file \n")
    config = parse(["--auth-token-file", str(path)])
    assert config.auth_token == "from-file"
    assert "auth_token" not in config.to_dict() and "from-file" not in repr(config.to_dict())
    path.write_text("\n")
    with pytest.raises(ValueError):
        parse(["--auth-token-file", str(path)])


def test_liveness_options() -> None:
    config = parse(["--client-timeout", "5", "--max-connections", "7", "--handshake-timeout-s", "2",
                    "--pre-auth-max-frame-bytes", "1024", "--max-partial-frame-bytes", "4096"])
    assert (config.client_timeout_s, config.max_connections, config.handshake_timeout_s) == (5.0, 7, 2.0)
    assert (config.pre_auth_max_frame_bytes, config.max_partial_frame_bytes) == (1024, 4096)
    defaults = ServerConfig()
    assert (defaults.client_timeout_s, defaults.max_connections, defaults.handshake_timeout_s) == (60.0, 256, 10.0)
    assert defaults.pre_auth_max_frame_bytes == 64 * 1024


def test_state_frames_are_encoded_once_per_version(tmp_path) -> None:
    async def main() -> None:
        config = ServerConfig(logdir=str(tmp_path), tensorboard=False, client_timeout_s=8)
        trainer = Trainer(config, build_layout(config, None))
        server = TetherServer(trainer)
        from tether.server.tcp_server import ClientSession

        session, conn = ClientSession("peer"), ServerConnection()
        first = server._send_state(session, conn, None)
        assert server._send_state(ClientSession("other"), conn, None) is first  # the same bytes object
        trainer.modules[trainer.default_module].publish(trainer.modules[trainer.default_module].learner.export_onnx())
        again = server._send_state(session, conn, None)
        assert again is not first and b'"weights_seq_no":1' in again
        assert b'"client_timeout_s":8' in server._config_frame and b'"heartbeat_interval_s":2.0' in server._config_frame
        await trainer.close(checkpoint=False)

    asyncio.run(main())


def test_keepalive_is_enabled() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname()) as sock:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
            enable_keepalive(sock)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
