"""What one peer can cost a real server is bounded, and refusals are clear.

Each test runs a real ``tether serve`` subprocess and real sockets, and
measures what the issue measured: the server's RSS and another client's PING
round trip while a peer misbehaves. Numbers are scaled down to keep the tests
fast; the limits they check are the same.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .server_process import RawClient, ServerProcess, wait_until

PING = {"type": "PING"}


def rss_mb(server: ServerProcess) -> float:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def ping_ms(port: int, **fields) -> float:
    """One PING round trip on a fresh connection, in ms."""
    client = RawClient(port, timeout=10)
    start = time.perf_counter()
    reply = client.request({"type": "PING", **fields})
    elapsed = (time.perf_counter() - start) * 1e3
    client.close()
    assert reply["type"] == "PONG", reply
    return elapsed


def refusal(client: RawClient) -> dict:
    """The one unsolicited ERROR a connection-level refusal sends; the connection must then close."""
    reply = client.receive()
    assert reply["type"] == "ERROR" and "request" not in reply, reply
    assert client.is_closed_by_server(), "the server must close after a connection-level refusal"
    return reply


def no_tracebacks(server: ServerProcess) -> None:
    text = "\n".join(server.lines)
    assert "Traceback" not in text and "Unhandled exception" not in text and "accept" not in text, text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_pipelined_get_state_is_answered_one_at_a_time(tmp_path) -> None:
    """37,449 pipelined GET_STATE requests (1 MiB) used to grow the server by ~1.4 GiB:
    every answer was encoded and queued before any was sent."""
    with ServerProcess(tmp_path) as server:
        before = rss_mb(server)
        flood = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        request = b"00000020" + b'{"type":"GET_STATE"}'
        flood.sendall(request * ((1 << 20) // len(request)))  # and never read the answers
        time.sleep(1.5)
        latency = ping_ms(server.port)
        grown = rss_mb(server) - before
        flood.close()
        assert grown < 50, f"server RSS grew by {grown:.0f} MiB while a peer pipelined GET_STATE"
        assert latency < 2000, f"another client's PING took {latency:.0f} ms"
        no_tracebacks(server)


def test_handshake_limits_with_a_token(tmp_path, monkeypatch) -> None:
    """Before authenticating: small frames only, a deadline, one guess per connection;
    the token comes from the environment and is stored nowhere."""
    token = "env-s3cret-token"
    monkeypatch.setenv("TETHER_AUTH_TOKEN", token)
    with ServerProcess(tmp_path, "--handshake-timeout-s", "0.5", "--checkpoint-every", "1") as server:
        assert "env-s3cret" not in " ".join(server.cmd)
        # No token: refused (the environment variable was read).
        raw = RawClient(server.port)
        assert raw.request({"type": "GET_CONFIG"})["code"] == "AUTH_FAILED"
        raw.close()
        # A large frame before authentication: FRAME_TOO_LARGE at once, nothing buffered.
        raw = RawClient(server.port)
        raw.send_bytes(b"%08d" % (1 << 20) + b"[" * 1000)
        assert refusal(raw)["code"] == "FRAME_TOO_LARGE"
        # Silence: HANDSHAKE_TIMEOUT after the deadline.
        raw = RawClient(server.port)
        start = time.monotonic()
        reply = refusal(raw)
        assert reply["code"] == "HANDSHAKE_TIMEOUT" and 0.4 < time.monotonic() - start < 5
        # A wrong token, and a lone surrogate (not encodable as UTF-8): AUTH_FAILED, then closed.
        for body in (b'{"type": "PING", "auth_token": "guess"}', b'{"type": "PING", "auth_token": "\\ud800"}'):
            raw = RawClient(server.port)
            raw.send_bytes(b"%08d" % len(body) + body)
            reply = raw.receive()
            assert reply["type"] == "ERROR" and reply["code"] == "AUTH_FAILED", reply
            assert raw.is_closed_by_server(), "a failed token must close the connection"
        # The right token: large frames are allowed afterwards.
        raw = RawClient(server.port)
        assert raw.request({"type": "PING", "auth_token": token})["type"] == "PONG"
        big = b'{"type": "EPISODES", "episodes": "' + b"x" * (1 << 20) + b'"}'
        raw.send_bytes(b"%08d" % len(big) + big)
        assert raw.receive()["code"] == "INVALID_FIELD"
        assert raw.request(PING)["type"] == "PONG"
        raw.close()
        no_tracebacks(server)
        summary = server.stop()
    stored = (server.logdir / "checkpoint.pt").read_bytes() + json.dumps(summary).encode()
    assert token.encode() not in stored, "the auth token must not be written to the checkpoint or summary"


def test_token_file_and_flag_alternatives(tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("file-token\n")
    with ServerProcess(tmp_path, "--auth-token-file", str(token_file)) as server:
        raw = RawClient(server.port)
        assert raw.request({"type": "PING", "auth_token": "file-token"})["type"] == "PONG"
        raw.close()


def test_client_timeout_and_heartbeats(tmp_path) -> None:
    with ServerProcess(tmp_path, "--client-timeout", "0.6") as server:
        raw = RawClient(server.port)
        assert raw.request({"type": "PING", "protocol_version": "1.3"})["type"] == "PONG"
        config = raw.request({"type": "GET_CONFIG"})
        assert config["client_timeout_s"] == 0.6 and config["heartbeat_interval_s"] == pytest.approx(0.15)
        # A client older than 1.3 sends no heartbeats: it gets ten times longer.
        legacy = RawClient(server.port)
        assert legacy.request({"type": "PING", "protocol_version": "1.2"})["type"] == "PONG"
        silent_since = time.monotonic()
        # The accepted socket has TCP keepalive on (ss shows its keepalive timer).
        if shutil.which("ss"):
            listing = subprocess.run(["ss", "-tnoH", "state", "established", f"sport = :{server.port}"],
                                     capture_output=True, text=True).stdout
            assert "keepalive" in listing, listing
        # A client that PINGs more often than the timeout is kept.
        beating = RawClient(server.port)
        for _ in range(8):
            time.sleep(0.15)
            assert beating.request(PING)["type"] == "PONG"
        beating.close()
        # The silent one was dropped with CLIENT_TIMEOUT.
        assert refusal(raw)["code"] == "CLIENT_TIMEOUT"
        assert not legacy.is_closed_by_server(timeout=max(0.1, 3.0 - (time.monotonic() - silent_since)))
        legacy.sock.settimeout(10)
        assert refusal(legacy)["code"] == "CLIENT_TIMEOUT"
        assert time.monotonic() - silent_since > 5.0
        no_tracebacks(server)


def _limited_fds_cmd(server: ServerProcess, nofile: int) -> None:
    """Run the server with a hard descriptor limit of ``nofile``."""
    prefix = (f"import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
              f"sys.argv = ['tether'] + sys.argv[1:]; runpy.run_module('tether.server.cli', run_name='__main__')")
    assert server.cmd[1:3] == ["-m", "tether.server.cli"]
    server.cmd = [server.cmd[0], "-c", prefix, *server.cmd[3:]]


def test_idle_connections_cannot_exhaust_descriptors(tmp_path) -> None:
    """With 300 descriptors, 300 idle connections used to exhaust them (accept errors
    flooding stderr, legitimate clients refused). Now the cap is lowered to fit, and
    idle peers, which never complete a handshake, are closed to make room for newer
    ones (HANDSHAKE_TIMEOUT): a client is served while they are all still open."""
    server = ServerProcess(tmp_path, "--max-connections", "1000")
    _limited_fds_cmd(server, 300)
    with server:
        idle = []
        refused = []
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            idle.append(sock)
        time.sleep(0.5)
        for sock in idle:
            sock.settimeout(0.02)
            try:
                data = sock.recv(4096)
            except socket.timeout:
                continue
            refused.append(data)
        assert refused, "extra connections must be refused"
        assert all(b'"HANDSHAKE_TIMEOUT"' in data for data in refused), refused[:3]
        assert len(refused) >= 64, "the cap must leave descriptors free"
        assert any("max_connections 1000 lowered" in line for line in server.lines), server.lines
        assert _pings(server.port), "a client must be served while idle peers are open"
        for sock in idle:
            sock.close()
        no_tracebacks(server)


def _pings(port: int) -> bool:
    try:
        ping_ms(port)
        return True
    except (OSError, AssertionError):
        return False


def test_connection_cap_refuses_clearly(tmp_path) -> None:
    with ServerProcess(tmp_path, "--max-connections", "3") as server:
        held = [RawClient(server.port) for _ in range(3)]
        for c in held:
            assert c.request(PING)["type"] == "PONG"
        extra = RawClient(server.port)
        reply = refusal(extra)
        assert reply["code"] == "TOO_MANY_CONNECTIONS" and "3" in reply["message"]
        held.pop().close()
        assert wait_until(lambda: _pings(server.port), 10)
        no_tracebacks(server)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_partial_frames_are_bounded_in_total(tmp_path) -> None:
    """64 peers each holding an unfinished 64 MiB frame took a server from 329 MiB
    to 4.4 GiB. Scaled down: 12 peers x 8 MiB against a 32 MiB total limit."""
    limit = 32 << 20
    with ServerProcess(tmp_path, "--max-partial-frame-bytes", str(limit), "--max-frame-bytes", str(16 << 20)) as server:
        before = rss_mb(server)
        peers = []
        for i in range(12):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(b"%08d" % (16 << 20) + b" " * ((8 << 20) - 4096 * i))  # half of a 16 MiB frame
            peers.append(sock)
        time.sleep(0.5)
        latency = ping_ms(server.port)
        grown = rss_mb(server) - before
        closed = []
        for sock in peers:
            sock.settimeout(0.5)  # every eviction happened before the PING above was answered
            data = b""
            try:
                while True:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except socket.timeout:
                continue
            except ConnectionResetError:
                pass
            closed.append(data)
        for sock in peers:
            sock.close()
        assert len(closed) >= 12 - limit // (8 << 20), "the largest holders must be closed"
        assert all(b'"SERVER_OVERLOADED"' in data and b"max_partial_frame_bytes" in data for data in closed), closed
        assert grown < 32 + 64, f"server RSS grew by {grown:.0f} MiB"
        assert latency < 2000, f"another client's PING took {latency:.0f} ms"
        no_tracebacks(server)
