"""The connection layer's pieces without a network: frame limits before and
after authentication, token handling, options, answer reuse, keepalive."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from tether.protocol import Refusal, Request, ServerConnection, encode_frame
from tether.protocol.errors import ErrorCode, FramingError
from tether.protocol.onnx_codec import encode_onnx
from tether.server.cli import build_parser
from tether.server.config import ServerConfig, config_from_args
from tether.server.module_setup import build_layout
from tether.server.transport.auth_throttle import AuthThrottle, peer_address
from tether.server.transport.connection_limits import handshake_share
from tether.server.transport.sockets import enable_keepalive
from tether.server.transport.tcp import TetherServer
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
        from tether.server.client_session import ClientSession

        session, conn = ClientSession("peer"), ServerConnection()
        first = server.service._send_state(session, conn, None)
        assert server.service._send_state(ClientSession("other"), conn, None) is first  # the same bytes object
        trainer.modules[trainer.default_module].publish(encode_onnx(trainer.modules[trainer.default_module].learner.export_onnx()))
        again = server.service._send_state(session, conn, None)
        assert again is not first and b'"weights_seq_no":1' in again
        config_frame = server.service._config_frame
        assert b'"client_timeout_s":8' in config_frame and b'"heartbeat_interval_s":2.0' in config_frame
        await trainer.close(checkpoint=False)

    asyncio.run(main())


def test_keepalive_is_enabled() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname()) as sock:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
            enable_keepalive(sock)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1


def test_handshake_and_throttle_options() -> None:
    config = parse(["--max-handshaking-connections", "3", "--auth-max-failures", "2", "--auth-backoff-max-s", "9"])
    assert (config.max_handshaking_connections, config.auth_max_failures, config.auth_backoff_max_s) == (3, 2, 9.0)
    defaults = ServerConfig()
    assert (defaults.max_handshaking_connections, defaults.auth_max_failures, defaults.auth_backoff_max_s) == (0, 5, 60.0)
    assert [handshake_share(n) for n in (1, 3, 16, 256, 1000)] == [1, 3, 8, 32, 125]
    assert handshake_share(256, 4) == 4 and handshake_share(2, 4) == 2
    for bad in (["--auth-max-failures", "0"], ["--auth-backoff-max-s", "0"], ["--max-handshaking-connections", "-1"]):
        with pytest.raises(ValueError):
            parse(bad)


def test_wrong_tokens_are_counted_per_address_with_a_growing_refusal() -> None:
    throttle = AuthThrottle(max_failures=3, max_backoff_s=4.0, window_s=60.0)
    now = 1000.0
    assert [throttle.failed("10.0.0.1", now) for _ in range(3)] == [0.0, 0.0, 1.0]
    assert throttle.refused_for("10.0.0.1", now + 0.5) == pytest.approx(0.5)
    assert throttle.refused_for("10.0.0.2", now) == 0.0  # another address: not refused
    assert throttle.refused_for(None, now) == 0.0
    # After the refusal, every further wrong token starts one twice as long, up to the cap.
    periods = []
    for _ in range(4):
        now += 10.0
        assert throttle.refused_for("10.0.0.1", now) == 0.0
        periods.append(throttle.failed("10.0.0.1", now))
    assert periods == [2.0, 4.0, 4.0, 4.0]
    # Quiet for the window after the last refusal: forgiven, three wrong tokens again before one.
    now += 4.0 + 60.0
    assert [throttle.failed("10.0.0.1", now) for _ in range(3)] == [0.0, 0.0, 1.0]
    # Wrong tokens spread wider than the window never add up to a refusal.
    for k in range(10):
        assert throttle.failed("10.0.0.3", 5000.0 + 31.0 * k) == 0.0


def test_the_throttle_remembers_a_bounded_number_of_addresses() -> None:
    throttle = AuthThrottle(max_failures=1, max_backoff_s=60.0, max_addresses=100)
    for k in range(1000):
        throttle.failed(f"10.0.{k // 256}.{k % 256}", 1.0)
    assert len(throttle) == 100
    assert throttle.refused_for("10.0.3.231", 1.5) > 0  # the most recent ones are kept
    assert throttle.refused_for("10.0.0.0", 1.5) == 0.0


def test_peer_addresses() -> None:
    assert peer_address(("192.0.2.7", 5555)) == "192.0.2.7"
    assert peer_address(("::ffff:192.0.2.7", 5555, 0, 0)) == "192.0.2.7"
    # One IPv6 host holds a whole /64: its addresses share one record.
    assert peer_address(("2001:db8:1:2:aaaa::1", 1, 0, 0)) == peer_address(("2001:db8:1:2:bbbb::9", 1, 0, 0))
    assert peer_address(("2001:db8:1:2::1", 1, 0, 0)) != peer_address(("2001:db8:1:3::1", 1, 0, 0))
    assert peer_address(None) is None and peer_address("/tmp/socket") is None


def test_handshaking_connections_make_room_and_established_ones_stay(tmp_path) -> None:
    """A newcomer closes the oldest handshaking connection not being answered (HANDSHAKE_TIMEOUT),
    never an established one; with every slot established it is refused (TOO_MANY_CONNECTIONS);
    an address refused for wrong tokens is refused before it takes a slot."""

    async def main() -> None:
        config = ServerConfig(logdir=str(tmp_path), tensorboard=False, max_connections=5,
                              max_handshaking_connections=2, auth_token="tok", auth_max_failures=1)
        trainer = Trainer(config, build_layout(config, None))
        limits = TetherServer(trainer).connections
        closed: list[tuple[int, bytes]] = []

        def opened(name: int, ip: str = "10.0.0.1"):
            return limits.open_connection(lambda frame, current: closed.append((name, frame)), (ip, 40000 + name))

        a, b = opened(1), opened(2)
        c = opened(3)  # the share (2) is full: the oldest, a, is closed
        assert [name for name, _ in closed] == [1] and a.evicted and b"HANDSHAKE_TIMEOUT" in closed[0][1]
        assert a not in limits and len(limits) == 2
        limits.establish(b)
        limits.establish(c)
        d = opened(4)
        d.answering = True  # its first request is being answered: not closed for a newcomer
        e = opened(5)
        f = opened(6)  # share full again (d, e): e is closed, d is being answered
        assert [name for name, _ in closed] == [1, 5] and not d.evicted
        limits.establish(d)
        limits.establish(f)
        g = opened(7)  # 5 of 5 open, none handshaking but g
        assert g.refusal is None and len(limits) == 5
        limits.establish(g)
        h = opened(8)
        assert h.refusal is not None and b"TOO_MANY_CONNECTIONS" in h.refusal and h not in limits
        assert not any(conn.evicted for conn in (b, c, d, f, g)) and [name for name, _ in closed] == [1, 5]
        limits.close_connection(g)
        # A wrong token refuses its address (auth_max_failures 1) before it takes a slot; others still get in.
        assert limits.auth_throttle is not None
        limits.auth_throttle.failed("10.0.0.9", time.monotonic())
        refused = opened(9, "10.0.0.9")
        assert refused.refusal is not None and b"AUTH_THROTTLED" in refused.refusal and refused not in limits
        assert opened(10, "10.0.0.8").refusal is None
        await trainer.close(checkpoint=False)

    asyncio.run(main())
